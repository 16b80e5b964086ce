//! The audit trail of writes: who asked what, when, and how it ended, in the daemon's log
//! (target `envbridge::audit`) and as a Kubernetes Event on the Environment.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::Bridge;

/// One write, as audited.
pub struct Audit<'a> {
    pub caller: &'a str,
    pub role: &'a str,
    pub action: &'a str,
    pub target: &'a str,
    pub outcome: &'a str,
}

impl Bridge {
    /// Logs `a` and, when the environment exists (`env`: namespace, name), publishes it as an
    /// Event on it. A failed publish is logged, never an error of the write.
    pub async fn audit(&self, a: &Audit<'_>, env: Option<(&str, &str)>) {
        tracing::info!(
            target: "envbridge::audit",
            caller = a.caller,
            role = a.role,
            action = a.action,
            target = a.target,
            outcome = a.outcome,
            "audit"
        );
        let Some((ns, name)) = env else {
            return;
        };
        let recorder = Recorder::new(
            self.client.clone(),
            Reporter {
                controller: self.cfg.field_manager.clone(),
                instance: None,
            },
        );
        let reference = ObjectReference {
            api_version: Some(crate::crd::API_VERSION.into()),
            kind: Some("Environment".into()),
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        };
        let note = format!(
            "{} ({}) {} {}: {}",
            a.caller, a.role, a.action, a.target, a.outcome
        );
        let ev = Event {
            type_: if a.outcome.starts_with("ok") {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: "Audit".into(),
            note: Some(note.chars().take(1000).collect()),
            action: a.action.into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &reference).await {
            tracing::warn!(environment = name, error = %e, "could not publish the audit event");
        }
    }
}

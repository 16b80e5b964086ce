//! The headless Service of a task (discovery). Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::names::service_name;
use super::stored_service::StoredService;
use crate::crd::{Task, labels as keys};

/// The Service port's name, so clients can look it up without knowing the number.
pub const DISCOVERY_PORT_NAME: &str = "discovery";

/// `clusterIP: None`, selecting the task's pod, with the configured discovery port.
pub fn build_service(
    task: &Task,
    labels: &BTreeMap<String, String>,
    discovery_port: u16,
) -> Service {
    let selector: BTreeMap<String, String> = labels
        .iter()
        .filter(|(k, _)| k.as_str() == keys::ENVIRONMENT || k.as_str() == keys::TASK)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(&task.name_any())),
            namespace: task.namespace(),
            labels: Some(labels.clone()),
            owner_references: task.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(selector),
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some(DISCOVERY_PORT_NAME.into()),
                port: i32::from(discovery_port),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// True when `svc` already has the shape `build_service` would give it (no write needed).
pub fn service_matches(svc: &StoredService, discovery_port: u16) -> bool {
    svc.spec.as_ref().is_some_and(|s| {
        s.cluster_ip.as_deref() == Some("None")
            && matches!(s.ports.as_slice(), [p] if p.port == i32::from(discovery_port))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::TaskSpec;
    use crate::plan::TaskRef;

    #[test]
    fn headless_with_configured_port() {
        let tref = TaskRef {
            name: "1abc-readout".into(),
            node: "flp001".into(),
            ..Default::default()
        };
        let mut t = Task::new(
            "1abc-readout",
            TaskSpec {
                environment: "e".into(),
                task: tref,
                transition: None,
            },
        );
        t.metadata.namespace = Some("ns".into());
        t.metadata.uid = Some("u".into());
        let labels = super::super::names::task_labels("e", &t.spec.task, None);
        let svc = build_service(&t, &labels, 47999);
        assert_eq!(svc.metadata.name.as_deref(), Some("t-1abc-readout"));
        let spec = svc.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.ports.as_ref().unwrap()[0].port, 47999);
        let sel = spec.selector.as_ref().unwrap();
        assert_eq!(sel.len(), 2);
        assert_eq!(sel["envbridge.dev/task"], "1abc-readout");
        // As the store decodes it.
        let stored: StoredService =
            serde_json::from_value(serde_json::to_value(&svc).unwrap()).unwrap();
        assert!(service_matches(&stored, 47999));
        assert!(!service_matches(&stored, 47998));
    }
}

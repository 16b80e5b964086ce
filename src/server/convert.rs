//! Roster records and bridge results -> API messages.

use std::time::{SystemTime, UNIX_EPOCH};

use super::pb;
use crate::bridge::BridgeError;
use crate::roster::{EnvRecord, Failure, Roster, TaskRecord};

pub fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn task(t: &TaskRecord) -> pb::Task {
    pb::Task {
        name: t.name.to_string(),
        node: t.node.to_string(),
        class: t.class.to_string(),
        path: t.path.to_string(),
        critical: t.critical,
        state: t.state.to_string(),
        pod_phase: t.pod_phase.as_deref().unwrap_or_default().to_string(),
        pod_ip: t.pod_ip.as_deref().unwrap_or_default().to_string(),
        message: t.message.as_deref().unwrap_or_default().to_string(),
        transition_id: t
            .transition
            .as_ref()
            .map(|(id, _)| id.to_string())
            .unwrap_or_default(),
        changed_unix_ms: millis(t.changed_at),
    }
}

/// An environment; with `tasks`, its tasks from the roster too.
pub fn environment(r: &Roster, e: &EnvRecord, tasks: bool) -> pb::Environment {
    pb::Environment {
        id: e.id.to_string(),
        namespace: e.key.namespace.to_string(),
        name: e.key.name.to_string(),
        workflow: e.workflow.to_string(),
        nodes: e.nodes,
        tasks_expected: e.tasks,
        desired_state: e.desired.to_string(),
        state: e.state.map(|s| s.to_string()).unwrap_or_default(),
        requested: e.requested.as_ref().map(|(id, ev)| pb::TransitionInfo {
            id: id.to_string(),
            event: ev.to_string(),
            ..Default::default()
        }),
        observed: e.observed.as_ref().map(|o| pb::TransitionInfo {
            id: o.id.to_string(),
            event: o.event.to_string(),
            phase: o.phase.as_str().to_string(),
            message: o.message.as_deref().unwrap_or_default().to_string(),
        }),
        counts: r
            .counts(&e.key)
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect(),
        tasks: if tasks {
            r.tasks_of(&e.key).iter().map(|t| task(t)).collect()
        } else {
            vec![]
        },
        failing: e.failing.iter().map(failure).collect(),
        deleting: e.deleting,
        changed_unix_ms: millis(e.changed_at),
    }
}

pub fn failure(f: &Failure) -> pb::Failure {
    pb::Failure {
        task: f.task.to_string(),
        node: f.node.to_string(),
        path: f.path.to_string(),
        critical: f.critical,
        message: f.message.to_string(),
    }
}

pub fn status(e: BridgeError) -> tonic::Status {
    use tonic::Status;
    let msg = e.to_string();
    match e {
        BridgeError::Invalid(_) | BridgeError::Ambiguous(_) | BridgeError::Render(_) => {
            Status::invalid_argument(msg)
        }
        BridgeError::NotFound(_) | BridgeError::TaskNotFound { .. } => Status::not_found(msg),
        BridgeError::Namespace { .. }
        | BridgeError::InvalidTransition { .. }
        | BridgeError::DetectorInUse { .. } => Status::failed_precondition(msg),
        BridgeError::Timeout { .. } => Status::deadline_exceeded(msg),
        BridgeError::NotLeader => Status::unavailable(msg),
        BridgeError::Kube { .. } => Status::unavailable(msg),
    }
}

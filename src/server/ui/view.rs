//! What the page shows, as JSON: an environment's summary line and one task's row, built
//! from the roster's records.

use serde::Serialize;

use crate::roster::{EnvRecord, Roster, TaskRecord};
use crate::server::convert::{self, millis};
use crate::server::pb;

/// One environment, as the list and the environment's header show it.
#[derive(Serialize)]
pub struct EnvView {
    /// `namespace/name`: the key events name it by.
    pub key: String,
    pub id: String,
    pub workflow: String,
    pub state: String,
    pub desired: String,
    pub nodes: u32,
    /// Tasks the environment consists of (spec), and those the roster holds.
    pub tasks: u32,
    pub seen: u32,
    /// Tasks in the desired state.
    pub ready: u32,
    pub counts: std::collections::BTreeMap<String, u32>,
    pub failing: Vec<pb::Failure>,
    pub run_number: Option<String>,
    pub requested: Option<String>,
    pub observed: Option<ObservedView>,
    pub deleting: bool,
    pub created_ms: i64,
    pub changed_ms: i64,
}

#[derive(Serialize)]
pub struct ObservedView {
    pub event: String,
    pub phase: String,
    pub message: String,
}

pub fn env(r: &Roster, e: &EnvRecord) -> EnvView {
    let counts = r.counts(&e.key);
    let seen = counts.values().sum();
    let ready = counts.get(&e.desired).copied().unwrap_or(0);
    EnvView {
        key: e.key.to_string(),
        id: e.id.to_string(),
        workflow: e.workflow.to_string(),
        state: e.state.map(|s| s.to_string()).unwrap_or_default(),
        desired: e.desired.to_string(),
        nodes: e.nodes,
        tasks: e.tasks,
        seen,
        ready,
        counts: counts
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect(),
        failing: e.failing.iter().map(convert::failure).collect(),
        run_number: e.run_number.as_deref().map(str::to_string),
        requested: e.requested.as_ref().map(|(_, ev)| ev.to_string()),
        observed: e.observed.as_ref().map(|o| ObservedView {
            event: o.event.to_string(),
            phase: o.phase.as_str().to_string(),
            message: o.message.as_deref().unwrap_or_default().to_string(),
        }),
        deleting: e.deleting,
        created_ms: millis(e.created_at),
        changed_ms: millis(e.changed_at),
    }
}

/// One task's row (short keys: an environment may hold thousands).
#[derive(Serialize)]
pub struct TaskView {
    pub name: String,
    pub node: String,
    pub class: String,
    pub path: String,
    /// The role the task is in: its path without its own last element.
    pub role: String,
    pub critical: bool,
    pub state: String,
    pub phase: String,
    pub ip: String,
    pub port: u16,
    pub message: String,
    pub changed_ms: i64,
    pub deleting: bool,
}

pub fn task(t: &TaskRecord) -> TaskView {
    let role = t
        .path
        .rsplit_once('.')
        .map(|(r, _)| r)
        .unwrap_or_default()
        .to_string();
    TaskView {
        name: t.name.to_string(),
        node: t.node.to_string(),
        class: t.class.to_string(),
        path: t.path.to_string(),
        role,
        critical: t.critical,
        state: t.state.to_string(),
        phase: t.pod_phase.as_deref().unwrap_or_default().to_string(),
        ip: t.pod_ip.as_deref().unwrap_or_default().to_string(),
        port: t.control_port,
        message: t.message.as_deref().unwrap_or_default().to_string(),
        changed_ms: millis(t.changed_at),
        deleting: t.deleting,
    }
}

//! What the roster keeps per environment and per task: plain data, built by the bridge
//! from the cluster's objects (the roster itself never sees a Kubernetes type).

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::intern::Str;
use crate::state::{Event, State};

/// Namespace and name of an Environment object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EnvKey {
    pub namespace: Str,
    pub name: Str,
}

impl EnvKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        EnvKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for EnvKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How far a controller got with one transition (mirrors the CRD's TransitionPhase).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }
}

/// A transition id and how far it got, as one object's status reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub id: Str,
    pub event: Event,
    pub phase: Phase,
    pub message: Option<Str>,
}

/// A failing task (or deployment call), as the environment's status names it: what a
/// transition's outcome lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub task: Str,
    pub node: Str,
    pub path: Str,
    pub critical: bool,
    pub message: Str,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EnvRecord {
    pub key: EnvKey,
    /// The environment id (spec.id).
    pub id: Str,
    pub workflow: Str,
    pub nodes: u32,
    /// How many tasks the environment consists of (spec.tasks): a wait needs them all.
    pub tasks: u32,
    pub desired: State,
    pub state: Option<State>,
    /// The transition last requested in the spec (id, event).
    pub requested: Option<(Str, Event)>,
    pub observed: Option<Observed>,
    /// Tasks per state, as the environment's status counts them (the operator's aggregation).
    pub counts: BTreeMap<State, u32>,
    /// The failing tasks the status lists (critical first, at most 100) ...
    pub failing: Vec<Failure>,
    /// ... and how many of them are critical in all, listed or not.
    pub failing_critical: u32,
    /// metadata.deletionTimestamp is set: being torn down.
    pub deleting: bool,
    /// The run number START asked for, while START is the transition last requested.
    pub run_number: Option<Str>,
    /// The workflow's public description (spec.description).
    pub description: Option<std::sync::Arc<str>>,
    /// What the caller gave at create (spec.variables) ...
    pub variables: std::sync::Arc<BTreeMap<String, String>>,
    /// ... and the current or last run's variables (spec.runVariables: run number, start
    /// and end times): together the anchor's user variables.
    pub run_variables: std::sync::Arc<BTreeMap<String, String>>,
    /// metadata.creationTimestamp (UNIX_EPOCH when unknown).
    pub created_at: SystemTime,
    pub changed_at: SystemTime,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TaskRecord {
    /// Task object name (unique in its namespace).
    pub name: Str,
    /// The environment it belongs to (its namespace and spec.environment).
    pub env: EnvKey,
    /// Node as the workflow names it (machine_id).
    pub node: Str,
    pub class: Str,
    pub path: Str,
    pub critical: bool,
    pub state: State,
    pub pod_phase: Option<Str>,
    pub pod_ip: Option<Str>,
    pub message: Option<Box<str>>,
    /// The transition this task's status says it acted on.
    pub transition: Option<(Str, Phase)>,
    /// Control port and bound TCP ports on its node (for allocation across environments).
    pub ports: Box<[u16]>,
    /// The task's control port (0: none, e.g. a hook).
    pub control_port: u16,
    /// The process's pid as it reports it (0: not known).
    pub pid: u32,
    pub deleting: bool,
    pub changed_at: SystemTime,
}

impl EnvRecord {
    /// Equal apart from the change time: used to skip no-op updates (resyncs).
    pub fn same_content(&self, other: &EnvRecord) -> bool {
        let mut o = other.clone();
        o.changed_at = self.changed_at;
        *self == o
    }

    /// A bare record of `key` (STANDBY desired, no state yet), for unit tests to fill in.
    #[cfg(test)]
    pub fn bare(key: EnvKey) -> EnvRecord {
        EnvRecord {
            key,
            id: "a".into(),
            workflow: "readout-dataflow".into(),
            nodes: 1,
            tasks: 0,
            desired: State::Standby,
            state: None,
            requested: None,
            observed: None,
            counts: BTreeMap::new(),
            failing: vec![],
            failing_critical: 0,
            deleting: false,
            run_number: None,
            description: None,
            variables: Default::default(),
            run_variables: Default::default(),
            created_at: SystemTime::UNIX_EPOCH,
            changed_at: SystemTime::UNIX_EPOCH,
        }
    }
}

impl TaskRecord {
    pub fn same_content(&self, other: &TaskRecord) -> bool {
        self.name == other.name
            && self.env == other.env
            && self.node == other.node
            && self.class == other.class
            && self.path == other.path
            && self.critical == other.critical
            && self.state == other.state
            && self.pod_phase == other.pod_phase
            && self.pod_ip == other.pod_ip
            && self.message == other.message
            && self.transition == other.transition
            && self.ports == other.ports
            && self.control_port == other.control_port
            && self.pid == other.pid
            && self.deleting == other.deleting
    }

    /// Heap bytes owned by this record alone (interned strings are counted once, elsewhere).
    pub fn own_heap_bytes(&self) -> usize {
        const ARC_HEADER: usize = 16;
        let unique = self.name.len() + self.path.len() + 2 * ARC_HEADER;
        let msg = self.message.as_ref().map_or(0, |m| m.len());
        std::mem::size_of::<TaskRecord>() + ARC_HEADER + unique + msg + self.ports.len() * 2
    }
}

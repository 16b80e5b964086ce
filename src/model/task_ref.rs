//! The per-task reference: everything the cluster side needs to run one task.
//!
//! This is the contract between the render core (which produces it) and the operator
//! (which turns it into a Task object and a Pod). Plain data, no Kubernetes types.

use std::collections::BTreeMap;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a task process is driven through the state machine.
///
/// The anchor's Kubernetes variants (`kubernetes_direct`, `kubectl_direct`, ...) differ only in
/// how the anchor launched the process; here every task runs as a Pod, so they map onto the
/// plain modes (see docs/workflow-language.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ControlMode {
    /// One control-protocol event per transition.
    #[default]
    Direct,
    /// FairMQ device: multi-step sequences over the JSON variant of the protocol.
    Fairmq,
    /// No protocol: the state follows the pod phase.
    Basic,
    /// Runs at a given transition (`trigger`), its result gates it.
    Hook,
}

impl ControlMode {
    /// Direct and FairMQ tasks are driven over the control protocol (and get a control port).
    pub fn has_protocol(self) -> bool {
        matches!(self, ControlMode::Direct | ControlMode::Fairmq)
    }
}

// Strings that many tasks hold alike (env, arguments, channel keys and values) are shared
// (`Arc<str>`): a class's value is made once per render, not once per task. (Plain comment:
// doc comments become the CRD's descriptions.)

/// One environment variable, as Kubernetes and the `-o tasks` view spell it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct EnvVar {
    pub name: Arc<str>,
    pub value: Arc<str>,
}

/// One task of an environment, fully resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskRef {
    /// Task object name: DNS-1123, unique across environments.
    pub name: String,
    /// Task id, unique within the environment (the FairMQ `--id`).
    pub id: String,
    /// Role path, e.g. `readout-dataflow.host-flp001.readout`.
    pub path: String,
    /// Task class: the file name that `load:` names.
    pub class: String,
    /// The node exactly as the workflow's `machine_id` names it.
    pub node: String,
    /// TaskTemplate (pod shape) to run it with.
    pub template: String,
    pub control_mode: ControlMode,
    pub control_port: u16,
    /// A failing non-critical task is reported but does not fail the environment.
    pub critical: bool,
    /// `command.value`: the program (or shell line when `shell`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub command: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shell: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub env: Vec<EnvVar>,
    pub args: Vec<Arc<str>>,
    /// Transition arguments for the channels, FairMQ key form (`chans.<name>.0.address`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub channels: BTreeMap<Arc<str>, Arc<str>>,
    /// Hook tasks: the transition that runs them (e.g. `before_CONFIGURE`), and the one that awaits them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#await: Option<String>,
    /// Per-transition deadline for this task, seconds (the role's `timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    /// CONFIGURE-time properties besides channels (`environment_id`, the class's
    /// `properties`), as the anchor sends them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
}

impl TaskRef {
    /// IPC channels (abstract sockets) and shared-memory transport only work when the pod shares
    /// the node's network and IPC namespaces: the deploy step rejects such a task whose
    /// TaskTemplate lacks `hostNetwork`/`hostIPC`.
    pub fn needs_host_namespaces(&self) -> bool {
        self.host_namespace_channel().is_some()
    }

    /// The first channel argument (key, value) that needs the node's namespaces.
    pub fn host_namespace_channel(&self) -> Option<(&str, &str)> {
        self.channels
            .iter()
            .map(|(k, v)| (&**k, &**v))
            .find(|(k, v)| {
                (k.ends_with(".address") && v.starts_with("ipc://"))
                    || (k.ends_with(".transport") && *v == "shmem")
            })
    }
}

impl TaskRef {
    /// The ports this task takes on its node: its control port (none for hook and basic
    /// tasks: 0) and every TCP port it binds (`tcp://*:P` or `tcp://0.0.0.0:P`). The plan
    /// allocates them; this reads them back off a reference that comes from the cluster.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = [self.control_port]
            .into_iter()
            .filter(|p| *p != 0)
            .collect();
        for (k, v) in &self.channels {
            if !k.ends_with(".address") {
                continue;
            }
            let bound = v
                .strip_prefix("tcp://*:")
                .or_else(|| v.strip_prefix("tcp://0.0.0.0:"));
            if let Some(p) = bound.and_then(|p| p.parse::<u16>().ok()) {
                ports.push(p);
            }
        }
        ports.sort_unstable();
        ports.dedup();
        ports
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_control_plus_bound_tcp() {
        let mut t = TaskRef {
            control_port: 47100,
            ..TaskRef::default()
        };
        t.channels
            .insert("chans.out.0.address".into(), "tcp://*:5555".into());
        t.channels
            .insert("chans.in.0.address".into(), "tcp://flp002:6000".into());
        t.channels
            .insert("chans.ipc.0.address".into(), "ipc://@x".into());
        t.channels
            .insert("chans.out.0.method".into(), "bind".into());
        assert_eq!(t.ports(), [5555, 47100]);
    }
}

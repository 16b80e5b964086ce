//! Environment: one run-control environment (a task tree placed on nodes).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::transition::{TransitionRequest, TransitionStatus};
use crate::state::State;

/// The desired environment. Task references live in TaskSet objects named by `taskSets`
/// (each with the BLAKE3 hash of its tasks), so that no object nears etcd's size limit and a
/// reader can tell a complete set from a partial one (docs/crd-design.md).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "envbridge.dev",
    version = "v1alpha1",
    kind = "Environment",
    namespaced,
    status = "EnvironmentStatus",
    shortname = "env",
    shortname = "envs",
    category = "envbridge",
    printcolumn = r#"{"name":"Desired","type":"string","jsonPath":".spec.desiredState"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".spec.nodes"}"#,
    printcolumn = r#"{"name":"Tasks","type":"integer","jsonPath":".spec.tasks"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentSpec {
    /// Environment id (the anchor's partition id): seeds every derived name.
    pub id: String,
    /// The workflow it was rendered from.
    pub workflow: String,
    pub nodes: u32,
    pub tasks: u32,
    pub task_sets: Vec<TaskSetRef>,
    /// Call roles: integration hooks recorded here, not deployed as processes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookRef>,
    /// The state the environment should reach: the target of `transition`, STANDBY before any.
    pub desired_state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<TransitionRequest>,
    /// The workflow's description, when its file tags it `!public` (what the anchor's
    /// clients show).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The variables the caller gave at create (`hosts`, public ones, an admin's site
    /// ones): the anchor's user variables, as its clients show them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, String>,
    /// The current or last run's variables, which the anchor keeps among the user variables:
    /// START's run parameters and `run_start_time_ms`, then STOP's and `run_end_time_ms`
    /// (`bridge::transition::run_variables`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub run_variables: BTreeMap<String, String>,
}

/// A TaskSet the environment consists of, with the BLAKE3 (hex) of its `spec.tasks` JSON
/// (`tasks_digest` in src/crd/task_set.rs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskSetRef {
    pub name: String,
    /// Empty in an Environment written before the hash was BLAKE3 (`sha256`): it then fails
    /// verification with a clear `HashMismatch` rather than breaking every watch that reads it.
    #[serde(default)]
    pub blake3: String,
    pub tasks: u32,
}

/// A call role: run by an integration at a transition, not a process of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookRef {
    pub path: String,
    /// As written (`dcs.StartOfRun()`).
    pub func: String,
    /// The integration plugin (`dcs`) and its function (`StartOfRun`).
    #[serde(default)]
    pub plugin: String,
    #[serde(default)]
    pub function: String,
    /// The arguments, evaluated at render time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arguments: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#await: Option<String>,
    pub critical: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    /// The variables the call's role declares, evaluated.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, String>,
    /// Where the call is sent (the plugin's endpoint, set by the daemon); none: not sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The last transition the operator acted on, and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<TransitionStatus>,
    /// Tasks per state (`STANDBY: 12`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counts: BTreeMap<State, u32>,
    /// `<tasks in the desired state>/<tasks>`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// The failing tasks, critical first; at most 100, each message at most 512 bytes, so
    /// that a mass failure still fits in one object (`failingCount` says how many in all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing_tasks: Vec<FailingTask>,
    /// How many tasks are failing, listed or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_count: Option<u32>,
    /// How many of the failing tasks (and deployment calls) are critical, listed or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_critical: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailingTask {
    pub name: String,
    pub node: String,
    pub path: String,
    pub critical: bool,
    pub message: String,
}

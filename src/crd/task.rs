//! Task: one task process of an environment, run as one Pod.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::transition::{TransitionRequest, TransitionStatus};
use crate::model::TaskRef;
use crate::state::State;

/// `kubectl get tasks` is ambiguous where Tekton is installed: use `kubectl get ebtasks`
/// or `tasks.envbridge.dev` there.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "envbridge.dev",
    version = "v1alpha1",
    kind = "Task",
    namespaced,
    status = "TaskStatus",
    shortname = "ebtask",
    shortname = "ebtasks",
    category = "envbridge",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.task.node"}"#,
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".spec.task.class"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.podPhase"}"#,
    printcolumn = r#"{"name":"Pod-IP","type":"string","jsonPath":".status.podIP"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TaskSpec {
    /// Name of the owning Environment (same namespace).
    pub environment: String,
    pub task: TaskRef,
    /// The environment's current transition, copied by the environment controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<TransitionRequest>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    /// Pod phase exactly as Kubernetes names it (Pending, Running, Succeeded, Failed, Unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_phase: Option<String>,
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// The Kubernetes Node the task's machine_id resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The task process's pid as the process reports it (`GetState`; in its container's PID
    /// namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition: Option<TransitionStatus>,
    /// A failed process's story: its container's termination message (with
    /// `FallbackToLogsOnError`, its last log lines; at most 4 KiB, the end kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_log: Option<String>,
    /// The pod's Warning events when the task failed ("Reason: message", at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_events: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

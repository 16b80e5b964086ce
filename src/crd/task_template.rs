//! TaskTemplate: the pod shape of a kind of task, written by site administrators.

use k8s_openapi::api::core::v1::PodSpec;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::ControlMode;

/// Cluster-scoped: templates define privileged pods, so only administrators may write them
/// (the operator only reads them).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "envbridge.dev",
    version = "v1alpha1",
    kind = "TaskTemplate",
    shortname = "tt",
    category = "envbridge",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.controlMode"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TaskTemplateSpec {
    pub control_mode: ControlMode,
    /// Env var names every task reference using this template must supply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_env: Vec<String>,
    /// When set, the container runs through bash so that output goes to this file and to stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_file: Option<String>,
    pub pod: PodSpec,
}

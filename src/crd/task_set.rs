//! TaskSet: a slice of an environment's task references, sized to stay far below etcd's limit.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::TaskRef;

/// Written before the Environment that names it; immutable once written (a new render writes
/// a new name, derived from the content hash).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "envbridge.dev",
    version = "v1alpha1",
    kind = "TaskSet",
    namespaced,
    shortname = "ts",
    category = "envbridge",
    printcolumn = r#"{"name":"Environment","type":"string","jsonPath":".spec.environment"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TaskSetSpec {
    /// Name of the Environment object this set belongs to.
    pub environment: String,
    pub tasks: Vec<TaskRef>,
}

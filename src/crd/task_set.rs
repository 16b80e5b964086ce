//! TaskSet: a slice of an environment's task references, sized to stay far below etcd's limit.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::plan::TaskRef;

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

/// The content hash the Environment names a TaskSet by: BLAKE3 (hex) of the JSON of its
/// `spec.tasks` (`serde_json::to_vec`). A cryptographic hash, and several times faster than
/// SHA-256 on the megabytes a large environment renders to.
pub fn tasks_digest(tasks: &[TaskRef]) -> String {
    json_digest(&serde_json::to_vec(tasks).unwrap_or_default())
}

/// [`tasks_digest`] of tasks already serialized: `json` is the JSON array of a set's tasks.
/// (Hashed in one piece: BLAKE3 hashes many 1 KiB chunks at once only when given them at once.)
pub fn json_digest(json: &[u8]) -> String {
    blake3::hash(json).to_hex().to_string()
}

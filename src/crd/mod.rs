//! Custom resource types of group `envbridge.dev`, version `v1alpha1`.
//!
//! One kind per file. The generated YAML lives in `crds/` and a test checks it against these types.

mod environment;
pub mod shard;
mod task;
mod task_set;
mod task_template;
mod transition;

pub use environment::{
    Environment, EnvironmentSpec, EnvironmentStatus, FailingTask, HookRef, TaskSetRef,
};
pub use task::{Task, TaskSpec, TaskStatus};
pub use task_set::{TaskSet, TaskSetSpec};
pub use task_template::{TaskTemplate, TaskTemplateSpec};
pub use transition::{
    TransitionPhase, TransitionRequest, TransitionStatus, run_number_in, run_variables,
};

use kube::CustomResourceExt;

pub const GROUP: &str = "envbridge.dev";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "envbridge.dev/v1alpha1";

/// Labels every object envbridge writes carries; watches filter on them server-side.
pub mod labels {
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const MANAGER: &str = "envbridge";
    pub const ENVIRONMENT: &str = "envbridge.dev/environment";
    pub const NODE: &str = "envbridge.dev/node";
    pub const TASK: &str = "envbridge.dev/task";
    pub const CLASS: &str = "envbridge.dev/class";
    /// Role paths can be longer than a label value allows: kept as an annotation.
    pub const ROLE_PATH: &str = "envbridge.dev/role-path";
    /// On Nodes: the short host name a workflow's machine_id uses.
    pub const HOST: &str = "envbridge.dev/host";
    /// The operator shard an environment's objects belong to (`super::shard`).
    pub const SHARD: &str = "envbridge.dev/shard";
}

/// All CRDs as one YAML stream, in a stable order (what `envbridge crd` prints).
pub fn all_yaml() -> String {
    let crds = [
        Environment::crd(),
        TaskSet::crd(),
        Task::crd(),
        TaskTemplate::crd(),
    ];
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd).expect("CRD serializes"));
    }
    out
}

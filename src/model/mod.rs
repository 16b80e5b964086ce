//! The shared vocabulary, with no Kubernetes and no dependency on any other module: task
//! references and control modes (what the plan writes, the CRDs carry and the operator
//! drives), the ports a task takes, and the label values derived from names.

pub mod digest;
pub mod label;
mod task_ref;

pub use task_ref::{ControlMode, EnvVar, TaskRef};

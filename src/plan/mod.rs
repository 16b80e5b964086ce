//! Per-node task references: env, args, channel endpoints, control ports. No Kubernetes here.

mod task_ref;

pub use task_ref::{ControlMode, EnvVar, TaskRef};

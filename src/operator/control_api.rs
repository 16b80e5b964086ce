//! The one place the operator binds to the task control client (src/control/). Everything
//! else in the operator calls these names only.

pub use crate::control::{ControlClient, ControlError, TaskEndpoint, fairmq_launch_args};

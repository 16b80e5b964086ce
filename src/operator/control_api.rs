//! The one place the operator binds to the task control client (src/control/, the control
//! helper's area). Everything else in the operator calls these names only.
//!
//! Until the client lands on this branch, the functions below keep its expected shape:
//! `fairmq_launch_args` mirrors the control module's, and `get_state` / `transition` answer
//! with an error, so `direct` and `fairmq` tasks report ERROR (named) instead of hanging.

use std::time::Duration;

use crate::plan::ControlMode;
use crate::state::{Event, State};

/// Where a task's control service listens.
#[derive(Clone, Debug)]
pub struct TaskEndpoint {
    pub addr: std::net::SocketAddr,
    pub mode: ControlMode,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ControlError(pub String);

pub async fn get_state(
    _ep: &TaskEndpoint,
    _deadline: Duration,
) -> Result<(State, u32), ControlError> {
    Err(ControlError(
        "task control client not available in this build".into(),
    ))
}

pub async fn transition(
    _ep: &TaskEndpoint,
    _from: State,
    _event: Event,
    _args: &[(String, String)],
    _deadline: Duration,
) -> Result<State, ControlError> {
    Err(ControlError(
        "task control client not available in this build".into(),
    ))
}

/// The arguments FairMQ tasks get in addition to their own (control port, OCClite plugin, id).
pub fn fairmq_launch_args(task_id: &str, control_port: u16, plugin_dir: &str) -> Vec<String> {
    let dir = plugin_dir.trim_end_matches('/');
    vec![
        "--control-port".into(),
        control_port.to_string(),
        "-S".into(),
        format!("{dir}/lib/"),
        "-P".into(),
        "OCClite".into(),
        "--id".into(),
        task_id.to_string(),
    ]
}

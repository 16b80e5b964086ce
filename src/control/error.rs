//! Errors of the task control client. Every one names the task address and the event (and
//! the FairMQ step) so that a Task's ERROR message says what went wrong where.

use std::net::SocketAddr;
use std::time::Duration;

use crate::plan::ControlMode;
use crate::state::{Event, State};

use super::fairmq::PlanError;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(
        "task at {addr} has control mode {mode:?}, which has no control protocol: its state follows the pod phase"
    )]
    NoProtocol { addr: SocketAddr, mode: ControlMode },

    #[error("{event} does not apply to a task in state {from}")]
    NotApplicable { event: Event, from: State },

    #[error("{event} for the FairMQ task at {addr}: {source}")]
    Plan {
        addr: SocketAddr,
        event: Event,
        #[source]
        source: PlanError,
    },

    #[error(
        "refusing to dial {addr}: not a loopback address (set ENVBRIDGE_CONTROL_ALLOW_REMOTE=1 to allow)"
    )]
    NotLoopback { addr: SocketAddr },

    #[error("{call} to the task at {addr} got no answer within {deadline:?} (deadline)")]
    Deadline {
        addr: SocketAddr,
        call: String,
        deadline: Duration,
    },

    #[error("{call} to the task at {addr} failed: {code:?}: {message}")]
    Rpc {
        addr: SocketAddr,
        call: String,
        code: tonic::Code,
        message: String,
    },

    #[error(
        "{call} refused by the task at {addr}: ok=false, task now in {state} (trigger {trigger})"
    )]
    Refused {
        addr: SocketAddr,
        call: String,
        state: String,
        trigger: String,
    },

    #[error("{call} left the FairMQ task at {addr} stuck in {state}; rolled back with {rollback}")]
    Stuck {
        addr: SocketAddr,
        call: String,
        state: String,
        /// The rollback step and its outcome, e.g. `RESET DEVICE (now IDLE)`.
        rollback: String,
    },

    #[error("{call}: the task at {addr} reported an unknown state {state:?}")]
    UnknownState {
        addr: SocketAddr,
        call: String,
        state: String,
    },

    #[error("the FairMQ task at {addr} is between states ({device_state})")]
    Between {
        addr: SocketAddr,
        device_state: String,
    },

    #[error("the task's subscription ended")]
    StreamEnded,
}

impl ControlError {
    /// The run-control state the task reported with the failure, when it reported one
    /// (e.g. ERROR after a refused CONFIGURE); None when the task did not answer.
    pub fn reported_state(&self) -> Option<State> {
        let s = match self {
            ControlError::Refused { state, .. } | ControlError::Stuck { state, .. } => state,
            _ => return None,
        };
        s.parse::<State>().ok().or_else(|| {
            s.parse::<super::fairmq::FmqState>()
                .ok()
                .and_then(|f| f.to_state())
        })
    }

    /// True when the task never answered in time (hung, or unreachable until the deadline).
    pub fn is_deadline(&self) -> bool {
        matches!(self, ControlError::Deadline { .. })
    }
}

//! The one place the operator binds to the task control client (src/control/). Everything
//! else in the operator calls these names only.

pub use crate::control::{
    ControlError, TaskEndpoint, event_stream, fairmq_launch_args, forget, get_state, state_stream,
    transition,
};

//! How a long-running envbridge process starts, in one place for the daemon, the operator and
//! the client commands: the shared flag groups (the lease, with a variable prefix per
//! process), the older variable names still read ([`legacy_env`]), tracing, the runtime, the
//! one leader election, and the one apiserver client ([`client`]).

pub mod client;
pub mod in_flight;
pub mod lease;
pub mod legacy_env;
pub mod logging;
pub mod runtime;
pub mod watch_backoff;

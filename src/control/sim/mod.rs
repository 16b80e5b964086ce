//! The task SIMULATOR: a process that implements the task control service with the real state
//! machines (direct or FairMQ), with configurable delays and injected failures. Used by the
//! demo, the tests and the benchmarks in place of real DAQ processes; it runs no workload.

pub mod cli;
pub mod config;
pub mod machine;
pub mod server;

pub use cli::{TaskSimArgs, run};
pub use config::{SimConfig, SimMode};
pub use server::{SimError, Simulator, bind, serve};

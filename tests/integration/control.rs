//! Task control: the protocol against the task simulator (no cluster needed), and the
//! sim runner through the local control plane.

mod fidelity;
mod protocol;
mod sim_runner;
mod task_cli;

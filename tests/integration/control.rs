//! Task control: the protocol against the task simulator (no cluster needed), and the
//! sim runner through the local control plane.

mod protocol;
mod sim_runner;

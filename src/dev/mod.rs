//! The local control plane: builds and runs a real kube-apiserver, etcd,
//! kube-controller-manager and kwok on 127.0.0.1 (see docs/local-control-plane.md).

use std::process::ExitCode;

pub mod sim_runner;

#[derive(clap::Subcommand, Debug)]
pub enum DevCommand {
    /// Start (or reuse) the local control plane.
    Up {
        #[arg(long, default_value_t = 4)]
        nodes: u32,
    },
    /// Stop every process it started and remove its state.
    Down,
    /// Say what runs; exit 0 when up, 1 when down.
    Status,
    /// Run the built kubectl against the local control plane.
    Kubectl {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run one task simulator per simulated (kwok) pod, on the pod's IP and control port.
    SimRunner(sim_runner::SimRunnerArgs),
}

pub fn run(cmd: DevCommand) -> ExitCode {
    match cmd {
        DevCommand::SimRunner(args) => sim_runner::run(args),
        _ => {
            eprintln!("error: not implemented yet");
            ExitCode::from(2)
        }
    }
}

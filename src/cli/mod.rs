//! Command-line entry: one subcommand per job, each dispatched to its module.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod daemon;
mod env;

#[derive(Parser, Debug)]
#[command(
    name = "envbridge",
    version,
    about = "Run-control environments on Kubernetes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinitions as YAML.
    Crd,
    /// The local control plane (etcd, kube-apiserver, kube-controller-manager, kwok).
    #[command(subcommand)]
    Dev(envbridge::dev::DevCommand),
    /// Client of the daemon: create, list, get, transition, destroy, kill-task, events.
    Env(env::EnvArgs),
    /// Run the bridge daemon (gRPC API, watches, roster).
    Daemon(Box<daemon::DaemonArgs>),
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Crd => {
            print!("{}", envbridge::crd::all_yaml());
            ExitCode::SUCCESS
        }
        Command::Dev(cmd) => envbridge::dev::run(cmd),
        Command::Env(args) => env::run(args),
        Command::Daemon(args) => daemon::run(*args),
    }
}

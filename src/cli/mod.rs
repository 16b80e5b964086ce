//! Command-line entry: one subcommand per job, each dispatched to its module.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Crd => {
            print!("{}", envbridge::crd::all_yaml());
            ExitCode::SUCCESS
        }
        Command::Dev(cmd) => envbridge::dev::run(cmd),
    }
}

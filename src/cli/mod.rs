//! Command-line entry: one subcommand per job, each dispatched to its module.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod daemon;
mod daemon_file;
mod daemon_values;
mod demo;
mod demo_cluster;
mod demo_hold;
mod demo_inventory;
mod demo_midrun;
mod env;
mod env_connect;
mod env_print;
mod logs;
mod render;
mod task;

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
    /// The cluster side: Environment -> Tasks -> Pods (leader-elected controller).
    Operator(envbridge::operator::OperatorArgs),
    /// One task process by hand: its state, one transition, or a watch.
    Task(task::TaskArgs),
    /// Run a task SIMULATOR: a stand-in task process speaking the control protocol.
    TaskSim(envbridge::control::sim::TaskSimArgs),
    /// The whole system end to end on the local control plane (the README's first command).
    Demo(demo::DemoArgs),
    /// Render a workflow into the objects to apply (or `-o tasks`: the resolved task view).
    Render(render::RenderArgs),
    /// Task container logs with timestamps (--follow resumes across dropped streams).
    Logs(logs::LogsArgs),
    /// A pod's sandbox process (the local plane's pause image): waits for SIGTERM.
    #[command(hide = true)]
    Pause,
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Crd => render::write_stdout(&envbridge::crd::all_yaml()),
        Command::Dev(cmd) => envbridge::dev::run(cmd),
        Command::Env(args) => env::run(args),
        Command::Daemon(args) => daemon::run(*args),
        Command::Operator(args) => envbridge::operator::run_cli(args),
        Command::Task(args) => task::run(args),
        Command::TaskSim(args) => envbridge::control::sim::run(args),
        Command::Render(args) => render::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Logs(args) => logs::run(args),
        Command::Pause => pause(),
    }
}

/// Sleep until SIGTERM or SIGINT, reaping nothing (the sandbox's children are its own).
fn pause() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(envbridge::signal::shutdown_signal());
    ExitCode::SUCCESS
}

/// Runs a client command's future on a small runtime; an error becomes `error: ...` on stderr
/// and a non-zero exit.
fn block_on_client<E: std::fmt::Display>(
    fut: impl std::future::Future<Output = Result<ExitCode, E>>,
) -> ExitCode {
    envbridge::launch::runtime::block_on(Some(2), fut)
}

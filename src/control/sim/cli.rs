//! `envbridge task-sim`: runs one task simulator process.

use std::io::IsTerminal;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use tracing::{error, info};

use super::config::{SimConfig, SimMode};
use super::server::{self, SimError, Simulator};
use crate::signal::shutdown_signal;

/// Default control port, as task processes use when OCC_CONTROL_PORT is unset.
pub const DEFAULT_CONTROL_PORT: u16 = 47100;
/// Exit status after an injected crash.
pub const EXIT_CRASHED: u8 = 70;
/// Exit status when the listen address cannot be bound (e.g. already in use): retryable.
pub const EXIT_BIND_FAILED: u8 = 98;
/// Exit status for bad options.
pub const EXIT_USAGE: u8 = 2;

/// A task SIMULATOR: a stand-in process that speaks the task control protocol with the real
/// state machine, for demos, tests and benchmarks. It runs no workload.
#[derive(clap::Args, Debug, Clone)]
pub struct TaskSimArgs {
    /// Address to listen on [default: 127.0.0.1:$OCC_CONTROL_PORT, else 127.0.0.1:47100].
    /// Port 0 picks a free port (the log says which).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// State machine and protocol variant to simulate.
    #[arg(long, value_enum, env = "ENVBRIDGE_SIM_MODE", default_value_t = SimMode::Direct)]
    pub mode: SimMode,
    /// Delay before a transition completes: `EVENT=DURATION` (e.g. CONFIGURE=200ms, BIND=50ms),
    /// or a bare DURATION as the default for every event. Repeatable; comma-separated in env.
    #[arg(long = "delay", env = "ENVBRIDGE_SIM_DELAY", value_delimiter = ',')]
    pub delay: Vec<String>,
    /// Reply ok=false and go to ERROR on this event. Repeatable.
    #[arg(long = "fail-on", env = "ENVBRIDGE_SIM_FAIL_ON", value_delimiter = ',')]
    pub fail_on: Vec<String>,
    /// Exit the process with status 70, without replying, on this event. Repeatable.
    #[arg(
        long = "crash-on",
        env = "ENVBRIDGE_SIM_CRASH_ON",
        value_delimiter = ','
    )]
    pub crash_on: Vec<String>,
    /// Never reply to this event. Repeatable.
    #[arg(long = "hang-on", env = "ENVBRIDGE_SIM_HANG_ON", value_delimiter = ',')]
    pub hang_on: Vec<String>,
    /// Reply ok=false and stay in the source state on this event (a stuck FairMQ step, which
    /// the client must roll back). Repeatable.
    #[arg(
        long = "stuck-on",
        env = "ENVBRIDGE_SIM_STUCK_ON",
        value_delimiter = ','
    )]
    pub stuck_on: Vec<String>,
    /// Move to ERROR by itself, unprompted, this long after reaching a run-control state:
    /// `STATE=DURATION` (e.g. RUNNING=2s). A fairmq device then exits, as a real one does.
    #[arg(long = "fail-in", env = "ENVBRIDGE_SIM_FAIL_IN", value_delimiter = ',')]
    pub fail_in: Vec<String>,
    /// Allow listening on an address outside 127.0.0.0/8 and ::1.
    #[arg(long)]
    pub allow_non_loopback: bool,
    /// Log every received argument (debug level).
    #[arg(long, short)]
    pub verbose: bool,
    /// Faults switched on and off at runtime: this file is read at every transition request
    /// (at most 4 KiB), lines `fail-on=EVENT`, `stuck-on=EVENT`, `hang-on=EVENT`,
    /// `crash-on=EVENT` applied on top of the options; missing = none (set by the sim
    /// runner's --fault-dir).
    #[arg(long, hide = true)]
    pub fault_file: Option<std::path::PathBuf>,
    /// Exit once this process is no longer the parent (set by the sim runner, so that no
    /// simulator outlives it even when it is killed).
    #[arg(long, hide = true)]
    pub parent_pid: Option<u32>,
}

fn default_listen() -> Result<SocketAddr, String> {
    let port = match std::env::var("OCC_CONTROL_PORT") {
        Ok(p) if !p.trim().is_empty() => p
            .trim()
            .parse::<u16>()
            .map_err(|e| format!("OCC_CONTROL_PORT={p:?} is not a port: {e}"))?,
        _ => DEFAULT_CONTROL_PORT,
    };
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

fn init_logging(verbose: bool) {
    let default = if verbose {
        "info,envbridge=debug"
    } else {
        "info"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

pub fn run(args: TaskSimArgs) -> ExitCode {
    init_logging(args.verbose);
    let config = match SimConfig::parse(
        args.mode,
        &args.delay,
        &args.fail_on,
        &args.crash_on,
        &args.hang_on,
        &args.stuck_on,
    )
    .and_then(|c| c.with_fail_in(&args.fail_in))
    {
        Ok(c) => SimConfig {
            fault_file: args.fault_file.clone(),
            ..c
        },
        Err(e) => {
            error!("task simulator: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let listen = match args.listen.map(Ok).unwrap_or_else(default_listen) {
        Ok(a) => a,
        Err(e) => {
            error!("task simulator: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!("task simulator: cannot start its runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let listener = match server::bind(listen, args.allow_non_loopback).await {
            Ok(l) => l,
            Err(e @ SimError::NotLoopback(_)) => {
                error!("{e}");
                return ExitCode::from(EXIT_USAGE);
            }
            Err(e) => {
                error!("{e}");
                return ExitCode::from(EXIT_BIND_FAILED);
            }
        };
        let local = listener.local_addr().unwrap_or(listen);
        info!(
            "task simulator listening on {local} (mode {}, pid {}){}",
            args.mode,
            std::process::id(),
            args.fault_file
                .as_ref()
                .map(|f| format!(", runtime faults from {}", f.display()))
                .unwrap_or_default()
        );
        let sim = Simulator::new(config);
        tokio::select! {
            r = server::serve(listener, sim, std::future::pending()) => match r {
                Err(e @ SimError::Crashed(_)) => {
                    error!("{e}: exiting with status {EXIT_CRASHED}");
                    // A crash: no cleanup, no graceful close of connections.
                    std::process::exit(i32::from(EXIT_CRASHED));
                }
                Err(e) => {
                    error!("{e}");
                    ExitCode::FAILURE
                }
                Ok(()) => ExitCode::SUCCESS,
            },
            _ = shutdown_signal() => {
                info!("task simulator on {local} stopping on signal");
                ExitCode::SUCCESS
            }
            _ = parent_gone(args.parent_pid) => {
                info!("task simulator on {local} stopping: its parent is gone");
                ExitCode::SUCCESS
            }
        }
    })
}

async fn parent_gone(parent: Option<u32>) {
    let Some(parent) = parent else {
        return std::future::pending().await;
    };
    loop {
        #[cfg(unix)]
        if std::os::unix::process::parent_id() != parent {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

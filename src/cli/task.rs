//! `envbridge task`: one task process, by hand (what the anchor's `peanut` is for shifters and
//! experts): read its state, drive one run-control transition, or watch it.
//!
//! Exit 0 on success; 1 when the task refuses (its answer is printed) or cannot be reached
//! within the timeout; 2 for bad usage.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;

use envbridge::control::fairmq::FmqState;
use envbridge::control::{ControlClient, ControlError, TaskEndpoint};
use envbridge::plan::{ControlMode, TaskRef};
use envbridge::state::{Event, State};

#[derive(clap::Args, Debug)]
pub struct TaskArgs {
    #[command(subcommand)]
    pub command: TaskCommand,
}

/// The protocol a task process speaks.
#[derive(Clone, Copy, Debug, Default, clap::ValueEnum)]
pub enum Mode {
    /// The OCC library (protobuf): readout and other direct tasks.
    #[default]
    Direct,
    /// A FairMQ device with the OCClite plugin (JSON, multi-step sequences).
    Fairmq,
}

impl From<Mode> for ControlMode {
    fn from(m: Mode) -> ControlMode {
        match m {
            Mode::Direct => ControlMode::Direct,
            Mode::Fairmq => ControlMode::Fairmq,
        }
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum TaskCommand {
    /// Print the task's run-control state (and a FairMQ device's own state beside it).
    State {
        /// HOST:PORT of the task's control port.
        addr: String,
        #[arg(long, value_enum, default_value_t = Mode::Direct)]
        mode: Mode,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 5)]
        timeout: u64,
    },
    /// Drive the task through one run-control event (FairMQ: the whole step sequence).
    Transition {
        /// HOST:PORT of the task's control port.
        addr: String,
        /// CONFIGURE, START, STOP, RESET, RECOVER or EXIT.
        event: String,
        /// Argument sent with the event (repeatable).
        #[arg(long = "arg", value_name = "KEY=VALUE", value_parser = key_value)]
        args: Vec<(String, String)>,
        /// START: the run number (sent as runNumber and run_number).
        #[arg(long)]
        run_number: Option<u64>,
        #[arg(long, value_enum, default_value_t = Mode::Direct)]
        mode: Mode,
        /// Seconds the whole transition may take.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
    /// Print state changes and events as they come, until interrupted.
    Watch {
        /// HOST:PORT of the task's control port.
        addr: String,
        #[arg(long, value_enum, default_value_t = Mode::Direct)]
        mode: Mode,
    },
}

/// How often `watch` reads a FairMQ device's state (it has no state stream; one device by
/// hand can afford a quick poll).
const WATCH_POLL: Duration = Duration::from_millis(200);

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

fn resolve(addr: &str) -> Result<SocketAddr, String> {
    addr.to_socket_addrs()
        .map_err(|e| format!("{addr:?} is not HOST:PORT: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr:?} resolves to no address"))
}

pub fn run(args: TaskArgs) -> ExitCode {
    super::block_on_client(async move {
        // The same variable as the operator's: whether non-loopback addresses may be dialled.
        let control = ControlClient::from_env();
        let code = match args.command {
            TaskCommand::State {
                addr,
                mode,
                timeout,
            } => state(&control, &addr, mode, Duration::from_secs(timeout)).await,
            TaskCommand::Transition {
                addr,
                event,
                args,
                run_number,
                mode,
                timeout,
            } => {
                let mut given: BTreeMap<String, String> = args.into_iter().collect();
                if let Some(n) = run_number {
                    given.insert("run_number".into(), n.to_string());
                }
                transition(
                    &control,
                    &addr,
                    &event,
                    given,
                    mode,
                    Duration::from_secs(timeout),
                )
                .await
            }
            TaskCommand::Watch { addr, mode } => watch(&control, &addr, mode).await,
        };
        Ok::<_, String>(code)
    })
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::FAILURE
}

/// `STANDBY`, or for FairMQ `STANDBY device=IDLE` (`- device=BOUND` between states).
fn describe(raw: &str, mode: Mode) -> String {
    match mode {
        Mode::Direct => raw.to_string(),
        Mode::Fairmq => {
            let rc = raw
                .parse::<FmqState>()
                .ok()
                .and_then(|f| f.to_state())
                .map_or_else(|| "-".to_string(), |s| s.to_string());
            format!("{rc} device={raw}")
        }
    }
}

async fn state(control: &ControlClient, addr: &str, mode: Mode, timeout: Duration) -> ExitCode {
    let addr = match resolve(addr) {
        Ok(a) => a,
        Err(e) => return usage(e),
    };
    let ep = TaskEndpoint::new(addr, mode.into());
    match control.get_raw_state(&ep, timeout).await {
        Ok((raw, _pid)) => {
            println!("{}", describe(&raw, mode));
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(2)
}

async fn transition(
    control: &ControlClient,
    addr: &str,
    event: &str,
    given: BTreeMap<String, String>,
    mode: Mode,
    timeout: Duration,
) -> ExitCode {
    let addr = match resolve(addr) {
        Ok(a) => a,
        Err(e) => return usage(e),
    };
    let event = match event.parse::<Event>() {
        Ok(Event::GoError) | Err(_) => {
            return usage(format!(
                "{event:?} is not an event a task takes (CONFIGURE, START, STOP, RESET, RECOVER, EXIT)"
            ));
        }
        Ok(e) => e,
    };
    let ep = TaskEndpoint::new(addr, mode.into());
    let end = tokio::time::Instant::now() + timeout;
    let from = match control.get_state(&ep, timeout).await {
        Ok((s, _)) => s,
        Err(e) => return fail(e),
    };
    // What the operator would send (a task by hand has no properties or channels).
    let args = envbridge::operator::transition_args::arguments(event, &TaskRef::default(), &given);
    let left = end.saturating_duration_since(tokio::time::Instant::now());
    match control.transition(&ep, from, event, &args, left).await {
        Ok(reached) => {
            println!("{from} -> {reached}");
            ExitCode::SUCCESS
        }
        Err(e @ ControlError::NotApplicable { .. }) => fail(e),
        Err(e) => fail(format!("the task answered: {e}")),
    }
}

async fn watch(control: &ControlClient, addr: &str, mode: Mode) -> ExitCode {
    let addr = match resolve(addr) {
        Ok(a) => a,
        Err(e) => return usage(e),
    };
    let ep = TaskEndpoint::new(addr, mode.into());
    let stamp = || jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.3fZ");
    let mut backoff = Duration::from_millis(250);
    let mut lost = false;
    loop {
        // The state now, then what comes (direct: StateStream + EventStream; FairMQ: the
        // device's state polled, as it has no StateStream, + EventStream).
        match control.get_raw_state(&ep, Duration::from_secs(5)).await {
            Ok((raw, pid)) => {
                println!("{} state {} pid={pid}", stamp(), describe(&raw, mode));
                lost = false;
                backoff = Duration::from_millis(250);
            }
            Err(e) if !e.is_deadline() => {
                if !lost {
                    println!("{} unreachable: {e}", stamp());
                    lost = true;
                }
            }
            Err(_) => {}
        }
        if !lost {
            let states = match mode {
                Mode::Direct => control
                    .state_stream(&ep)
                    .map(|r| r.map(|s: State| format!("state {s}")))
                    .boxed(),
                Mode::Fairmq => control
                    .raw_state_stream(&ep, WATCH_POLL)
                    .skip(1)
                    .map(|r| r.map(|raw| format!("state {}", describe(&raw, mode))))
                    .boxed(),
            };
            let events = control
                .event_stream(&ep)
                .map(|r| r.map(|e| format!("event {e}")))
                .boxed();
            let mut both = futures::stream::select(states, events);
            let ended = loop {
                tokio::select! {
                    item = both.next() => match item {
                        Some(Ok(line)) => {
                            println!("{} {line}", stamp());
                            // An event means a change (a FairMQ device in ERROR or EXITING
                            // exits right after): read the state at once.
                            if line.starts_with("event ")
                                && let Ok((raw, _)) = control.get_raw_state(&ep, Duration::from_secs(2)).await
                            {
                                println!("{} state {}", stamp(), describe(&raw, mode));
                            }
                        }
                        Some(Err(e)) => break Some(e),
                        None => break None,
                    },
                    _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
                }
            };
            if let Some(e) = ended {
                tracing::debug!(error = %e, "watch stream ended");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

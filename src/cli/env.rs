//! `envbridge env ...`: the daemon's command-line client (tables for people, `-o json`).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use envbridge::server::pb;
use envbridge::server::pb::env_bridge_client::EnvBridgeClient;
use futures::StreamExt;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

#[derive(clap::Args, Debug)]
pub struct EnvArgs {
    /// Daemon address.
    #[arg(
        long,
        global = true,
        env = "ENVBRIDGE_ADDR",
        default_value = "http://127.0.0.1:50061"
    )]
    pub addr: String,
    /// Bearer token for the daemon.
    #[arg(long, global = true, env = "ENVBRIDGE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the bearer token (its first line), instead of --token.
    #[arg(
        long,
        global = true,
        env = "ENVBRIDGE_TOKEN_FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<std::path::PathBuf>,
    /// CA certificate (PEM) to verify the daemon's TLS certificate (https:// addresses).
    #[arg(long, global = true, env = "ENVBRIDGE_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Output: table (default) or json.
    #[arg(short = 'o', long, global = true, default_value = "table")]
    pub output: Output,
    #[command(subcommand)]
    pub command: EnvCommand,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

#[derive(clap::Subcommand, Debug)]
pub enum EnvCommand {
    /// Create an environment from a workflow (idempotent with --idempotency-key or --id).
    Create {
        workflow: String,
        /// Workflow variable (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = key_value)]
        set: Vec<(String, String)>,
        #[arg(long)]
        id: Option<String>,
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Return without waiting for every task to reach STANDBY.
        #[arg(long)]
        no_wait: bool,
        /// Seconds to wait (0: the daemon's default).
        #[arg(long, default_value_t = 0)]
        timeout: u32,
    },
    /// List environments.
    List,
    /// Show one environment and its tasks.
    Get { id: String },
    /// Run a transition (CONFIGURE, START, STOP, RESET, RECOVER, EXIT, GO_ERROR) and wait for it.
    Transition {
        id: String,
        /// The event; omit it with --await to wait for an earlier transition.
        event: Option<String>,
        /// Run argument (repeatable), passed to every task.
        #[arg(long = "arg", value_name = "KEY=VALUE", value_parser = key_value)]
        args: Vec<(String, String)>,
        /// START: the run number (argument run_number).
        #[arg(long)]
        run_number: Option<u64>,
        /// START: the run type (argument run_type).
        #[arg(long)]
        run_type: Option<String>,
        #[arg(long)]
        no_wait: bool,
        /// Seconds (0: the daemon's configured timeout for the event).
        #[arg(long, default_value_t = 0)]
        timeout: u32,
        /// Await the transition with this id instead of requesting a new one.
        #[arg(long = "await", value_name = "TRANSITION_ID")]
        await_id: Option<String>,
    },
    /// Destroy an environment and wait for its tasks and pods to be gone.
    Destroy {
        id: String,
        #[arg(long)]
        no_wait: bool,
        #[arg(long, default_value_t = 0)]
        timeout: u32,
    },
    /// Kill one task (it is deleted and leaves the environment).
    KillTask { id: String, task: String },
    /// Stream roster changes (all environments, or one).
    Events {
        id: Option<String>,
        /// Start with the current state.
        #[arg(long)]
        snapshot: bool,
    },
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

#[derive(Clone)]
pub(super) struct Auth(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub(super) type Client =
    EnvBridgeClient<tonic::service::interceptor::InterceptedService<Channel, Auth>>;

async fn connect(a: &EnvArgs) -> Result<Client, String> {
    let from_file = match &a.token_file {
        Some(p) => Some(read_token(p)?),
        None => None,
    };
    let token = a.token.as_deref().or(from_file.as_deref());
    connect_to(&a.addr, token, a.ca_cert.as_deref()).await
}

/// A client's token file: its first non-empty line.
pub(super) fn read_token(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("{}: no token in it", path.display()))
}

/// A daemon client for `addr` (`http://` or `https://`), with an optional bearer token and CA.
pub(super) async fn connect_to(
    addr: &str,
    token: Option<&str>,
    ca_cert: Option<&std::path::Path>,
) -> Result<Client, String> {
    let mut ep =
        Channel::from_shared(addr.to_string()).map_err(|e| format!("address {addr}: {e}"))?;
    if addr.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = ca_cert {
            let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        ep = ep.tls_config(tls).map_err(|e| format!("TLS: {e}"))?;
    }
    let ch = ep
        .connect()
        .await
        .map_err(|e| format!("cannot reach the daemon at {addr}: {e}"))?;
    let token = match token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .map_err(|_| "the token is not valid ASCII".to_string())?,
        ),
        None => None,
    };
    Ok(EnvBridgeClient::with_interceptor(ch, Auth(token)))
}

fn status_msg(s: tonic::Status) -> String {
    format!("{}: {}", code_name(s.code()), s.message())
}

fn code_name(c: tonic::Code) -> &'static str {
    match c {
        tonic::Code::InvalidArgument => "invalid",
        tonic::Code::NotFound => "not found",
        tonic::Code::FailedPrecondition => "refused",
        tonic::Code::Unauthenticated => "unauthenticated",
        tonic::Code::Unavailable => "unavailable",
        tonic::Code::DeadlineExceeded => "timeout",
        _ => "failed",
    }
}

pub fn run(args: EnvArgs) -> ExitCode {
    super::block_on_client(dispatch(args))
}

async fn dispatch(a: EnvArgs) -> Result<ExitCode, String> {
    let mut c = connect(&a).await?;
    let json = a.output == Output::Json;
    match a.command {
        EnvCommand::Create {
            workflow,
            set,
            id,
            idempotency_key,
            no_wait,
            timeout,
        } => {
            let req = pb::CreateEnvironmentRequest {
                workflow,
                variables: set.into_iter().collect(),
                idempotency_key: idempotency_key.unwrap_or_default(),
                env_id: id.unwrap_or_default(),
                wait: !no_wait,
                timeout_seconds: timeout,
            };
            let r = c
                .create_environment(req)
                .await
                .map_err(status_msg)?
                .into_inner();
            let failed = !no_wait && r.outcome != "reached";
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&create_json(&r)).unwrap_or_default()
                );
            } else {
                let verb = if r.created { "created" } else { "exists" };
                println!(
                    "{} {verb}: {} tasks on {} nodes (namespace {})",
                    r.id, r.tasks, r.nodes, r.namespace
                );
                if !no_wait {
                    println!("{}: {}", r.outcome, r.message);
                }
                print_failures(&r.failures, &r.warnings);
            }
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        EnvCommand::List => {
            let r = c
                .list_environments(pb::ListEnvironmentsRequest {})
                .await
                .map_err(status_msg)?
                .into_inner();
            if json {
                let v: Vec<_> = r.environments.iter().map(env_json).collect();
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                let mut rows = vec![vec![
                    "ID".into(),
                    "NAMESPACE".into(),
                    "WORKFLOW".into(),
                    "DESIRED".into(),
                    "STATE".into(),
                    "NODES".into(),
                    "TASKS".into(),
                    "COUNTS".into(),
                ]];
                for e in &r.environments {
                    rows.push(vec![
                        e.id.clone(),
                        e.namespace.clone(),
                        e.workflow.clone(),
                        e.desired_state.clone(),
                        or_dash(&e.state),
                        e.nodes.to_string(),
                        e.tasks_expected.to_string(),
                        counts(&e.counts),
                    ]);
                }
                print_table(&rows);
            }
            Ok(ExitCode::SUCCESS)
        }
        EnvCommand::Get { id } => {
            let e = c
                .get_environment(pb::GetEnvironmentRequest { id })
                .await
                .map_err(status_msg)?
                .into_inner();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&env_json(&e)).unwrap_or_default()
                );
            } else {
                println!(
                    "environment {} ({}/{}) workflow {}",
                    e.id, e.namespace, e.name, e.workflow
                );
                println!(
                    "desired {}  state {}  tasks {}/{}  {}",
                    e.desired_state,
                    or_dash(&e.state),
                    e.tasks.len(),
                    e.tasks_expected,
                    counts(&e.counts)
                );
                if let Some(o) = &e.observed {
                    println!(
                        "last transition {} {} {} {}",
                        o.event, o.id, o.phase, o.message
                    );
                }
                let mut rows = vec![
                    [
                        "TASK", "NODE", "CLASS", "STATE", "PHASE", "POD-IP", "CRIT", "MESSAGE",
                    ]
                    .map(String::from)
                    .to_vec(),
                ];
                for t in &e.tasks {
                    rows.push(vec![
                        t.name.clone(),
                        t.node.clone(),
                        t.class.clone(),
                        t.state.clone(),
                        or_dash(&t.pod_phase),
                        or_dash(&t.pod_ip),
                        if t.critical {
                            "yes".into()
                        } else {
                            "no".into()
                        },
                        t.message.clone(),
                    ]);
                }
                print_table(&rows);
            }
            Ok(ExitCode::SUCCESS)
        }
        EnvCommand::Transition {
            id,
            event,
            args,
            run_number,
            run_type,
            no_wait,
            timeout,
            await_id,
        } => {
            let mut arguments: BTreeMap<String, String> = args.into_iter().collect();
            if let Some(n) = run_number {
                arguments.insert("run_number".into(), n.to_string());
            }
            if let Some(t) = run_type {
                arguments.insert("run_type".into(), t);
            }
            if event.is_none() && await_id.is_none() {
                return Err("give an EVENT, or --await TRANSITION_ID".into());
            }
            let req = pb::TransitionRequest {
                id: id.clone(),
                event: event.clone().unwrap_or_default(),
                arguments: arguments.into_iter().collect(),
                wait: !no_wait,
                timeout_seconds: timeout,
                transition_id: await_id.unwrap_or_default(),
            };
            let progress = (!no_wait && !json)
                .then(|| tokio::spawn(progress(a.addr.clone(), c.clone(), id.clone(), event)));
            let res = c.transition(req).await;
            if let Some(p) = progress {
                p.abort();
                if std::io::stderr().is_terminal() {
                    eprint!("\r\x1b[2K");
                }
            }
            let r = res.map_err(status_msg)?.into_inner();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&transition_json(&r)).unwrap_or_default()
                );
            } else {
                println!(
                    "{} {} ({}): {} in {:.2}s{}",
                    r.event,
                    if r.ok { "ok" } else { "FAILED" },
                    r.transition_id,
                    r.outcome,
                    r.elapsed_ms as f64 / 1000.0,
                    if r.message.is_empty() {
                        String::new()
                    } else {
                        format!(" - {}", r.message)
                    }
                );
                print_failures(&r.failures, &r.warnings);
            }
            Ok(if r.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        EnvCommand::Destroy {
            id,
            no_wait,
            timeout,
        } => {
            let req = pb::DestroyEnvironmentRequest {
                id,
                wait: !no_wait,
                timeout_seconds: timeout,
            };
            let r = c
                .destroy_environment(req)
                .await
                .map_err(status_msg)?
                .into_inner();
            if json {
                println!(
                    "{}",
                    serde_json::json!({"gone": r.gone, "message": r.message})
                );
            } else {
                println!("{}", r.message);
            }
            Ok(if no_wait || r.gone {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        EnvCommand::KillTask { id, task } => {
            let r = c
                .kill_task(pb::KillTaskRequest {
                    id,
                    task: task.clone(),
                    timeout_seconds: 0,
                })
                .await
                .map_err(status_msg)?
                .into_inner();
            if json {
                println!("{}", serde_json::json!({"task": task, "gone": r.gone}));
            } else if r.gone {
                println!("task {task} killed");
            } else {
                println!("task {task}: deletion requested, still present");
            }
            Ok(if r.gone {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        EnvCommand::Events { id, snapshot } => {
            let req = pb::WatchEventsRequest {
                id: id.unwrap_or_default(),
                snapshot,
            };
            let mut s = c.watch_events(req).await.map_err(status_msg)?.into_inner();
            while let Some(ev) = s.next().await {
                let ev = ev.map_err(status_msg)?;
                if json {
                    println!(
                        "{}",
                        serde_json::to_string(&event_json(&ev)).unwrap_or_default()
                    );
                } else {
                    println!("{}", event_line(&ev));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Shows, on stderr, how many tasks reached the target while a transition runs.
async fn progress(_addr: String, mut c: Client, id: String, event: Option<String>) {
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let target = event
        .as_deref()
        .and_then(|e| e.parse::<envbridge::state::Event>().ok())
        .map(|e| e.target().to_string());
    let Ok(stream) = c
        .watch_events(pb::WatchEventsRequest {
            id: id.clone(),
            snapshot: true,
        })
        .await
    else {
        return;
    };
    let mut stream = stream.into_inner();
    let mut states: BTreeMap<String, String> = BTreeMap::new();
    let mut last_print = Instant::now() - Duration::from_secs(10);
    let label = event.unwrap_or_else(|| "transition".into());
    loop {
        let next = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
        match next {
            Ok(Some(Ok(ev))) => {
                if let Some(t) = ev.task {
                    states.insert(t.name, t.state);
                } else if ev.kind == "task-deleted" {
                    states.remove(&ev.task_name);
                }
            }
            Ok(Some(Err(_))) | Ok(None) => return,
            Err(_) => {}
        }
        let interval = if tty {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(2)
        };
        if last_print.elapsed() < interval {
            continue;
        }
        last_print = Instant::now();
        let mut by: BTreeMap<&str, u32> = BTreeMap::new();
        for s in states.values() {
            *by.entry(s.as_str()).or_insert(0) += 1;
        }
        let done = target
            .as_deref()
            .and_then(|t| by.get(t))
            .copied()
            .unwrap_or(0);
        let line = format!(
            "{label}: {done}/{} {}  [{}]  {:.1}s",
            states.len(),
            target.as_deref().unwrap_or(""),
            by.iter()
                .map(|(s, n)| format!("{s} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
            started.elapsed().as_secs_f64()
        );
        if tty {
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
    }
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

fn counts(c: &std::collections::HashMap<String, u32>) -> String {
    let sorted: BTreeMap<_, _> = c.iter().collect();
    sorted
        .iter()
        .map(|(s, n)| format!("{s}:{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn print_table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
}

fn print_failures(failures: &[pb::Failure], warnings: &[pb::Failure]) {
    for f in failures {
        println!(
            "  FAILED {} on {} ({}): {}",
            f.task, f.node, f.path, f.message
        );
    }
    for f in warnings {
        println!(
            "  warning (non-critical) {} on {} ({}): {}",
            f.task, f.node, f.path, f.message
        );
    }
}

fn failure_json(f: &pb::Failure) -> serde_json::Value {
    serde_json::json!({"task": f.task, "node": f.node, "path": f.path, "critical": f.critical, "message": f.message})
}

fn task_json(t: &pb::Task) -> serde_json::Value {
    serde_json::json!({
        "name": t.name, "node": t.node, "class": t.class, "path": t.path, "critical": t.critical,
        "state": t.state, "podPhase": t.pod_phase, "podIP": t.pod_ip, "message": t.message,
        "transitionId": t.transition_id, "changedUnixMs": t.changed_unix_ms,
    })
}

fn env_json(e: &pb::Environment) -> serde_json::Value {
    let tr = |t: &Option<pb::TransitionInfo>| {
        t.as_ref().map(|t| serde_json::json!({"id": t.id, "event": t.event, "phase": t.phase, "message": t.message}))
    };
    serde_json::json!({
        "id": e.id, "namespace": e.namespace, "name": e.name, "workflow": e.workflow,
        "nodes": e.nodes, "tasksExpected": e.tasks_expected, "desiredState": e.desired_state,
        "state": e.state, "requested": tr(&e.requested), "observed": tr(&e.observed),
        "counts": e.counts.iter().collect::<BTreeMap<_, _>>(),
        "tasks": e.tasks.iter().map(task_json).collect::<Vec<_>>(),
        "failing": e.failing.iter().map(failure_json).collect::<Vec<_>>(),
        "deleting": e.deleting,
    })
}

fn create_json(r: &pb::CreateEnvironmentReply) -> serde_json::Value {
    serde_json::json!({
        "id": r.id, "namespace": r.namespace, "name": r.name, "nodes": r.nodes, "tasks": r.tasks,
        "created": r.created, "outcome": r.outcome, "message": r.message,
        "failures": r.failures.iter().map(failure_json).collect::<Vec<_>>(),
        "warnings": r.warnings.iter().map(failure_json).collect::<Vec<_>>(),
    })
}

fn transition_json(r: &pb::TransitionReply) -> serde_json::Value {
    serde_json::json!({
        "transitionId": r.transition_id, "event": r.event, "targetState": r.target_state, "ok": r.ok,
        "outcome": r.outcome, "message": r.message, "tasks": r.tasks, "elapsedMs": r.elapsed_ms,
        "failures": r.failures.iter().map(failure_json).collect::<Vec<_>>(),
        "warnings": r.warnings.iter().map(failure_json).collect::<Vec<_>>(),
    })
}

fn event_json(ev: &pb::RosterEvent) -> serde_json::Value {
    serde_json::json!({
        "kind": ev.kind, "namespace": ev.namespace, "environment": ev.env_name, "taskName": ev.task_name,
        "task": ev.task.as_ref().map(task_json), "env": ev.environment.as_ref().map(env_json),
    })
}

fn event_line(ev: &pb::RosterEvent) -> String {
    match (&ev.task, &ev.environment) {
        (Some(t), _) => format!(
            "{:<13} {}/{} task {} {} {} {}",
            ev.kind,
            ev.namespace,
            ev.env_name,
            t.name,
            t.state,
            or_dash(&t.pod_phase),
            t.message
        ),
        (None, Some(e)) => {
            format!(
                "{:<13} {}/{} desired {} state {} {}",
                ev.kind,
                ev.namespace,
                ev.env_name,
                e.desired_state,
                or_dash(&e.state),
                counts(&e.counts)
            )
        }
        _ => format!(
            "{:<13} {}/{} {}",
            ev.kind, ev.namespace, ev.env_name, ev.task_name
        ),
    }
}

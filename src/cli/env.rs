//! `envbridge env ...`: the daemon's command-line client (tables for people, `-o json`).
//! One function per subcommand; the connection is in env_connect.rs, the printing in
//! env_print.rs.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use envbridge::server::pb;
use futures::StreamExt;

use super::env_connect::{connect, status_msg};
use super::env_print::{
    counts, create_json, env_json, event_json, event_line, or_dash, print_failures, print_table,
    transition_json,
};

use super::env_connect::Client;

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

pub fn run(args: EnvArgs) -> ExitCode {
    super::block_on_client(dispatch(args))
}

/// Success unless `failed`.
fn exit(failed: bool) -> ExitCode {
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
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
            create(&mut c, req, json).await
        }
        EnvCommand::List => list(&mut c, json).await,
        EnvCommand::Get { id } => get(&mut c, id, json).await,
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
                id,
                event: event.unwrap_or_default(),
                arguments: arguments.into_iter().collect(),
                wait: !no_wait,
                timeout_seconds: timeout,
                transition_id: await_id.unwrap_or_default(),
            };
            transition(&mut c, req, json).await
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
            destroy(&mut c, req, json).await
        }
        EnvCommand::KillTask { id, task } => kill_task(&mut c, id, task, json).await,
        EnvCommand::Events { id, snapshot } => {
            let req = pb::WatchEventsRequest {
                id: id.unwrap_or_default(),
                snapshot,
            };
            events(&mut c, req, json).await
        }
    }
}

async fn create(
    c: &mut Client,
    req: pb::CreateEnvironmentRequest,
    json: bool,
) -> Result<ExitCode, String> {
    let wait = req.wait;
    let r = c
        .create_environment(req)
        .await
        .map_err(status_msg)?
        .into_inner();
    if json {
        print_json(&create_json(&r));
    } else {
        let verb = if r.created { "created" } else { "exists" };
        println!(
            "{} {verb}: {} tasks on {} nodes (namespace {})",
            r.id, r.tasks, r.nodes, r.namespace
        );
        if wait {
            println!("{}: {}", r.outcome, r.message);
        }
        print_failures(&r.failures, &r.warnings);
    }
    Ok(exit(wait && r.outcome != "reached"))
}

async fn list(c: &mut Client, json: bool) -> Result<ExitCode, String> {
    let r = c
        .list_environments(pb::ListEnvironmentsRequest {})
        .await
        .map_err(status_msg)?
        .into_inner();
    if json {
        print_json(&serde_json::Value::Array(
            r.environments.iter().map(env_json).collect(),
        ));
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = vec![
        [
            "ID",
            "NAMESPACE",
            "WORKFLOW",
            "DESIRED",
            "STATE",
            "NODES",
            "TASKS",
            "COUNTS",
        ]
        .map(String::from)
        .to_vec(),
    ];
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
    Ok(ExitCode::SUCCESS)
}

async fn get(c: &mut Client, id: String, json: bool) -> Result<ExitCode, String> {
    let e = c
        .get_environment(pb::GetEnvironmentRequest { id })
        .await
        .map_err(status_msg)?
        .into_inner();
    if json {
        print_json(&env_json(&e));
        return Ok(ExitCode::SUCCESS);
    }
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
            if t.critical { "yes" } else { "no" }.into(),
            t.message.clone(),
        ]);
    }
    print_table(&rows);
    Ok(ExitCode::SUCCESS)
}

async fn transition(
    c: &mut Client,
    req: pb::TransitionRequest,
    json: bool,
) -> Result<ExitCode, String> {
    let event = (!req.event.is_empty()).then(|| req.event.clone());
    let progress =
        (req.wait && !json).then(|| tokio::spawn(progress(c.clone(), req.id.clone(), event)));
    let res = c.transition(req).await;
    if let Some(p) = progress {
        p.abort();
        if std::io::stderr().is_terminal() {
            eprint!("\r\x1b[2K");
        }
    }
    let r = res.map_err(status_msg)?.into_inner();
    if json {
        print_json(&transition_json(&r));
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
    Ok(exit(!r.ok))
}

async fn destroy(
    c: &mut Client,
    req: pb::DestroyEnvironmentRequest,
    json: bool,
) -> Result<ExitCode, String> {
    let wait = req.wait;
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
    Ok(exit(wait && !r.gone))
}

async fn kill_task(
    c: &mut Client,
    id: String,
    task: String,
    json: bool,
) -> Result<ExitCode, String> {
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
    Ok(exit(!r.gone))
}

async fn events(
    c: &mut Client,
    req: pb::WatchEventsRequest,
    json: bool,
) -> Result<ExitCode, String> {
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

/// Shows, on stderr, how many tasks reached the target while a transition runs.
async fn progress(mut c: Client, id: String, event: Option<String>) {
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

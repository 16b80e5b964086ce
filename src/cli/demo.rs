//! `envbridge demo`: the whole system end to end on the local control plane.
//!
//! Starts (or reuses) the control plane, installs the CRDs and TaskTemplates, starts the
//! operator, the daemon and the task simulators as child processes, then drives a
//! readout-dataflow environment through CONFIGURE -> START -> STOP -> RESET -> destroy and
//! shows two injected failures: one that a transition meets, one that happens in RUNNING
//! with no transition asked. Progress goes to stdout for people; the LAST stdout line is a
//! one-line JSON summary for scripts. Everything it started is stopped on every exit path.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use envbridge::dev::process;
use envbridge::server::pb;
use serde_json::json;

use super::env_connect::{Client, connect_to};

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Simulated FLP nodes (one readout -> StfBuilder -> StfSender chain on each).
    #[arg(long, default_value_t = 4)]
    pub nodes: u32,
    /// Run on N REAL nodes instead (a kubelet and containerd each): the tasks in real
    /// containers, the daemon and the operator deployed in the cluster from
    /// manifests/deploy/local.
    #[arg(long, default_value_t = 0, conflicts_with = "tasks")]
    pub real_nodes: u32,
    /// The project's manifests directory.
    #[arg(long, default_value = "manifests")]
    pub manifests: PathBuf,
    /// Leave the local control plane running at the end (by default it is stopped when the
    /// demo started it; one that was already running is always left running).
    #[arg(long)]
    pub keep_cluster: bool,
    /// Run another workflow instead of the project's own (e.g. the anchor's
    /// ControlWorkflows, unmodified): its task classes ...
    #[arg(long, value_name = "DIR", requires_all = ["workflows", "workflow"])]
    pub tasks: Option<PathBuf>,
    /// ... its workflows ...
    #[arg(long, value_name = "DIR", requires = "tasks")]
    pub workflows: Option<PathBuf>,
    /// ... the site's configuration store (the anchor's layout) ...
    #[arg(long, value_name = "FILE", requires = "tasks")]
    pub config: Option<PathBuf>,
    /// ... the workflow's name in --workflows ...
    #[arg(long, value_name = "NAME", requires = "tasks")]
    pub workflow: Option<String>,
    /// ... and its variables (the demo acts as the site's administrator: any is allowed).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = super::render::parse_set, requires = "tasks")]
    pub sets: Vec<(String, String)>,
    /// At the end, leave an environment RUNNING and everything up until Ctrl-C (to look at
    /// it on the dashboard).
    #[arg(long)]
    pub hold: bool,
    /// Also serve the anchor's API (o2control.Control) on this loopback address, with the
    /// operator role: coconut and the ControlGUI can drive the demo (docs/o2control.md).
    #[arg(long, value_name = "ADDR")]
    pub o2control_listen: Option<std::net::SocketAddr>,
}

/// Another workflow than the project's own, with its sources made absolute (the children
/// run in their own directory).
struct Foreign {
    tasks: PathBuf,
    workflows: PathBuf,
    config: Option<PathBuf>,
    workflow: String,
    sets: Vec<(String, String)>,
    /// What a local render gives: the hosts its tasks land on, and the number of tasks.
    hosts: Vec<String>,
    tasks_count: usize,
}

impl Foreign {
    fn of(args: &DemoArgs) -> Result<Option<Self>, String> {
        let (Some(tasks), Some(workflows), Some(workflow)) =
            (&args.tasks, &args.workflows, &args.workflow)
        else {
            return Ok(None);
        };
        let abs = |p: &Path| {
            p.canonicalize()
                .map_err(|e| format!("{}: {e}", p.display()))
        };
        let (tasks, workflows) = (abs(tasks)?, abs(workflows)?);
        let config = args.config.as_deref().map(abs).transpose()?;
        let store = match &config {
            Some(c) => {
                envbridge::workflow::store::ConfigStore::load(c).map_err(|e| e.to_string())?
            }
            None => envbridge::workflow::store::ConfigStore::empty(),
        };
        let req = envbridge::plan::RenderRequest {
            sources: envbridge::workflow::Sources {
                tasks_dir: tasks.clone(),
                workflows_dir: Some(workflows.clone()),
                defaults_files: vec![],
            },
            workflow: workflow.into(),
            sets: args.sets.clone(),
            store: std::sync::Arc::new(store),
            env_id: Some("demo".into()),
            ..Default::default()
        };
        let plan =
            envbridge::plan::build(&req).map_err(|e| format!("rendering {workflow}: {e}"))?;
        let mut hosts: Vec<String> = plan.tasks.iter().map(|t| t.node.clone()).collect();
        hosts.dedup();
        Ok(Some(Foreign {
            tasks,
            workflows,
            config,
            workflow: workflow.clone(),
            sets: args.sets.clone(),
            hosts,
            tasks_count: plan.tasks.len(),
        }))
    }
}

/// The node whose StfBuilder the demo's second environment makes fail CONFIGURE.
const FAILING_HOST_INDEX: u32 = 2;

pub fn run(args: DemoArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("starting the runtime: {e}")),
    };
    let started_plane = !matches!(envbridge::dev::current(), Ok(Some(_)));
    let mut children = Children::default();
    let mut live = Live::default();
    let outcome = rt.block_on(demo(&args, &mut children, &mut live));
    step("cleaning up what the demo started");
    if outcome.is_err() {
        rt.block_on(live.destroy_all());
    }
    children.stop();
    if started_plane && !args.keep_cluster {
        match envbridge::dev::down() {
            Ok(_) => say("local control plane stopped"),
            Err(e) => eprintln!("warning: stopping the local control plane: {e}"),
        }
    }
    match outcome {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::FAILURE
}

pub(super) fn step(what: &str) {
    println!("\n==> {what}");
}

pub(super) fn say(what: &str) {
    println!("    {what}");
}

/// What must not outlive a failed demo: the environments it created, and the client to destroy them.
#[derive(Default)]
struct Live {
    api: Option<Client>,
    environments: Vec<String>,
}

impl Live {
    async fn destroy_all(&mut self) {
        let Some(api) = self.api.as_mut() else { return };
        for id in std::mem::take(&mut self.environments) {
            let done = tokio::time::timeout(Duration::from_secs(60), destroy(api, &id)).await;
            match done {
                Ok(Ok(())) => say(&format!("environment {id} destroyed")),
                Ok(Err(e)) => eprintln!("warning: {e}"),
                Err(_) => eprintln!("warning: destroying {id} did not finish within 60 s"),
            }
        }
    }
}

async fn demo(
    args: &DemoArgs,
    children: &mut Children,
    live: &mut Live,
) -> Result<serde_json::Value, String> {
    let foreign = Foreign::of(args)?;
    // A simulated node for every host the workflow's tasks land on.
    let placed = foreign
        .as_ref()
        .map(|f| envbridge::dev::nodes::host_indices(&f.hosts))
        .unwrap_or_default();
    let nodes = match &foreign {
        Some(_) => placed.iter().map(|(n, _)| *n).max().unwrap_or(1),
        None => args.nodes,
    };
    let real = args.real_nodes;
    if args.hold && foreign.is_none() && real == 0 {
        // Refused before anything starts, not after the demo's steps.
        super::demo_hold::hold_hosts(&sim_hosts(args.nodes))?;
    }
    if real > 0 && args.o2control_listen.is_some() {
        return Err("--o2control-listen is not available with --real-nodes yet (the daemon then runs in the cluster)".into());
    }
    if real > 0 {
        step(&format!(
            "local control plane with {real} real nodes (and {nodes} simulated)"
        ));
    } else {
        step(&format!(
            "local control plane with {nodes} simulated FLP nodes"
        ));
    }
    let t = Instant::now();
    let spec = envbridge::dev::UpSpec {
        nodes,
        real_nodes: real,
        exe: None,
        ..Default::default()
    };
    let info = envbridge::dev::ensure_up_with(&spec)
        .await
        .map_err(|e| format!("the local control plane: {e}"))?;
    say(&format!(
        "apiserver {} ready in {} ms",
        info.server,
        t.elapsed().as_millis()
    ));
    let kube = envbridge::dev::client_for(&info.kubeconfig)
        .await
        .map_err(|e| e.to_string())?;
    let _ = PLANE.set(kube.clone());
    for (n, host) in &placed {
        if envbridge::dev::nodes::host_indices(std::slice::from_ref(host))[0].0 != *n {
            envbridge::dev::nodes::label_host(&kube, *n, host)
                .await
                .map_err(|e| format!("labelling the node of {host}: {e}"))?;
            say(&format!("node {n} stands in for host {host}"));
        }
    }

    step("installing the CRDs and TaskTemplates");
    envbridge::install::crds(&kube)
        .await
        .map_err(|e| e.to_string())?;
    let templates = args.manifests.join("task-templates");
    let names = envbridge::install::task_templates(&kube, &templates)
        .await
        .map_err(|e| e.to_string())?;
    say(&format!("TaskTemplates: {}", names.join(", ")));

    step("starting the task simulators, the operator and the daemon");
    let run_dir = info.state_dir.join("demo");
    std::fs::create_dir_all(&run_dir).map_err(|e| format!("{}: {e}", run_dir.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("locating envbridge: {e}"))?;
    let port = process::free_port().map_err(|e| e.to_string())?;
    let http_port = loop {
        let p = process::free_port().map_err(|e| e.to_string())?;
        if p != port {
            break p;
        }
    };
    let kubeconfig = info.kubeconfig.display().to_string();
    // Absolute: the children run in their own directory.
    let manifests = args
        .manifests
        .canonicalize()
        .map_err(|e| format!("the manifests directory {}: {e}", args.manifests.display()))?;
    let flows = manifests.join("control-workflows");
    let site = manifests.join("site/local.yaml");
    // The demo is the site's administrator: one admin token, in a file only it may read
    // (never in a URL or a command line).
    let token_file = run_dir.join("admin.token");
    let token = write_token(&token_file)?;
    let mut daemon_args = vec![
        "daemon".to_string(),
        format!("--listen=127.0.0.1:{port}"),
        format!("--token-file={}", token_file.display()),
        format!("--metrics-listen=127.0.0.1:{http_port}"),
    ];
    if let Some(addr) = args.o2control_listen {
        daemon_args.extend([
            format!("--o2control-listen={addr}"),
            "--o2control-role=operator".to_string(),
        ]);
    }
    match &foreign {
        None => daemon_args.extend([
            format!("--tasks-dir={}", flows.join("tasks").display()),
            format!("--workflows-dir={}", flows.join("workflows").display()),
            format!("--defaults={}", site.display()),
            // The demo is the site's administrator: its failure injection is allowed.
            "--allow-variable=sim_fail_host,sim_fail_on,sim_fail_in".to_string(),
            format!(
                "--config-store={}",
                super::demo_inventory::write(&run_dir, &sim_hosts(args.nodes))?.display()
            ),
        ]),
        Some(f) => {
            daemon_args.extend([
                format!("--tasks-dir={}", f.tasks.display()),
                format!("--workflows-dir={}", f.workflows.display()),
                // The project's own class -> TaskTemplate mapping.
                format!(
                    "--templates={}",
                    manifests.join("site/templates.yaml").display()
                ),
            ]);
            daemon_args.extend(
                f.config
                    .iter()
                    .map(|c| format!("--config-store={}", c.display())),
            );
            // The demo is the site's administrator: every --set is allowed.
            daemon_args.extend(f.sets.iter().map(|(k, _)| format!("--allow-variable={k}")));
        }
    }
    let kubectl = Kubectl {
        bin: info.kubectl.clone(),
        kubeconfig: info.kubeconfig.clone(),
    };
    let (api_addr, http, logs) = if real > 0 {
        step("deploying the daemon and the operator in the cluster (manifests/deploy/local)");
        let d =
            super::demo_cluster::deploy(&kube, &info.kubectl, &info.kubeconfig, &manifests, &token)
                .await;
        let d = children.deployed.insert(d?);
        (
            d.grpc.clone(),
            d.http.clone(),
            super::demo_cluster::TaskLogs::Kubelet(kube.clone()),
        )
    } else {
        let sim_args = [
            "dev".to_string(),
            "sim-runner".into(),
            format!("--kubeconfig={kubeconfig}"),
            format!("--log-dir={}", run_dir.join("simulators").display()),
            // Basic and hook tasks' processes run to completion.
            "--complete-tasks".into(),
        ];
        children.spawn(&exe, "sim-runner", &sim_args, &run_dir, &kubeconfig)?;
        // A free port for its metrics and probes: a second demo or a site's operator may
        // hold the default one.
        children.spawn(
            &exe,
            "operator",
            &[
                "operator".to_string(),
                "--metrics-listen=127.0.0.1:0".to_string(),
            ],
            &run_dir,
            &kubeconfig,
        )?;
        children.spawn(&exe, "daemon", &daemon_args, &run_dir, &kubeconfig)?;
        say(&format!("logs in {}", run_dir.display()));
        (
            format!("http://127.0.0.1:{port}"),
            format!("127.0.0.1:{http_port}"),
            super::demo_cluster::TaskLogs::Dir(run_dir.join("simulators")),
        )
    };
    let api = connect_with_retry(&api_addr, &token, children).await?;
    let api = live.api.insert(api);
    say(&format!(
        "daemon serving on {}",
        api_addr.trim_start_matches("http://")
    ));
    super::demo_hold::announce(&http, &token_file);
    if let Some(addr) = args.o2control_listen {
        say(&format!(
            "o2control.Control serving on {addr} (operator role)"
        ));
    }

    if let Some(f) = &foreign {
        let summary = cycle_of(f, api, &mut live.environments, &kubectl).await?;
        if args.hold {
            super::demo_hold::until_ctrl_c(&http, &token_file).await?;
        }
        return Ok(summary);
    }
    let hosts: Vec<String> = match real {
        0 => sim_hosts(args.nodes),
        n => info.real_hosts.iter().take(n as usize).cloned().collect(),
    };
    let hosts_json = serde_json::to_string(&hosts).map_err(|e| e.to_string())?;

    step(&format!(
        "creating a readout-dataflow environment on {}",
        hosts.join(", ")
    ));
    let t = Instant::now();
    let created = create(
        api,
        &mut live.environments,
        "demo",
        "readout-dataflow",
        &[("hosts", hosts_json.as_str())],
    )
    .await?;
    say(&format!(
        "environment {} in namespace {}: {} tasks on {} nodes, all STANDBY in {} ms",
        created.id,
        created.namespace,
        created.tasks,
        created.nodes,
        t.elapsed().as_millis()
    ));
    kubectl.show_when(&created.namespace, &created.id, "STANDBY");

    let timings = run_cycle(api, &mut live.environments, &kubectl, &created).await?;

    let bad_host = &hosts[(FAILING_HOST_INDEX.min(hosts.len() as u32) - 1) as usize];
    step(&format!(
        "failure: a second environment whose StfBuilder on {bad_host} is told to fail CONFIGURE"
    ));
    let failing = create(
        api,
        &mut live.environments,
        "demo-failure",
        "readout-dataflow",
        &[
            ("hosts", hosts_json.as_str()),
            ("sim_fail_host", bad_host.as_str()),
            ("sim_fail_on", "CONFIGURE"),
        ],
    )
    .await?;
    let t = Instant::now();
    let reply = transition(api, &failing.id, "CONFIGURE", &[]).await?;
    let failure_ms = t.elapsed().as_millis() as u64;
    let failed = reply.failures.iter().find(|f| f.critical).ok_or_else(|| {
        "CONFIGURE was expected to fail, but reported no failing task".to_string()
    })?;
    say(&format!(
        "CONFIGURE failed after {failure_ms} ms: task {} on {}: {}",
        failed.task, failed.node, failed.message
    ));
    kubectl.show_when(&failing.namespace, &failing.id, "ERROR");
    let failed_task = failed.task.clone();
    destroy(api, &failing.id).await?;
    live.environments.retain(|id| id != &failing.id);
    say("failed environment destroyed");

    let (midrun_ms, midrun_task) = super::demo_midrun::show(
        api,
        &mut live.environments,
        &kubectl,
        &hosts_json,
        bad_host,
        &logs,
    )
    .await?;
    if args.hold {
        super::demo_hold::hold(api, &mut live.environments, &hosts, &http, &token_file).await?;
    }

    let mut summary = json!({
        "nodes": created.nodes,
        "tasks": created.tasks,
        "transitions": timings,
        "failure_reported_ms": failure_ms,
        "failed_task": failed_task,
        "midrun_failure_reported_ms": midrun_ms,
        "midrun_failed_task": midrun_task,
    });
    if real > 0 {
        summary["real_nodes"] = json!(real);
        summary["in_cluster"] = json!(true);
    }
    Ok(summary)
}

/// CONFIGURE -> START -> STOP -> RESET, then destroy; the time of each transition.
async fn run_cycle(
    api: &mut Client,
    live: &mut Vec<String>,
    kubectl: &Kubectl,
    created: &pb::CreateEnvironmentReply,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut timings = serde_json::Map::new();
    for (event, run_args) in [
        ("CONFIGURE", vec![]),
        ("START", vec![("run_type", "PHYSICS")]),
        ("STOP", vec![]),
        ("RESET", vec![]),
    ] {
        step(event);
        let t = Instant::now();
        let reply = transition(api, &created.id, event, &run_args).await?;
        let ms = t.elapsed().as_millis() as u64;
        if !reply.ok {
            return Err(format!("{event} failed: {}", describe_failures(&reply)));
        }
        say(&format!(
            "{} tasks {} in {ms} ms",
            reply.tasks, reply.target_state
        ));
        kubectl.show_when(&created.namespace, &created.id, &reply.target_state);
        timings.insert(event.to_string(), json!(ms));
    }

    step("destroying the environment");
    let t = Instant::now();
    destroy(api, &created.id).await?;
    live.retain(|id| id != &created.id);
    say(&format!(
        "tasks, pods and services gone in {} ms",
        t.elapsed().as_millis()
    ));
    Ok(timings)
}

/// Another workflow's cycle: create, CONFIGURE, START, STOP, RESET, destroy. The failure step
/// is skipped: such a workflow gives no way to inject one.
async fn cycle_of(
    f: &Foreign,
    api: &mut Client,
    live: &mut Vec<String>,
    kubectl: &Kubectl,
) -> Result<serde_json::Value, String> {
    step(&format!(
        "creating a {} environment on {} ({} tasks rendered)",
        f.workflow,
        f.hosts.join(", "),
        f.tasks_count
    ));
    let t = Instant::now();
    let vars: Vec<(&str, &str)> = f
        .sets
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let created = create(api, live, "demo", &f.workflow, &vars).await?;
    say(&format!(
        "environment {} in namespace {}: {} tasks on {} nodes, ready in {} ms",
        created.id,
        created.namespace,
        created.tasks,
        created.nodes,
        t.elapsed().as_millis()
    ));
    if created.tasks as usize != f.tasks_count {
        return Err(format!(
            "the daemon created {} tasks, the render gives {}",
            created.tasks, f.tasks_count
        ));
    }
    kubectl.show_when(&created.namespace, &created.id, "STANDBY");
    let timings = run_cycle(api, live, kubectl, &created).await?;
    say("no failure step: this workflow gives no way to inject one");
    Ok(json!({
        "workflow": f.workflow,
        "nodes": created.nodes,
        "tasks": created.tasks,
        "transitions": timings,
    }))
}

fn describe_failures(reply: &pb::TransitionReply) -> String {
    if reply.failures.is_empty() {
        return reply.message.clone();
    }
    reply
        .failures
        .iter()
        .map(|f| format!("{} on {}: {}", f.task, f.node, f.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Writes a fresh random admin token to `path` (mode 600) and returns it.
fn write_token(path: &Path) -> Result<String, String> {
    use std::io::Write;
    // Two v4 UUIDs: 244 random bits from the system's generator.
    let token = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o600));
    }
    writeln!(f, "{token}").map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(token)
}

async fn connect_with_retry(
    addr: &str,
    token: &str,
    children: &mut Children,
) -> Result<Client, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match connect_to(addr, Some(token), None).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => {
                if let Some(dead) = children.first_dead() {
                    return Err(dead);
                }
                tokio::time::sleep(Duration::from_millis(250)).await
            }
        }
    }
}

pub(super) async fn create(
    api: &mut Client,
    live: &mut Vec<String>,
    id: &str,
    workflow: &str,
    vars: &[(&str, &str)],
) -> Result<pb::CreateEnvironmentReply, String> {
    live.push(id.to_string());
    let req = pb::CreateEnvironmentRequest {
        workflow: workflow.into(),
        variables: vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        env_id: id.into(),
        wait: true,
        ..Default::default()
    };
    let reply = api
        .create_environment(req)
        .await
        .map_err(|s| format!("creating environment {id}: {}", s.message()))?
        .into_inner();
    if !reply.failures.is_empty() {
        let names: Vec<String> = reply
            .failures
            .iter()
            .map(|f| format!("{}: {}", f.task, f.message))
            .collect();
        return Err(format!(
            "environment {id} did not reach STANDBY: {}",
            names.join("; ")
        ));
    }
    Ok(reply)
}

/// The plane the demo runs on: its STARTs take their run numbers from the same counter as
/// the daemon's o2control START_ACTIVITY (`bridge::run_numbers`), so that no two runs of
/// the plane share a number whichever API started them.
static PLANE: std::sync::OnceLock<kube::Client> = std::sync::OnceLock::new();

/// The next run number of the plane's counter.
async fn next_run_number() -> Result<String, String> {
    let client = PLANE.get().ok_or("the demo's client is not set up yet")?;
    envbridge::bridge::run_numbers::next(
        client,
        "envbridge-system",
        envbridge::bridge::run_numbers::DEFAULT_NAME,
    )
    .await
    .map(|n| n.to_string())
    .map_err(|e| format!("run number: {e}"))
}

/// A transition, waited for; a START takes the next run number.
pub(super) async fn transition(
    api: &mut Client,
    id: &str,
    event: &str,
    args: &[(&str, &str)],
) -> Result<pb::TransitionReply, String> {
    let mut arguments: std::collections::HashMap<String, String> = args
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if event == "START" && !arguments.contains_key("run_number") {
        arguments.insert("run_number".into(), next_run_number().await?);
    }
    let req = pb::TransitionRequest {
        id: id.into(),
        event: event.into(),
        arguments,
        wait: true,
        ..Default::default()
    };
    api.transition(req)
        .await
        .map(|r| r.into_inner())
        .map_err(|s| format!("{event} on {id}: {}", s.message()))
}

pub(super) async fn destroy(api: &mut Client, id: &str) -> Result<(), String> {
    let req = pb::DestroyEnvironmentRequest {
        id: id.into(),
        wait: true,
        ..Default::default()
    };
    let reply = api
        .destroy_environment(req)
        .await
        .map_err(|s| format!("destroying {id}: {}", s.message()))?
        .into_inner();
    if reply.gone {
        Ok(())
    } else {
        Err(format!("destroying {id}: {}", reply.message))
    }
}

/// The built kubectl, to show what `kubectl get environments,tasks` shows at each step.
pub(super) struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// Shows the table once the Environment's aggregated state is `state` (at most 3 s): the
    /// daemon answers from the tasks, and the operator writes the Environment's status a
    /// moment later (debounced), so the table agrees with the line printed above it.
    pub(super) fn show_when(&self, namespace: &str, name: &str, state: &str) {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let out = std::process::Command::new(&self.bin)
                .env("KUBECONFIG", &self.kubeconfig)
                .args(["get", "environment", name, "-n", namespace])
                .args(["-o", "jsonpath={.status.state}"])
                .output();
            let shown = out.map(|o| String::from_utf8_lossy(&o.stdout).trim() == state);
            if shown.unwrap_or(false) || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.show(namespace);
    }

    fn show(&self, namespace: &str) {
        let out = std::process::Command::new(&self.bin)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(["get", "environments,tasks", "-n", namespace])
            .output();
        println!("    $ kubectl get environments,tasks -n {namespace}");
        match out {
            Ok(o) => {
                for line in String::from_utf8_lossy(&o.stdout).lines() {
                    println!("    {line}");
                }
                for line in String::from_utf8_lossy(&o.stderr).lines() {
                    println!("    {line}");
                }
            }
            Err(e) => println!("    (kubectl: {e})"),
        }
    }
}

/// Child processes the demo started, each in its own process group with its own log, and
/// what it deployed in the cluster.
#[derive(Default)]
struct Children {
    running: Vec<(String, u32, PathBuf)>,
    deployed: Option<super::demo_cluster::Deployed>,
}

impl Children {
    fn spawn(
        &mut self,
        exe: &Path,
        name: &str,
        args: &[String],
        dir: &Path,
        kubeconfig: &str,
    ) -> Result<(), String> {
        let log = dir.join(format!("{name}.log"));
        let pid = process::spawn_with_env(exe, args, &log, dir, &[("KUBECONFIG", kubeconfig)])
            .map_err(|e| format!("starting {name}: {e}"))?;
        say(&format!("{name} started (pid {pid})"));
        self.running.push((name.to_string(), pid, log));
        Ok(())
    }

    /// A child that already exited, described with the end of its log.
    fn first_dead(&self) -> Option<String> {
        let exe = std::env::current_exe().ok()?;
        self.running
            .iter()
            .find(|(_, pid, _)| !process::alive(*pid, &exe))
            .map(|(name, _, log)| {
                format!(
                    "{name} exited early; end of {}:\n{}",
                    log.display(),
                    process::log_tail(log, 20)
                )
            })
    }

    fn stop(&mut self) {
        if let Some(d) = self.deployed.take() {
            d.remove();
        }
        let pids: Vec<u32> = self.running.iter().map(|(_, pid, _)| *pid).collect();
        let left = process::stop_groups(&pids, Duration::from_secs(10));
        for (name, pid, _) in self.running.drain(..) {
            if left.contains(&pid) {
                eprintln!("warning: {name} (pid {pid}) did not stop");
            } else {
                say(&format!("{name} stopped"));
            }
        }
    }
}

/// The simulated hosts of `--nodes N`: flp001 to flpN.
fn sim_hosts(n: u32) -> Vec<String> {
    (1..=n).map(|i| format!("flp{i:03}")).collect()
}

//! `envbridge dev sim-runner`: one task simulator per simulated pod of the local control plane.
//!
//! kwok runs no containers, so nothing would answer on a pod's control port. This watches the
//! envbridge-managed Pods and, for each Running pod with a loopback pod IP (a kwok node's
//! podCIDR lies in 127.0.0.0/8), runs `envbridge task-sim` on `<podIP>:$OCC_CONTROL_PORT` with
//! the pod's `ENVBRIDGE_SIM_*` environment, in fairmq mode when the pod says
//! `ENVBRIDGE_CONTROL_MODE=fairmq`. The simulator is stopped when the pod goes away. A
//! simulator that crashes (injected) stays down, as a process would without a kubelet; one
//! that could not bind its address is retried.
//!
//! `--fault-dir DIR` lets a test switch faults on and off at runtime, per pod `<ns>/<pod>`:
//! each simulator reads `DIR/<ns>_<pod>.faults` at every transition request (`--fault-file`:
//! lines `fail-on=EVENT`, `stuck-on=`, `hang-on=`, `crash-on=`, on top of the pod's
//! `ENVBRIDGE_SIM_*`), and listens on a free 127.0.0.1 port behind a proxy of this process
//! ([`super::sim_proxy`]) on the pod's control address, which forwards, stalls or cuts the
//! control connections as `DIR/<ns>_<pod>.proxy` says (`pass`, `stall`, `cut`). The proxy
//! stops with its simulator.

use std::collections::{HashMap, HashSet};
use std::io::IsTerminal;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::addressing::sim_upstream_ip;
use super::sim_proxy::{ProxyError, SimProxy};
use crate::control::sim::cli::{DEFAULT_CONTROL_PORT, EXIT_BIND_FAILED};
use crate::control::sim::{self, SimConfig, SimMode, Simulator};
use crate::signal::shutdown_signal;

/// Pods this runner simulates.
pub const DEFAULT_SELECTOR: &str = "app.kubernetes.io/managed-by=envbridge";
const RETRY_BIND: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(250);

#[derive(clap::Args, Debug, Clone)]
pub struct SimRunnerArgs {
    /// Kubeconfig of the local control plane (its server must be a loopback address).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Label selector of the pods to simulate.
    #[arg(long, default_value = DEFAULT_SELECTOR)]
    pub selector: String,
    /// Only pods of this namespace [default: all namespaces].
    #[arg(long)]
    pub namespace: Option<String>,
    /// The envbridge executable to run `task-sim` with [default: this executable].
    #[arg(long, hide = true)]
    pub sim_exe: Option<PathBuf>,
    /// Write each simulator's log to DIR/<namespace>_<pod>.log instead of this process's stderr.
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Run the simulators as tasks inside this process instead of one process each (for
    /// thousands of pods; an injected crash then stops only that simulator's listener).
    #[arg(long)]
    pub in_process: bool,
    /// Stand in for the processes of basic and hook tasks too: a running pod of such a task
    /// is ended with exit 0 (through the `envbridge.dev/sim-succeed` kwok stage), as a
    /// process that ran to completion.
    #[arg(long)]
    pub complete_tasks: bool,
    /// Runtime faults for tests: each simulator reads DIR/<namespace>_<pod>.faults at every
    /// transition request (lines fail-on=EVENT, stuck-on=EVENT, hang-on=EVENT, crash-on=EVENT),
    /// and a proxy on the pod's control address forwards its connections to the simulator on
    /// a loopback port, or stalls or cuts them, as DIR/<namespace>_<pod>.proxy says (pass,
    /// stall, cut).
    #[arg(long)]
    pub fault_dir: Option<PathBuf>,
}

/// `<namespace>_<pod>.<ext>`: a pod's file in the log and fault directories.
fn pod_file(pod: &str, ext: &str) -> String {
    format!("{}.{ext}", pod.replace('/', "_"))
}

/// Whether `pod` is a running basic or hook task on a simulated node that nothing has told
/// to end yet.
pub fn completes(pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let told = |l: &str| labels.is_some_and(|m| m.contains_key(l));
    if pod.metadata.deletion_timestamp.is_some()
        || on_real_node(pod)
        || told(super::stages::SIM_SUCCEED_LABEL)
        || told(super::stages::SIM_FAIL_LABEL)
    {
        return false;
    }
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    let mode = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "ENVBRIDGE_CONTROL_MODE")
        .and_then(|e| e.value.as_deref());
    running && matches!(mode, Some("basic" | "hook"))
}

/// A pod a real node's kubelet runs (its host-network address is the node's): its own
/// container answers and ends, nothing here stands in for it.
fn on_real_node(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok())
        .is_some_and(super::addressing::is_real_node_ip)
}

/// The simulator a pod calls for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimSpec {
    /// `<namespace>/<name>`, for logs and log file names.
    pub pod: String,
    pub addr: SocketAddr,
    pub mode: SimMode,
    /// The pod's `ENVBRIDGE_SIM_*` variables.
    pub env: Vec<(String, String)>,
}

/// What simulator `pod` needs now (None: none; not running, not on a simulated node, being
/// deleted, or a task with no control protocol).
pub fn desired(pod: &Pod) -> Option<SimSpec> {
    let meta = &pod.metadata;
    if meta.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    spec.node_name.as_ref()?;
    let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    // A real node's pods (its kubelet runs them) are not ours to stand in for.
    if !ip.is_loopback() || super::addressing::is_real_node_ip(ip) {
        return None;
    }
    let env: Vec<(String, String)> = spec
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect();
    let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let mode = match get("ENVBRIDGE_CONTROL_MODE")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("fairmq") => SimMode::Fairmq,
        Some("basic") | Some("hook") => return None,
        _ => SimMode::Direct,
    };
    let port = get("OCC_CONTROL_PORT")
        .and_then(|p| p.trim().parse::<u16>().ok())
        .unwrap_or(DEFAULT_CONTROL_PORT);
    Some(SimSpec {
        pod: format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ),
        addr: SocketAddr::new(ip, port),
        mode,
        env: env
            .into_iter()
            .filter(|(k, _)| k.starts_with("ENVBRIDGE_SIM_") && k != "ENVBRIDGE_SIM_MODE")
            .collect(),
    })
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("reading kubeconfig {path}: {message}")]
    Kubeconfig { path: PathBuf, message: String },
    #[error(
        "refusing to talk to {0}: the sim runner only serves a local control plane on a loopback address"
    )]
    NotLocal(String),
    #[error("kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

async fn client(path: &PathBuf) -> Result<Client, RunnerError> {
    let bad = |message: String| RunnerError::Kubeconfig {
        path: path.clone(),
        message,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| bad(e.to_string()))?;
    let host = config
        .cluster_url
        .host()
        .unwrap_or_default()
        .trim_matches(['[', ']']);
    let local = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !local {
        return Err(RunnerError::NotLocal(config.cluster_url.to_string()));
    }
    Ok(Client::try_from(config)?)
}

/// One running (or waiting) simulator.
struct Slot {
    spec: SimSpec,
    run: Run,
    /// Where the simulator listens: the pod's address, or a loopback port behind `proxy`.
    listen: SocketAddr,
    /// With --fault-dir: the proxy on the pod's address.
    proxy: Option<SimProxy>,
}

impl Slot {
    fn waiting(spec: &SimSpec, run: Run) -> Slot {
        Slot {
            spec: spec.clone(),
            run,
            listen: spec.addr,
            proxy: None,
        }
    }
}

enum Run {
    Process(Child),
    InProcess(tokio::task::JoinHandle<Result<(), sim::SimError>>),
    /// Could not bind; try again at this instant.
    RetryAt(Instant),
    /// Exited on its own (injected crash or failure): stays down.
    Down,
}

struct Runner {
    pods: Api<Pod>,
    args: SimRunnerArgs,
    slots: HashMap<String, Slot>,
    /// Pods seen during a relist (watch restart), to drop the ones that vanished meanwhile.
    relist: Option<HashSet<String>>,
    /// With --fault-dir, the next simulator's own address ([`sim_upstream_ip`]).
    next_upstream: AtomicU32,
}

impl Runner {
    fn uid(pod: &Pod) -> String {
        pod.metadata
            .uid
            .clone()
            .unwrap_or_else(|| format!("{:?}/{:?}", pod.metadata.namespace, pod.metadata.name))
    }

    async fn apply(&mut self, pod: &Pod) {
        if self.args.complete_tasks && completes(pod) {
            self.complete(pod).await;
        }
        let uid = Self::uid(pod);
        if let Some(seen) = self.relist.as_mut() {
            seen.insert(uid.clone());
        }
        match desired(pod) {
            None => self.stop(&uid).await,
            Some(spec) => {
                if self.slots.get(&uid).is_some_and(|s| s.spec == spec) {
                    return;
                }
                self.stop(&uid).await;
                let slot = self.start(&spec).await;
                self.slots.insert(uid, slot);
            }
        }
    }

    /// Ends a basic or hook task's pod with exit 0 (the kwok stage does it).
    async fn complete(&self, pod: &Pod) {
        let (Some(ns), Some(name)) = (
            pod.metadata.namespace.as_deref(),
            pod.metadata.name.as_deref(),
        ) else {
            return;
        };
        let api: Api<Pod> = Api::namespaced(self.pods.clone().into_client(), ns);
        let patch =
            serde_json::json!({"metadata": {"labels": {super::stages::SIM_SUCCEED_LABEL: "1"}}});
        match api
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => info!("{ns}/{name}: basic/hook task ends with exit 0"),
            Err(e) => warn!("{ns}/{name}: could not end the task's pod: {e}"),
        }
    }

    /// With --fault-dir, the fault file for `spec`'s simulator.
    fn fault_file(&self, spec: &SimSpec) -> Option<PathBuf> {
        let dir = self.args.fault_dir.as_ref()?;
        Some(dir.join(pod_file(&spec.pod, "faults")))
    }

    /// With --fault-dir, the proxy on the pod's address to the simulator on `upstream`
    /// (Err: what to do instead of starting the simulator).
    async fn proxy(&self, spec: &SimSpec, upstream: SocketAddr) -> Result<Option<SimProxy>, Run> {
        let Some(dir) = &self.args.fault_dir else {
            return Ok(None);
        };
        let control = dir.join(pod_file(&spec.pod, "proxy"));
        match SimProxy::start(spec.addr, upstream, control).await {
            Ok(p) => Ok(Some(p)),
            Err(e @ ProxyError::NotLoopback(_)) => {
                error!("sim runner: pod {}: {e}", spec.pod);
                Err(Run::Down)
            }
            Err(e) => {
                warn!(
                    "sim runner: {e} (pod {}); retrying in {RETRY_BIND:?}",
                    spec.pod
                );
                Err(Run::RetryAt(Instant::now() + RETRY_BIND))
            }
        }
    }

    async fn start(&self, spec: &SimSpec) -> Slot {
        if self.args.in_process {
            return self.start_in_process(spec).await;
        }
        let (listen, proxy) = if self.args.fault_dir.is_some() {
            // An address of its own, a port bound, read and closed there: the simulator
            // binds it next (else exits EXIT_BIND_FAILED and is retried). On a shared
            // 127.0.0.1 another simulator could take that port in between, and the proxy
            // would forward this pod's control connections to it.
            let ip = sim_upstream_ip(self.next_upstream.fetch_add(1, Ordering::Relaxed));
            let listen = match super::process::free_port_on(ip) {
                Ok(port) => SocketAddr::from((ip, port)),
                Err(e) => {
                    warn!("sim runner: pod {}: no free loopback port: {e}", spec.pod);
                    return Slot::waiting(spec, Run::RetryAt(Instant::now() + RETRY_BIND));
                }
            };
            match self.proxy(spec, listen).await {
                Ok(p) => (listen, p),
                Err(run) => return Slot::waiting(spec, run),
            }
        } else {
            (spec.addr, None)
        };
        let slot = |run: Run, proxy: Option<SimProxy>| Slot {
            spec: spec.clone(),
            run,
            listen,
            proxy,
        };
        let exe = match self
            .args
            .sim_exe
            .clone()
            .map(Ok)
            .unwrap_or_else(std::env::current_exe)
        {
            Ok(e) => e,
            Err(e) => {
                error!("sim runner: cannot find its own executable: {e}");
                return slot(Run::Down, None);
            }
        };
        let mut cmd = Command::new(exe);
        cmd.arg("task-sim")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--mode")
            .arg(spec.mode.to_string())
            .arg("--parent-pid")
            .arg(std::process::id().to_string());
        if let Some(f) = self.fault_file(spec) {
            cmd.arg("--fault-file").arg(f);
        }
        for (k, _) in std::env::vars() {
            if k.starts_with("ENVBRIDGE_SIM_") || k == "OCC_CONTROL_PORT" {
                cmd.env_remove(k);
            }
        }
        cmd.envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        if let Some(dir) = &self.args.log_dir {
            let file = dir.join(pod_file(&spec.pod, "log"));
            match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)
            {
                Ok(f) => {
                    cmd.stderr(f);
                }
                Err(e) => warn!("sim runner: cannot write {}: {e}", file.display()),
            }
        }
        match cmd.spawn() {
            Ok(child) => {
                info!(
                    "sim runner: started task simulator for pod {} on {}{} ({}), pid {}",
                    spec.pod,
                    spec.addr,
                    through(&proxy, listen),
                    spec.mode,
                    child.id().unwrap_or(0)
                );
                slot(Run::Process(child), proxy)
            }
            Err(e) => {
                error!(
                    "sim runner: cannot start task simulator for pod {}: {e}",
                    spec.pod
                );
                slot(Run::RetryAt(Instant::now() + RETRY_BIND), None)
            }
        }
    }

    async fn start_in_process(&self, spec: &SimSpec) -> Slot {
        let get = |k: &str| -> Vec<String> {
            spec.env
                .iter()
                .filter(|(n, _)| n == k)
                .flat_map(|(_, v)| v.split(',').map(str::to_string).collect::<Vec<_>>())
                .collect()
        };
        let config = match SimConfig::parse(
            spec.mode,
            &get("ENVBRIDGE_SIM_DELAY"),
            &get("ENVBRIDGE_SIM_FAIL_ON"),
            &get("ENVBRIDGE_SIM_CRASH_ON"),
            &get("ENVBRIDGE_SIM_HANG_ON"),
            &get("ENVBRIDGE_SIM_STUCK_ON"),
        )
        .and_then(|c| c.with_fail_in(&get("ENVBRIDGE_SIM_FAIL_IN")))
        {
            Ok(c) => SimConfig {
                fault_file: self.fault_file(spec),
                ..c
            },
            Err(e) => {
                error!("sim runner: pod {}: {e}", spec.pod);
                return Slot::waiting(spec, Run::Down);
            }
        };
        // Behind the fault proxy, on a port of its own (bound here: no race for it).
        let at = if self.args.fault_dir.is_some() {
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
        } else {
            spec.addr
        };
        let listener = match sim::bind(at, false).await {
            Ok(l) => l,
            Err(e) => {
                warn!("sim runner: pod {}: {e}; retrying", spec.pod);
                return Slot::waiting(spec, Run::RetryAt(Instant::now() + RETRY_BIND));
            }
        };
        let listen = listener.local_addr().unwrap_or(at);
        let proxy = match self.proxy(spec, listen).await {
            Ok(p) => p,
            Err(run) => return Slot::waiting(spec, run),
        };
        info!(
            "sim runner: started in-process task simulator for pod {} on {}{} ({})",
            spec.pod,
            spec.addr,
            through(&proxy, listen),
            spec.mode
        );
        let sim = Simulator::new(config);
        Slot {
            spec: spec.clone(),
            run: Run::InProcess(tokio::spawn(sim::serve(
                listener,
                sim,
                std::future::pending(),
            ))),
            listen,
            proxy,
        }
    }

    async fn stop(&mut self, uid: &str) {
        let Some(slot) = self.slots.remove(uid) else {
            return;
        };
        if let Some(proxy) = slot.proxy {
            proxy.stop().await;
        }
        match slot.run {
            Run::Process(mut child) => {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
                info!(
                    "sim runner: stopped task simulator for pod {}",
                    slot.spec.pod
                );
            }
            Run::InProcess(task) => {
                task.abort();
                info!(
                    "sim runner: stopped task simulator for pod {}",
                    slot.spec.pod
                );
            }
            Run::RetryAt(_) | Run::Down => {}
        }
    }

    /// Reaps exited simulators and retries the ones that could not bind.
    async fn tick(&mut self) {
        let now = Instant::now();
        let mut restart = Vec::new();
        for (uid, slot) in self.slots.iter_mut() {
            match &mut slot.run {
                Run::Process(child) => match child.try_wait() {
                    Ok(Some(status)) if status.code() == Some(i32::from(EXIT_BIND_FAILED)) => {
                        warn!(
                            "sim runner: {} is taken (pod {}); retrying in {RETRY_BIND:?}",
                            slot.listen, slot.spec.pod
                        );
                        slot.run = Run::RetryAt(now + RETRY_BIND);
                        // Started again with the simulator (on another port).
                        slot.proxy = None;
                    }
                    Ok(Some(status)) => {
                        warn!(
                            "sim runner: task simulator for pod {} exited ({status}); it stays down",
                            slot.spec.pod
                        );
                        slot.run = Run::Down;
                        // Nothing answers on the pod's address any more, as without a proxy.
                        slot.proxy = None;
                    }
                    Ok(None) => {}
                    Err(e) => warn!("sim runner: pod {}: {e}", slot.spec.pod),
                },
                Run::InProcess(task) if task.is_finished() => {
                    warn!(
                        "sim runner: in-process task simulator for pod {} stopped; it stays down",
                        slot.spec.pod
                    );
                    slot.run = Run::Down;
                    slot.proxy = None;
                }
                Run::RetryAt(at) if *at <= now => restart.push(uid.clone()),
                _ => {}
            }
        }
        for uid in restart {
            if let Some(spec) = self.slots.get(&uid).map(|s| s.spec.clone()) {
                let slot = self.start(&spec).await;
                self.slots.insert(uid, slot);
            }
        }
    }

    async fn handle(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.relist = Some(HashSet::new()),
            Event::InitApply(pod) | Event::Apply(pod) => self.apply(&pod).await,
            Event::Delete(pod) => self.stop(&Self::uid(&pod)).await,
            Event::InitDone => {
                if let Some(seen) = self.relist.take() {
                    let gone: Vec<String> = self
                        .slots
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for uid in gone {
                        self.stop(&uid).await;
                    }
                }
            }
        }
    }

    async fn stop_all(&mut self) {
        let uids: Vec<String> = self.slots.keys().cloned().collect();
        for uid in uids {
            self.stop(&uid).await;
        }
    }
}

/// For the start log: where the simulator listens when a proxy stands in front of it.
fn through(proxy: &Option<SimProxy>, listen: SocketAddr) -> String {
    match proxy {
        Some(_) => format!(" through its fault proxy (simulator on {listen})"),
        None => String::new(),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

pub fn run(args: SimRunnerArgs) -> ExitCode {
    init_logging();
    crate::launch::runtime::block_on(None, async move {
        serve(args, shutdown_signal())
            .await
            .map(|()| ExitCode::SUCCESS)
            .map_err(|e| format!("sim runner: {e}"))
    })
}

/// Runs until `shutdown` resolves (the command: SIGTERM/SIGINT), then stops every simulator
/// it started.
pub async fn serve(
    args: SimRunnerArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunnerError> {
    for (dir, what) in [(&args.log_dir, "log dir"), (&args.fault_dir, "fault dir")] {
        if let Some(dir) = dir
            && let Err(e) = std::fs::create_dir_all(dir)
        {
            return Err(RunnerError::Kubeconfig {
                path: dir.clone(),
                message: format!("cannot create {what}: {e}"),
            });
        }
    }
    let client = client(&args.kubeconfig).await?;
    let pods: Api<Pod> = match &args.namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let wc = watcher::Config::default().labels(&args.selector);
    let watch =
        watcher::watcher(pods.clone(), wc).backoff(crate::launch::watch_backoff::watch_backoff());
    // The watch is read by a task of its own, so that a burst of pod events leaves the
    // connection at once, whatever starting simulators takes meanwhile: a watcher that falls
    // behind is cut off by the apiserver as unresponsive and resumes from where it was.
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut watch = watch.boxed();
        while let Some(ev) = watch.next().await {
            if tx.send(ev).is_err() {
                return;
            }
        }
    });
    let stop = Arc::new(tokio::sync::Notify::new());
    let stop2 = stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        stop2.notify_one();
    });
    info!(
        "sim runner watching pods ({}) for task simulators{}{}",
        args.selector,
        if args.in_process { ", in process" } else { "" },
        args.fault_dir
            .as_ref()
            .map(|d| format!(", runtime faults in {}", d.display()))
            .unwrap_or_default()
    );
    let mut runner = Runner {
        pods: pods.clone(),
        args,
        slots: HashMap::new(),
        relist: None,
        // Two runners on one machine start far apart.
        next_upstream: AtomicU32::new(std::process::id().wrapping_mul(2_654_435_761)),
    };
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(Ok(ev)) => runner.handle(ev).await,
                // The backoff wrapper retries; report and carry on.
                Some(Err(e)) => warn!("sim runner: pod watch error (retrying): {e}"),
                None => {
                    warn!("sim runner: pod watch ended");
                    break;
                }
            },
            _ = tick.tick() => runner.tick().await,
            _ = stop.notified() => {
                info!("sim runner stopping on signal");
                break;
            }
        }
    }
    reader.abort();
    runner.stop_all().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, PodStatus};

    fn pod(ip: &str, phase: &str, env: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("flp001-readout".into()),
                namespace: Some("env-a".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("flp001.cluster.local".into()),
                containers: vec![Container {
                    name: "task".into(),
                    env: Some(
                        env.iter()
                            .map(|(k, v)| EnvVar {
                                name: k.to_string(),
                                value: Some(v.to_string()),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                pod_ip: Some(ip.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn real_nodes_pods_are_left_to_their_kubelet() {
        let direct = pod("127.3.0.1", "Running", &[("OCC_CONTROL_PORT", "47101")]);
        assert_eq!(desired(&direct), None);
        let hook = pod(
            "127.3.0.1",
            "Running",
            &[("ENVBRIDGE_CONTROL_MODE", "hook")],
        );
        assert!(!completes(&hook));
    }

    #[test]
    fn running_basic_and_hook_pods_are_completed_once() {
        let hook = pod(
            "127.1.0.5",
            "Running",
            &[("ENVBRIDGE_CONTROL_MODE", "hook")],
        );
        assert!(completes(&hook));
        assert!(completes(&pod(
            "127.1.0.5",
            "Running",
            &[("ENVBRIDGE_CONTROL_MODE", "basic")]
        )));
        assert!(!completes(&pod(
            "127.1.0.5",
            "Pending",
            &[("ENVBRIDGE_CONTROL_MODE", "hook")]
        )));
        assert!(!completes(&pod(
            "127.1.0.5",
            "Running",
            &[("ENVBRIDGE_CONTROL_MODE", "fairmq")]
        )));
        let mut told = hook.clone();
        told.metadata.labels = Some(
            [(
                crate::dev::stages::SIM_SUCCEED_LABEL.to_string(),
                "1".to_string(),
            )]
            .into(),
        );
        assert!(!completes(&told), "already told to end");
    }

    #[test]
    fn running_loopback_pod_gets_a_simulator_on_its_control_port() {
        let p = pod(
            "127.1.0.5",
            "Running",
            &[
                ("OCC_CONTROL_PORT", "47123"),
                ("ENVBRIDGE_CONTROL_MODE", "fairmq"),
                ("ENVBRIDGE_SIM_FAIL_ON", "CONFIGURE"),
                ("O2_ROLE", "flp001"),
            ],
        );
        let s = desired(&p).unwrap();
        assert_eq!(s.addr, "127.1.0.5:47123".parse().unwrap());
        assert_eq!(s.mode, SimMode::Fairmq);
        assert_eq!(s.pod, "env-a/flp001-readout");
        assert_eq!(
            s.env,
            vec![("ENVBRIDGE_SIM_FAIL_ON".into(), "CONFIGURE".into())]
        );
    }

    #[test]
    fn other_pods_get_none() {
        assert_eq!(desired(&pod("127.1.0.5", "Pending", &[])), None);
        // Never anything outside loopback: the runner must not listen on real addresses.
        assert_eq!(desired(&pod("10.0.0.5", "Running", &[])), None);
        assert_eq!(
            desired(&pod(
                "127.1.0.5",
                "Running",
                &[("ENVBRIDGE_CONTROL_MODE", "basic")]
            )),
            None
        );
        let mut deleting = pod("127.1.0.5", "Running", &[]);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-11-30T11:00:00Z".parse().unwrap(),
            ));
        assert_eq!(desired(&deleting), None);
        let d = desired(&pod("127.1.0.5", "Running", &[])).unwrap();
        assert_eq!(d.addr.port(), DEFAULT_CONTROL_PORT);
        assert_eq!(d.mode, SimMode::Direct);
    }
}

//! Bringing the whole control plane up and down: etcd, kube-apiserver,
//! kube-controller-manager and kwok, all on 127.0.0.1, recorded in the state directory.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::addressing;
use super::binaries::{self, Binaries};
use super::error::{DevError, IoContext, Result};
use super::kubeconfig;
use super::nodes;
use super::paths;
use super::pki;
use super::process::{self, died};
use super::realnode::{self, RealNodeState};
use super::stages;
use super::state::{self, Component, PlaneState};

#[cfg(feature = "test-support")]
mod apiserver_restart;
mod kwok;
#[cfg(feature = "test-support")]
mod node_ready;
#[cfg(feature = "test-support")]
mod restart;
#[cfg(feature = "test-support")]
pub use apiserver_restart::{start_apiserver, stop_apiserver};
#[cfg(feature = "test-support")]
pub use node_ready::set_node_ready;
#[cfg(feature = "test-support")]
pub use restart::{kill_component, restart_component};

/// What a caller needs to talk to the running control plane.
#[derive(Debug, Clone)]
pub struct ClusterInfo {
    /// Absolute path of the admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// https://127.0.0.1:<port>
    pub server: String,
    /// Number of simulated nodes (flp001 .. flpNNN).
    pub nodes: u32,
    /// Host names of the real nodes (real001 ...), each a kubelet and a containerd.
    pub real_hosts: Vec<String>,
    pub state_dir: PathBuf,
    pub kubectl: PathBuf,
    /// Whether kube-apiserver serves Pod watches from its watch cache (off: from etcd).
    pub pod_watch_cache: bool,
    /// Whether kwok reaches the apiserver through a watch relay.
    pub kwok_relay: bool,
}

impl ClusterInfo {
    /// kube-apiserver's log (which watchers it cut off: `dev::cut_watchers`).
    pub fn apiserver_log(&self) -> PathBuf {
        log_of(&self.state_dir, APISERVER)
    }
}

/// Controllers run by kube-controller-manager: what namespaces, owner references, Jobs,
/// ReplicaSets and node health need; nothing that evicts pods or allocates CIDRs. Not the
/// EndpointSlice controller: every pod address here is loopback, which EndpointSlice
/// validation rejects, so it could only retry every Service's slice for ever (a 422 and an
/// Event each time: at 10,000 tasks a third of a core, and bursts of more, that a site's
/// cluster, whose writes succeed once, never pays).
const CONTROLLERS: &str = "namespace-controller,garbage-collector-controller,\
serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller,\
clusterrole-aggregation-controller,node-lifecycle-controller,pod-garbage-collector-controller,\
job-controller,replicaset-controller,deployment-controller,statefulset-controller,\
ttl-after-finished-controller";

/// kube-apiserver serves Pod watches straight from etcd. With its watch cache, a watcher
/// whose buffer is full is cut off and sent everything since again: kwok, one reader of
/// every pod event for all simulated nodes (a site has a kubelet a node), falls behind a
/// burst of 10,000 pods and is cut off, and which side of a benchmark pays for it is chance
/// (docs/benchmarks.md, "The pod watch cache off"). Through etcd a slow reader is slowed,
/// not cut off, unless it falls behind the apiserver's etcd compaction: see [`LONG_COMPACTION`].
const NO_POD_WATCH_CACHE: &str = "--watch-cache-sizes=pods#0";

/// With Pod watches from etcd, no bookmark keeps a quiet watcher's revision fresh: kwok's
/// pod watch, idle through the transitions (no pod writes) and resumed after its watch
/// timeout, resumes from a revision the default 5-minute compaction has removed, lists every
/// pod again and writes their status again. An hour is longer than any benchmark step; etcd
/// holds an hour of history meanwhile (its quota is 8 GiB).
const LONG_COMPACTION: &str = "--etcd-compaction-interval=1h";

/// The apiserver's component name (its log: `kube-apiserver.log`).
const APISERVER: &str = "kube-apiserver";
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a started process (etcd, the watch relay) may take to open its port.
const STARTED_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_GRACE: Duration = Duration::from_secs(10);

fn info_of(st: &PlaneState, dir: &Path) -> ClusterInfo {
    ClusterInfo {
        kubeconfig: st.kubeconfig.clone(),
        server: format!("https://127.0.0.1:{}", st.apiserver_port),
        nodes: st.nodes,
        real_hosts: st.real_nodes.iter().map(|n| n.host.clone()).collect(),
        state_dir: dir.to_path_buf(),
        kubectl: Binaries::in_dir(&st.bin_dir).kubectl,
        pod_watch_cache: !st
            .apiserver_extra_args
            .iter()
            .any(|a| a == NO_POD_WATCH_CACHE),
        kwok_relay: st.kwok_relay,
    }
}

/// A kube client for the kubeconfig at `path`.
pub async fn client_for(path: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(path).map_err(|e| DevError::Kubeconfig(e.to_string()))?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| DevError::Kubeconfig(e.to_string()))?;
    cfg.connect_timeout = Some(Duration::from_secs(5));
    Ok(Client::try_from(cfg)?)
}

async fn readyz(client: &Client) -> Result<String> {
    let req = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| DevError::NotReady(e.to_string()))?;
    Ok(client.request_text(req).await?)
}

/// Take the lock (blocking) that serialises up and down of the plane in `dir`.
fn lock(dir: &Path) -> Result<std::fs::File> {
    let path = paths::lock_file_for(dir);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).ctx("creating", parent)?;
    }
    let f = std::fs::File::create(&path).ctx("creating the lock file", &path)?;
    f.lock().ctx("locking", &path)?;
    Ok(f)
}

async fn lock_async(dir: &Path) -> Result<std::fs::File> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || lock(&dir))
        .await
        .map_err(|e| DevError::Invalid(format!("lock task failed: {e}")))?
}

/// The components a whole plane records: etcd, kube-apiserver, kube-controller-manager and
/// each kwok shard.
fn component_count(st: &PlaneState) -> usize {
    3 + st.kwok_shards.max(1) as usize + usize::from(st.kwok_relay)
}

fn all_alive(st: &PlaneState) -> bool {
    st.components.len() == component_count(st)
        && st
            .components
            .iter()
            .all(|c| process::alive(c.pid, &c.binary))
}

fn stop_components(st: &PlaneState) {
    // Real nodes first: a kubelet whose apiserver is gone retries for ever, and the
    // containers must end before their containerd.
    for n in &st.real_nodes {
        realnode::stop(n);
        eprintln!("envbridge: stopped real node {}", n.name);
    }
    // Only groups whose leader still runs our binary: a recorded pid may have been reused.
    let live: Vec<&Component> = st
        .components
        .iter()
        .filter(|c| process::alive(c.pid, &c.binary))
        .collect();
    if live.is_empty() {
        return;
    }
    let t0 = Instant::now();
    // Two waves: the API clients and the apiserver together, then etcd (an apiserver whose
    // etcd is gone hangs in its shutdown until SIGKILL).
    let (storage, rest): (Vec<&Component>, Vec<&Component>) =
        live.iter().partition(|c| c.name == "etcd");
    for wave in [rest, storage] {
        let pids: Vec<u32> = wave.iter().map(|c| c.pid).collect();
        let killed = process::stop_groups(&pids, STOP_GRACE);
        for c in &wave {
            let how = if killed.contains(&c.pid) {
                " with SIGKILL"
            } else {
                ""
            };
            eprintln!("envbridge: stopped {} (pid {}){how}", c.name, c.pid);
        }
    }
    eprintln!("envbridge: all stopped in {:.1?}", t0.elapsed());
}

/// Start the control plane with at least `nodes` simulated nodes, or reuse the running one
/// (adding nodes if it has fewer). Safe to call from many processes at once.
pub async fn ensure_up(nodes: u32) -> Result<ClusterInfo> {
    ensure_up_in(&paths::state_dir(), nodes, &[]).await
}

/// What `dev up` brings up.
#[derive(Debug, Clone, Default)]
pub struct UpSpec {
    /// Simulated (kwok) nodes, at least.
    pub nodes: u32,
    /// Real nodes (a kubelet and a containerd each), at least; 0 leaves those running alone.
    pub real_nodes: u32,
    /// The envbridge executable whose images real nodes run [default: this executable].
    pub exe: Option<PathBuf>,
    /// kwok processes sharing the simulated nodes, for a plane started now [default: one; at
    /// most one a node]; a running plane keeps its own.
    pub kwok_shards: Option<u32>,
    /// Pod watches served from etcd, not from kube-apiserver's watch cache, for a plane
    /// started now; a running plane keeps its own.
    pub no_pod_watch_cache: bool,
    /// kwok reaches the apiserver through a watch relay (`dev watch-relay`, run from `exe`)
    /// that holds what kwok has not read yet, for a plane started now; a running plane
    /// keeps its own.
    pub kwok_relay: bool,
}

/// [`ensure_up`] with real nodes too (the default plane).
pub async fn ensure_up_with(spec: &UpSpec) -> Result<ClusterInfo> {
    ensure_up_in_with(&paths::state_dir(), spec, &[]).await
}

/// [`ensure_up`] for the plane whose state lives in `dir` (a private plane: its own
/// processes and free loopback ports, its lock `<dir>.lock` beside it), kube-apiserver
/// started with `apiserver_extra_args` appended (later flags win). A running plane there is
/// reused as it is.
pub async fn ensure_up_in(
    dir: &Path,
    nodes: u32,
    apiserver_extra_args: &[String],
) -> Result<ClusterInfo> {
    let spec = UpSpec {
        nodes,
        ..Default::default()
    };
    ensure_up_in_with(dir, &spec, apiserver_extra_args).await
}

/// [`ensure_up_in`] with real nodes too: a private plane's real nodes have addresses and
/// cgroups of their own (its block, from `dir`).
pub async fn ensure_up_in_with(
    dir: &Path,
    spec: &UpSpec,
    apiserver_extra_args: &[String],
) -> Result<ClusterInfo> {
    let nodes = spec.nodes;
    if nodes == 0 || nodes > addressing::MAX_NODES {
        return Err(DevError::Invalid(format!(
            "--nodes must be within 1..={}",
            addressing::MAX_NODES
        )));
    }
    let _lock = lock_async(dir).await?;
    if let Some(mut st) = state::load(dir)? {
        if all_alive(&st) {
            let client = client_for(&st.kubeconfig).await?;
            if readyz(&client).await.is_ok() {
                nodes::ensure_nodes(&client, nodes, st.kwok_shards).await?;
                nodes::wait_ready(&client, nodes, READY_TIMEOUT, || Ok(())).await?;
                if nodes > st.nodes {
                    st.nodes = nodes;
                    state::save(dir, &st)?;
                }
                ensure_real_nodes(&client, dir, &mut st, spec).await?;
                return Ok(info_of(&st, dir));
            }
        }
        eprintln!("envbridge: the recorded control plane is not healthy; restarting it");
        stop_components(&st);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).ctx("removing the old state", dir)?;
    }
    let bins = tokio::task::spawn_blocking(binaries::ensure_built)
        .await
        .map_err(|e| DevError::Build(format!("build task failed: {e}")))??;
    let kwok_shards = spec
        .kwok_shards
        .unwrap_or(kwok::DEFAULT_SHARDS)
        .clamp(1, nodes);
    let extra = extra_apiserver_args(spec, apiserver_extra_args);
    let relay = match (spec.kwok_relay, &spec.exe) {
        (false, _) => None,
        (true, Some(exe)) => Some(exe.clone()),
        (true, None) => Some(std::env::current_exe().ctx("locating", "the envbridge executable")?),
    };
    let info = start(&bins, dir, nodes, kwok_shards, &extra, relay.as_deref()).await?;
    if spec.real_nodes == 0 {
        return Ok(info);
    }
    let mut st = state::load(dir)?.ok_or_else(|| {
        DevError::NotReady(format!(
            "{} vanished after start",
            dir.join(state::FILE).display()
        ))
    })?;
    let client = client_for(&st.kubeconfig).await?;
    ensure_real_nodes(&client, dir, &mut st, spec).await?;
    Ok(info_of(&st, dir))
}

/// The flags a plane started for `spec` appends to kube-apiserver's: the spec's first, so
/// that the caller's `given` ones win.
fn extra_apiserver_args(spec: &UpSpec, given: &[String]) -> Vec<String> {
    let mut extra = Vec::new();
    if spec.no_pod_watch_cache {
        extra.push(NO_POD_WATCH_CACHE.to_string());
        extra.push(LONG_COMPACTION.to_string());
    }
    extra.extend(given.iter().cloned());
    extra
}

/// Start the real nodes `spec` asks for that do not run, recording each in state.json.
async fn ensure_real_nodes(
    client: &Client,
    dir: &Path,
    st: &mut PlaneState,
    spec: &UpSpec,
) -> Result<()> {
    if spec.real_nodes == 0 {
        return Ok(());
    }
    let exe = match &spec.exe {
        Some(e) => e.clone(),
        None => std::env::current_exe().ctx("locating", "the envbridge executable")?,
    };
    let access = realnode::PlaneAccess {
        dir,
        server: format!("https://127.0.0.1:{}", st.apiserver_port),
        apiserver_port: st.apiserver_port,
        pki: pki::files(&dir.join("pki")),
        exe: &exe,
    };
    let running = st.real_nodes.clone();
    let base = st.clone();
    let nodes = realnode::ensure(
        client,
        &access,
        &running,
        spec.real_nodes,
        |now: &[RealNodeState]| {
            let mut saved = base.clone();
            saved.real_nodes = now.to_vec();
            state::save(dir, &saved)
        },
    )
    .await?;
    st.real_nodes = nodes;
    state::save(dir, st)
}

async fn start(
    bins: &Binaries,
    dir: &Path,
    nodes: u32,
    kwok_shards: u32,
    apiserver_extra_args: &[String],
    relay: Option<&Path>,
) -> Result<ClusterInfo> {
    let started = Instant::now();
    std::fs::create_dir_all(dir).ctx("creating the state directory", dir)?;
    let pki = pki::write(&pki::generate()?, &dir.join("pki"))?;
    let kubeconfig_path = dir.join("kubeconfig");
    let etcd_client_port = process::free_port()?;
    let mut etcd_peer_port = process::free_port()?;
    while etcd_peer_port == etcd_client_port {
        etcd_peer_port = process::free_port()?;
    }
    let mut apiserver_port = process::free_port()?;
    while apiserver_port == etcd_client_port || apiserver_port == etcd_peer_port {
        apiserver_port = process::free_port()?;
    }
    let server = format!("https://127.0.0.1:{apiserver_port}");
    std::fs::write(
        &kubeconfig_path,
        kubeconfig::render(&server, &pki.ca_cert, &pki.admin_cert, &pki.admin_key),
    )
    .ctx("writing", &kubeconfig_path)?;
    let kwok_config = dir.join("kwok.yaml");
    std::fs::write(&kwok_config, stages::kwok_config()).ctx("writing", &kwok_config)?;

    let mut st = PlaneState {
        versions: binaries::KEY.to_string(),
        bin_dir: bins.dir.clone(),
        apiserver_port,
        etcd_client_port,
        etcd_peer_port,
        kubeconfig: kubeconfig_path,
        nodes: 0,
        kwok_shards,
        kwok_relay: relay.is_some(),
        components: Vec::new(),
        apiserver_extra_args: apiserver_extra_args.to_vec(),
        real_nodes: Vec::new(),
    };
    let result = start_components(bins, dir, &pki, &mut st, nodes, relay).await;
    match result {
        Ok(()) => {
            eprintln!(
                "envbridge: control plane ready with {nodes} node(s) in {:.1?}",
                started.elapsed()
            );
            Ok(info_of(&st, dir))
        }
        Err(e) => {
            eprintln!(
                "envbridge: start failed, stopping what was started (logs kept in {})",
                dir.display()
            );
            stop_components(&st);
            let _ = std::fs::remove_file(dir.join(state::FILE));
            Err(e)
        }
    }
}

fn s<T: std::fmt::Display>(v: T) -> String {
    v.to_string()
}

fn launch(
    name: &str,
    binary: &Path,
    args: Vec<String>,
    dir: &Path,
    st: &mut PlaneState,
) -> Result<Component> {
    launch_with_env(name, binary, args, &[], dir, st)
}

/// Where the component `name` of the plane in `dir` logs.
fn log_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.log"))
}

fn launch_with_env(
    name: &str,
    binary: &Path,
    args: Vec<String>,
    env: &[(&str, &str)],
    dir: &Path,
    st: &mut PlaneState,
) -> Result<Component> {
    let log = log_of(dir, name);
    eprintln!("envbridge: starting {name}");
    let pid = process::spawn_with_env(binary, &args, &log, dir, env)?;
    let c = Component {
        name: name.to_string(),
        pid,
        binary: std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_path_buf()),
        log,
    };
    st.components.push(c.clone());
    state::save(dir, st)?;
    Ok(c)
}

/// kube-apiserver's flags: the recorded ports and PKI, then the plane's extra flags.
fn apiserver_args(dir: &Path, st: &PlaneState, pki: &pki::PkiFiles) -> Vec<String> {
    let etcd_url = format!("http://127.0.0.1:{}", st.etcd_client_port);
    let mut args = vec![
        format!("--etcd-servers={etcd_url}"),
        s("--bind-address=127.0.0.1"),
        s("--advertise-address=127.0.0.1"),
        format!("--secure-port={}", st.apiserver_port),
        format!("--cert-dir={}", dir.join("apiserver-certs").display()),
        format!("--tls-cert-file={}", pki.serving_cert.display()),
        format!("--tls-private-key-file={}", pki.serving_key.display()),
        format!("--client-ca-file={}", pki.ca_cert.display()),
        // Real nodes join as system:node:<name>: the Node authorizer and NodeRestriction
        // confine each kubelet to its own Node and pods. The apiserver calls kubelets with
        // a client certificate of its own and checks theirs against the plane's CA.
        s("--authorization-mode=Node,RBAC"),
        s("--enable-admission-plugins=NodeRestriction"),
        format!(
            "--kubelet-client-certificate={}",
            pki.kubelet_client_cert.display()
        ),
        format!("--kubelet-client-key={}", pki.kubelet_client_key.display()),
        format!("--kubelet-certificate-authority={}", pki.ca_cert.display()),
        s("--service-account-issuer=https://kubernetes.default.svc"),
        format!("--service-account-key-file={}", pki.sa_pub.display()),
        format!(
            "--service-account-signing-key-file={}",
            pki.sa_key.display()
        ),
        format!("--service-cluster-ip-range={}", addressing::SERVICE_CIDR),
        s("--allow-privileged=true"),
        s("--disable-admission-plugins=ServiceAccount"),
        // The kubernetes Service's endpoints would be 127.0.0.1, which validation rejects.
        s("--endpoint-reconciler-type=none"),
        s("--max-requests-inflight=2000"),
        s("--max-mutating-requests-inflight=1000"),
        s("--profiling=false"),
        // Each watcher cut off as unresponsive is logged with its key, labels and fields
        // (the metric counts them by resource only): which one fell behind, in
        // `kube-apiserver.log` (see `dev::cut_watchers`).
        s("--vmodule=cache_watcher=1"),
        // pods/log and exec dial the node by its InternalIP (loopback here); the default
        // order tries the Hostname first, which would send a DNS query off this machine.
        s("--kubelet-preferred-address-types=InternalIP"),
    ];
    args.extend(st.apiserver_extra_args.iter().cloned());
    args
}

/// Waits for /readyz, failing early (with the log tail) when the apiserver or etcd exits.
async fn wait_apiserver_ready(
    client: &Client,
    apiserver: &Component,
    etcd: &Component,
) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match readyz(client).await {
            Ok(_) => return Ok(()),
            Err(e) => {
                if !process::alive(apiserver.pid, &apiserver.binary) {
                    return Err(died(apiserver, "exited"));
                }
                if !process::alive(etcd.pid, &etcd.binary) {
                    return Err(died(etcd, "exited"));
                }
                if Instant::now() > deadline {
                    return Err(died(apiserver, &format!("/readyz not ok: {e}")));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn start_components(
    bins: &Binaries,
    dir: &Path,
    pki: &pki::PkiFiles,
    st: &mut PlaneState,
    nodes: u32,
    relay: Option<&Path>,
) -> Result<()> {
    let etcd_url = format!("http://127.0.0.1:{}", st.etcd_client_port);
    let peer_url = format!("http://127.0.0.1:{}", st.etcd_peer_port);
    let etcd = launch(
        "etcd",
        &bins.etcd,
        vec![
            s("--name=envbridge"),
            format!("--data-dir={}", dir.join("etcd-data").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=envbridge={peer_url}"),
            s("--unsafe-no-fsync=true"),
            s("--quota-backend-bytes=8589934592"),
            s("--log-level=warn"),
        ],
        dir,
        st,
    )?;
    let port = st.etcd_client_port;
    process::wait_started(&etcd, "client port", STARTED_TIMEOUT, || {
        process::port_open(port)
    })
    .await?;

    let apiserver = launch(
        APISERVER,
        &bins.apiserver,
        apiserver_args(dir, st, pki),
        dir,
        st,
    )?;
    let client = client_for(&st.kubeconfig).await?;
    wait_apiserver_ready(&client, &apiserver, &etcd).await?;
    eprintln!(
        "envbridge: kube-apiserver ready at https://127.0.0.1:{}",
        st.apiserver_port
    );

    let kubeconfig_arg = format!("--kubeconfig={}", st.kubeconfig.display());
    let kcm = launch(
        "kube-controller-manager",
        &bins.controller_manager,
        vec![
            kubeconfig_arg,
            s("--bind-address=127.0.0.1"),
            s("--secure-port=0"),
            format!("--root-ca-file={}", pki.ca_cert.display()),
            format!(
                "--service-account-private-key-file={}",
                pki.sa_key.display()
            ),
            s("--leader-elect=false"),
            s("--use-service-account-credentials=false"),
            format!("--controllers={CONTROLLERS}"),
            s("--kube-api-qps=500"),
            s("--kube-api-burst=1000"),
            s("--concurrent-namespace-syncs=20"),
            s("--concurrent-gc-syncs=50"),
            s("--node-monitor-grace-period=60s"),
            s("--cluster-name=envbridge-dev"),
        ],
        dir,
        st,
    )?;
    let relay = match relay {
        Some(exe) => Some(kwok::launch_relay(exe, dir, pki, st).await?),
        None => None,
    };
    let kwoks = kwok::launch_all(bins, dir, st)?;

    nodes::ensure_nodes(&client, nodes, st.kwok_shards).await?;
    st.nodes = nodes;
    state::save(dir, st)?;
    nodes::wait_ready(&client, nodes, READY_TIMEOUT, || {
        match kwoks.iter().find(|k| !process::alive(k.pid, &k.binary)) {
            None => Ok(()),
            Some(k) => Err(died(k, "exited")),
        }
    })
    .await?;
    for c in [&etcd, &apiserver, &kcm]
        .into_iter()
        .chain(&relay)
        .chain(&kwoks)
    {
        if !process::alive(c.pid, &c.binary) {
            return Err(died(c, "exited"));
        }
    }
    Ok(())
}

/// Stop every recorded component and remove the state directory.
pub fn down() -> Result<bool> {
    down_in(&paths::state_dir())
}

/// [`down`] for the plane whose state lives in `dir`.
pub fn down_in(dir: &Path) -> Result<bool> {
    let _lock = lock(dir)?;
    let was_up = match state::load(dir) {
        Ok(Some(st)) => {
            stop_components(&st);
            true
        }
        Ok(None) => false,
        Err(e) => {
            eprintln!("envbridge: {e}; removing the state anyway");
            false
        }
    };
    if dir.exists() {
        std::fs::remove_dir_all(dir).ctx("removing the state directory", dir)?;
    }
    Ok(was_up)
}

/// Report of `dev status`.
pub struct Status {
    pub state: Option<PlaneState>,
    pub alive: Vec<(Component, bool)>,
    /// Each real node's containerd and kubelet.
    pub real_alive: Vec<(Component, bool)>,
    pub ready: bool,
    pub nodes_ready: Option<(u32, u32)>,
}

impl Status {
    pub fn up(&self) -> bool {
        self.ready
            && self
                .state
                .as_ref()
                .is_some_and(|st| self.alive.len() == component_count(st))
            && self.alive.iter().chain(&self.real_alive).all(|(_, a)| *a)
    }
}

pub async fn status() -> Result<Status> {
    let dir = paths::state_dir();
    let Some(st) = state::load(&dir)? else {
        return Ok(Status {
            state: None,
            alive: Vec::new(),
            real_alive: Vec::new(),
            ready: false,
            nodes_ready: None,
        });
    };
    let alive: Vec<(Component, bool)> = st
        .components
        .iter()
        .map(|c| (c.clone(), process::alive(c.pid, &c.binary)))
        .collect();
    let real_alive: Vec<(Component, bool)> = st
        .real_nodes
        .iter()
        .flat_map(|n| [&n.containerd, &n.kubelet])
        .map(|c| (c.clone(), process::alive(c.pid, &c.binary)))
        .collect();
    let (ready, nodes_ready) = match client_for(&st.kubeconfig).await {
        Ok(client) => {
            let ready = readyz(&client).await.is_ok();
            let nodes = if ready {
                nodes::ready_count(&client).await.ok()
            } else {
                None
            };
            (ready, nodes)
        }
        Err(_) => (false, None),
    };
    Ok(Status {
        state: Some(st),
        alive,
        real_alive,
        ready,
        nodes_ready,
    })
}

/// The real nodes the running default plane records.
pub fn real_nodes() -> Result<Vec<RealNodeState>> {
    real_nodes_in(&paths::state_dir())
}

/// The real nodes the plane in `dir` records.
pub fn real_nodes_in(dir: &Path) -> Result<Vec<RealNodeState>> {
    Ok(state::load(dir)?
        .map(|st| st.real_nodes)
        .unwrap_or_default())
}

/// Build the images from `exe` and import them into every real node of the default plane
/// (`dev image`); returns the archive and how many nodes it went to.
pub fn import_images(exe: &Path) -> Result<(super::image::Archive, usize)> {
    let dir = paths::state_dir();
    let layouts: Vec<realnode::NodeLayout> = real_nodes()?
        .iter()
        .filter(|n| n.alive())
        .map(RealNodeState::layout)
        .collect();
    let bins = realnode::binaries::ensure_built()?;
    let archive = realnode::ensure_images(&bins, &dir, exe, &layouts)?;
    Ok((archive, layouts.len()))
}

/// Kubeconfig of the running control plane (no health check).
pub fn current() -> Result<Option<ClusterInfo>> {
    let dir = paths::state_dir();
    Ok(state::load(&dir)?.map(|st| info_of(&st, &dir)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plane_without_the_pod_watch_cache_records_the_flag_and_says_so() {
        let given = vec!["--max-requests-inflight=10".to_string()];
        let off = UpSpec {
            no_pod_watch_cache: true,
            ..Default::default()
        };
        let extra = extra_apiserver_args(&off, &given);
        assert_eq!(
            extra,
            [
                NO_POD_WATCH_CACHE,
                LONG_COMPACTION,
                "--max-requests-inflight=10"
            ]
        );
        let dir = Path::new("/d");
        assert!(!info_of(&PlaneState::sample(extra), dir).pod_watch_cache);

        let on = extra_apiserver_args(&UpSpec::default(), &given);
        assert_eq!(on, given);
        assert!(info_of(&PlaneState::sample(on), dir).pod_watch_cache);
    }
}

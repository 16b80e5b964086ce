//! Shared pieces of the daemon tests: CRDs, TaskTemplates, a 3-host readout-dataflow, and a
//! daemon (bridge + API server) running in the test process.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envbridge::bridge::{
    Bridge, BridgeConfig, BridgeError, CreateSpec, Metrics, NamespaceMode, Renderer, TakenPorts,
};
use envbridge::crd::{TaskTemplate, TaskTemplateSpec};
use envbridge::objects::{Objects, pack};
use envbridge::plan::{ControlMode, EnvVar, TaskRef};
use envbridge::server::pb;
use envbridge::server::pb::env_bridge_client::EnvBridgeClient;
use envbridge::server::{self, ServerConfig};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::plane::PrivatePlane;
use super::sim::{Sim, SimConfig};
use crate::support::TestNamespace;

/// Installs (server-side apply) the CRDs and waits until they are established.
pub async fn install_crds(client: &Client) {
    envbridge::install::crds(client)
        .await
        .unwrap_or_else(|e| panic!("installing the CRDs: {e}"));
}

/// The classes of the readout-dataflow, each with its own TaskTemplate named `<prefix>-<class>`.
pub const CLASSES: [&str; 3] = ["readout", "stfbuilder", "stfsender"];

/// Cluster-scoped TaskTemplates for one test (deleted on drop).
pub struct Templates {
    pub prefix: String,
    kubeconfig: std::path::PathBuf,
}

impl Templates {
    pub async fn create(client: &Client, kubeconfig: &std::path::Path, prefix: &str) -> Templates {
        let api: Api<TaskTemplate> = Api::all(client.clone());
        let pp = PatchParams::apply("envbridge-tests").force();
        for class in CLASSES {
            let name = format!("{prefix}-{class}");
            let tt = TaskTemplate::new(
                &name,
                TaskTemplateSpec {
                    control_mode: ControlMode::Direct,
                    required_env: vec!["O2_ROLE".into(), "OCC_CONTROL_PORT".into()],
                    log_file: None,
                    pod: PodSpec {
                        host_network: Some(true),
                        host_ipc: Some(true),
                        containers: vec![Container {
                            name: "task".into(),
                            image: Some("envbridge.invalid/sim:1".into()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                },
            );
            api.patch(&name, &pp, &Patch::Apply(&tt))
                .await
                .unwrap_or_else(|e| panic!("apply TaskTemplate {name}: {e}"));
        }
        Templates {
            prefix: prefix.to_string(),
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }
}

impl Drop for Templates {
    fn drop(&mut self) {
        let prefix = self.prefix.clone();
        crate::support::cleanup_in_drop(self.kubeconfig.clone(), |client| async move {
            let api: Api<TaskTemplate> = Api::all(client);
            for class in CLASSES {
                let _ = api
                    .delete(&format!("{prefix}-{class}"), &DeleteParams::default())
                    .await;
            }
        });
    }
}

/// One task of the readout-dataflow on `host`.
fn task(
    env: &str,
    prefix: &str,
    host: &str,
    class: &str,
    port: u16,
    channels: BTreeMap<String, String>,
) -> TaskRef {
    TaskRef {
        name: format!("{env}-{host}-{class}"),
        id: format!("{host}-{class}"),
        path: format!("readout-dataflow.host-{host}.{class}"),
        class: class.into(),
        node: host.into(),
        template: format!("{prefix}-{class}"),
        control_mode: ControlMode::Direct,
        control_port: port,
        critical: true,
        command: class.into(),
        env: vec![
            EnvVar {
                name: "O2_ROLE".into(),
                value: host.into(),
            },
            EnvVar {
                name: "O2_SYSTEM".into(),
                value: "FLP".into(),
            },
            EnvVar {
                name: "OCC_CONTROL_PORT".into(),
                value: port.to_string().into(),
            },
        ],
        args: vec![],
        channels: channels
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect(),
        ..TaskRef::default()
    }
}

fn ipc(name: &str, method: &str, addr: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (format!("chans.{name}.0.address"), addr.to_string()),
        (format!("chans.{name}.0.method"), method.to_string()),
        (format!("chans.{name}.0.transport"), "shmem".to_string()),
        (format!("chans.{name}.numSockets"), "1".to_string()),
    ])
}

/// The readout-dataflow per host (readout -> stfbuilder -> stfsender over IPC), control ports
/// from `base` avoiding `taken`.
pub fn readout_dataflow(
    env: &str,
    prefix: &str,
    hosts: &[String],
    base: u16,
    taken: &TakenPorts,
) -> Objects {
    let mut tasks = Vec::new();
    for host in hosts {
        let used = taken.get(host).cloned().unwrap_or_default();
        let mut ports = (base..u16::MAX).filter(|p| !used.contains(p));
        for (i, class) in CLASSES.iter().enumerate() {
            let mut ch = BTreeMap::new();
            let sock = |n: &str| format!("ipc://@{env}-{host}-{n}");
            match i {
                0 => ch.extend(ipc("readout", "bind", &sock("readout"))),
                1 => {
                    ch.extend(ipc("readout", "connect", &sock("readout")));
                    ch.extend(ipc("stfb", "bind", &sock("stfb")));
                }
                _ => ch.extend(ipc("stfb", "connect", &sock("stfb"))),
            }
            let port = ports.next().expect("a free port");
            tasks.push(task(env, prefix, host, class, port, ch));
        }
    }
    pack(env, env, "readout-dataflow", tasks)
}

pub fn hosts(n: u32) -> Vec<String> {
    (1..=n).map(|i| format!("flp{i:03}")).collect()
}

/// A renderer for the tests: `readout-dataflow` with `hosts` (comma list) and `port_base`.
pub fn test_renderer(prefix: &str) -> Renderer {
    let prefix = prefix.to_string();
    Arc::new(move |spec: &CreateSpec, id: &str, taken: &TakenPorts| {
        if spec.workflow != "readout-dataflow" {
            return Err(BridgeError::Render(format!(
                "unknown workflow {:?}",
                spec.workflow
            )));
        }
        let hosts: Vec<String> = spec
            .variables
            .get("hosts")
            .map(|h| h.split(',').map(String::from).collect())
            .unwrap_or_else(|| hosts(3));
        let base = spec
            .variables
            .get("port_base")
            .and_then(|p| p.parse().ok())
            .unwrap_or(47100);
        Ok(readout_dataflow(id, &prefix, &hosts, base, taken))
    })
}

/// A daemon (bridge + API) inside the test process.
pub struct Daemon {
    pub bridge: Arc<Bridge>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub stop: CancellationToken,
}

impl Daemon {
    pub async fn start(client: Client, cfg: BridgeConfig, renderer: Renderer) -> Daemon {
        Daemon::start_with_tokens(client, cfg, renderer, None).await
    }

    /// A daemon that identifies its callers by `tokens` (None: an unauthenticated admin).
    pub async fn start_with_tokens(
        client: Client,
        cfg: BridgeConfig,
        renderer: Renderer,
        tokens: Option<Arc<envbridge::server::auth::Tokens>>,
    ) -> Daemon {
        let bridge = Bridge::new(client, cfg, Metrics::new(), renderer);
        let stop = CancellationToken::new();
        {
            let b = bridge.clone();
            let stop = stop.clone();
            tokio::spawn(async move { b.run_watches(stop).await });
        }
        // The tests act as the site's administrator (an unauthenticated admin on loopback);
        // `daemon::trust` runs daemons with tokens and roles.
        let scfg = ServerConfig {
            grpc_addr: "127.0.0.1:0".parse().expect("addr"),
            http_addr: "127.0.0.1:0".parse().expect("addr"),
            insecure: tokens.is_none(),
            tokens,
            ..ServerConfig::default()
        };
        let (bound, _h) = server::serve(bridge.clone(), scfg, stop.clone())
            .await
            .expect("serve");
        assert!(
            bridge.wait_synced(Duration::from_secs(30)).await,
            "watches did not sync"
        );
        Daemon {
            bridge,
            grpc: bound.grpc,
            http: bound.http,
            stop,
        }
    }

    pub async fn client(&self) -> EnvBridgeClient<Channel> {
        EnvBridgeClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect to the daemon")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Bridge settings for one test namespace.
/// The variables the tests set beyond `hosts` and public ones: their daemons act as the
/// site's administrator and allow-list them (docs/security.md).
pub const TEST_ALLOWED: &[&str] = &[
    "port_base",
    "sim_fail_host",
    "sim_fail_on",
    "sim_fail_in",
    "a",
    "b",
    "k",
    "rk",
    "soft",
    "detector",
    "dcs_enabled",
    "lhc_enabled",
    "ddsched_enabled",
    "drop_caches_enabled",
    "roc_cleanup_enabled",
];

pub fn fixed_ns(ns: &str) -> BridgeConfig {
    let mut caller = envbridge::bridge::caller::CallerPolicy::new();
    caller.allowed = TEST_ALLOWED.iter().map(|v| v.to_string()).collect();
    BridgeConfig {
        namespaces: NamespaceMode::Fixed {
            namespace: ns.to_string(),
        },
        watch_namespace: Some(ns.to_string()),
        field_manager: "envbridge-daemon-test".into(),
        caller,
        ..BridgeConfig::default()
    }
}

/// Names of the objects of one kind in a namespace.
pub async fn names<K>(client: &Client, ns: &str) -> BTreeSet<String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    api.list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|o| o.meta().name.clone())
        .collect()
}

/// A free TCP port on 127.0.0.1 for a child process, outside the kernel's ephemeral range
/// (so that no in-process listener on port 0 can take it between our check and its bind).
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let start = 20000 + (h.finish() % 10000) as u16;
    (start..30000)
        .chain(20000..start)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port")
}

/// Server-side applies every document of a YAML manifest (kinds found by discovery).
pub async fn apply_manifest(client: &Client, path: &std::path::Path) {
    use kube::api::DynamicObject;
    use kube::core::GroupVersionKind;
    use kube::discovery::pinned_kind;
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("object");
        let tm = obj.types.clone().expect("apiVersion and kind");
        let (group, version) = tm
            .api_version
            .split_once('/')
            .unwrap_or(("", tm.api_version.as_str()));
        let (ar, caps) = pinned_kind(client, &GroupVersionKind::gvk(group, version, &tm.kind))
            .await
            .expect("discovery");
        let name = obj.metadata.name.clone().expect("name");
        let api: Api<DynamicObject> = match (&caps.scope, obj.metadata.namespace.as_deref()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(client.clone(), ns, &ar)
            }
            _ => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            &name,
            &PatchParams::apply("envbridge-tests").force(),
            &Patch::Apply(&doc),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name}: {e}", tm.kind));
    }
}

/// A client acting as `user` (impersonation): its RBAC applies, not the admin's.
pub async fn impersonating(kubeconfig: &std::path::Path, user: &str, groups: &[&str]) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    cfg.auth_info.impersonate = Some(user.into());
    cfg.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    Client::try_from(cfg).expect("client")
}

/// A namespace `<prefix>-<random>` (on a private plane: nobody else deletes it, the plane's
/// teardown does).
pub async fn create_namespace(client: &Client, prefix: &str) -> String {
    use k8s_openapi::api::core::v1::Namespace;
    let name = format!("{prefix}-{}", crate::support::random_suffix());
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&Default::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
    name
}

/// The client the daemon binary builds (`launch::client::counted`: kube's stack, the retry
/// of throttled requests, the counters), from a kubeconfig; acting as `user`
/// (impersonation) when given. Also its count of 429 answers.
pub async fn daemon_client(
    kubeconfig: &std::path::Path,
    user: Option<&str>,
) -> (Client, prometheus_client::metrics::counter::Counter) {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    cfg.auth_info.impersonate = user.map(String::from);
    let throttled = prometheus_client::metrics::counter::Counter::default();
    let client = envbridge::launch::client::counted(cfg, Default::default(), throttled.clone())
        .expect("client");
    (client, throttled)
}

/// The apiserver's /readyz.
pub async fn readyz(client: &Client) -> Result<String, kube::Error> {
    let req = http::Request::get("/readyz")
        .body(Vec::new())
        .expect("request");
    client.request_text(req).await
}

/// The pid of the kube-apiserver recorded in a plane's state.json.
pub fn apiserver_pid(dir: &std::path::Path) -> u32 {
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("state.json");
    v["components"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "kube-apiserver")
        .and_then(|c| c["pid"].as_u64())
        .and_then(|p| u32::try_from(p).ok())
        .expect("a kube-apiserver pid")
}

/// What a daemon test starts from: a namespace of its own, the CRDs and TaskTemplates, on the
/// shared plane ([`Setup::shared`]) or a private one ([`Setup::on`]).
pub struct Setup {
    /// The namespace.
    pub name: String,
    /// An admin client.
    pub client: Client,
    pub kubeconfig: std::path::PathBuf,
    // Dropped in this order: the templates, then the shared plane's namespace.
    pub tpl: Templates,
    _ns: Option<TestNamespace>,
}

impl Setup {
    pub async fn shared(prefix: &str) -> Setup {
        let ns = TestNamespace::new(prefix).await;
        let (name, client, kubeconfig) = (
            ns.name.clone(),
            ns.client.clone(),
            ns.info.kubeconfig.clone(),
        );
        Setup::install(name, client, kubeconfig, Some(ns)).await
    }

    /// On a private plane, whose teardown removes everything.
    pub async fn on(plane: &PrivatePlane, prefix: &str) -> Setup {
        let client = plane.client().await;
        let name = create_namespace(&client, prefix).await;
        Setup::install(name, client, plane.info.kubeconfig.clone(), None).await
    }

    async fn install(
        name: String,
        client: Client,
        kubeconfig: std::path::PathBuf,
        ns: Option<TestNamespace>,
    ) -> Setup {
        install_crds(&client).await;
        let tpl = Templates::create(&client, &kubeconfig, &format!("{name}-t")).await;
        Setup {
            name,
            client,
            kubeconfig,
            tpl,
            _ns: ns,
        }
    }

    /// The simulated cluster side in this namespace.
    pub fn sim(&self, cfg: SimConfig) -> Sim {
        Sim::start(self.client.clone(), &self.name, cfg)
    }

    /// A daemon with the admin client, the test renderer and `cfg`.
    pub async fn daemon_with(&self, cfg: BridgeConfig) -> Daemon {
        self.daemon_as(self.client.clone(), cfg).await
    }

    /// A daemon in this namespace (admin client, test renderer).
    pub async fn daemon(&self) -> Daemon {
        self.daemon_with(fixed_ns(&self.name)).await
    }

    /// A daemon with its own client (another identity, the daemon binary's stack).
    pub async fn daemon_as(&self, client: Client, cfg: BridgeConfig) -> Daemon {
        Daemon::start(client, cfg, test_renderer(&self.tpl.prefix)).await
    }

    /// A namespaced Api of this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

/// Applies rendered objects straight through the bridge (no API, no renderer) and waits until
/// their tasks are STANDBY in the roster.
pub async fn apply_standby(d: &Daemon, ns: &str, objs: Objects) {
    let name = objs.name();
    d.bridge
        .apply(objs, ns, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("apply {name}: {e}"));
    let key = envbridge::roster::EnvKey::new(ns, &name);
    crate::support::wait_for("every task STANDBY", Duration::from_secs(60), || async {
        d.bridge
            .roster
            .evaluate_state(&key, envbridge::state::State::Standby)
            .ok()
    })
    .await;
}

/// CreateEnvironment through the API.
pub async fn create(
    api: &mut EnvBridgeClient<Channel>,
    req: pb::CreateEnvironmentRequest,
) -> pb::CreateEnvironmentReply {
    api.create_environment(req)
        .await
        .unwrap_or_else(|e| panic!("create: {e}"))
        .into_inner()
}

/// Transition through the API (the reply says whether it reached its target).
pub async fn run_transition(
    api: &mut EnvBridgeClient<Channel>,
    req: pb::TransitionRequest,
) -> pb::TransitionReply {
    let what = format!("{} {}", req.id, req.event);
    api.transition(req)
        .await
        .unwrap_or_else(|e| panic!("transition {what}: {e}"))
        .into_inner()
}

/// ListEnvironments through the API.
pub async fn list(api: &mut EnvBridgeClient<Channel>) -> pb::ListEnvironmentsReply {
    api.list_environments(pb::ListEnvironmentsRequest {})
        .await
        .unwrap_or_else(|e| panic!("list: {e}"))
        .into_inner()
}

/// GetEnvironment through the API.
pub async fn get(api: &mut EnvBridgeClient<Channel>, id: &str) -> pb::Environment {
    api.get_environment(pb::GetEnvironmentRequest { id: id.into() })
        .await
        .unwrap_or_else(|e| panic!("get {id}: {e}"))
        .into_inner()
}

/// DestroyEnvironment through the API, waiting up to `timeout_seconds`.
pub async fn destroy(
    api: &mut EnvBridgeClient<Channel>,
    id: &str,
    timeout_seconds: u32,
) -> pb::DestroyEnvironmentReply {
    api.destroy_environment(pb::DestroyEnvironmentRequest {
        id: id.into(),
        wait: true,
        timeout_seconds,
    })
    .await
    .unwrap_or_else(|e| panic!("destroy {id}: {e}"))
    .into_inner()
}

/// KillTask through the API; true when the task is gone.
pub async fn kill(api: &mut EnvBridgeClient<Channel>, id: &str, task: &str) -> bool {
    api.kill_task(pb::KillTaskRequest {
        id: id.into(),
        task: task.into(),
        timeout_seconds: 30,
    })
    .await
    .unwrap_or_else(|e| panic!("kill {task}: {e}"))
    .into_inner()
    .gone
}

/// Runs the envbridge CLI (off the runtime's threads) and returns its output.
pub async fn cli(args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
            .args(&args)
            .output()
            .expect("run the CLI")
    })
    .await
    .expect("cli")
}

/// The operator in one test namespace (no leader election), until [`Operator::stop`] (or the
/// test's runtime ends).
pub struct Operator {
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<envbridge::operator::Result<()>>,
}

impl Operator {
    pub fn start(client: Client, ns: &str) -> Operator {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(envbridge::operator::run(
            client,
            envbridge::operator::OperatorArgs {
                namespace: Some(ns.to_string()),
                lease: envbridge::launch::lease::OperatorLease {
                    no_leader_election: true,
                    ..Default::default()
                },
                connect_timeout_seconds: 20,
                ..envbridge::operator::OperatorArgs::default()
            },
            stop.clone(),
        ));
        Operator { stop, handle }
    }

    /// Stops it and waits (bounded) until it has.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(60), self.handle).await;
    }
}

/// A child process (a daemon, a sim-runner) that is killed and reaped when the test ends,
/// passed or not.
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

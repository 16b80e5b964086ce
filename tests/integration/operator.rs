//! The operator against the real apiserver (local control plane, kwok nodes), running under
//! the operator ServiceAccount's identity (impersonation) with manifests/deploy/ RBAC applied.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use envbridge::crd::{
    Environment, EnvironmentSpec, Task, TaskSet, TaskSetRef, TaskSetSpec, TaskTemplate,
    TransitionPhase, TransitionRequest,
};
use envbridge::operator::OperatorArgs;
use envbridge::plan::{ControlMode, EnvVar, TaskRef};
use envbridge::state::{Event, State};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, Config, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support::{TestNamespace, wait_for};

mod failover;
mod failures;
mod hooks;
mod lifecycle;
mod probes;
mod real_nodes;
mod restart;
mod shards;
mod slow_calls;
mod status_refused;
mod teardown;
mod unread;

const OPERATOR_SA: &str = "system:serviceaccount:envbridge-system:envbridge-operator";
const DISCOVERY_PORT: u16 = 47321;
const WAIT: Duration = Duration::from_secs(60);

type Res<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// One test's world: an admin client, a fresh namespace (the harness deletes it on drop),
/// the kubeconfig (for the operator's impersonating client).
struct Fixture {
    admin: Client,
    ns: String,
    kubeconfig: std::path::PathBuf,
    _ns: TestNamespace,
}

/// A test that fails half-way leaves Tasks and Environments with finalizers and no operator
/// to remove them: strip them so that the harness can delete the namespace.
impl Drop for Fixture {
    fn drop(&mut self) {
        let ns = self.ns.clone();
        crate::support::cleanup_in_drop(self.kubeconfig.clone(), |client| async move {
            unfinalize_all(Api::<Task>::namespaced(client.clone(), &ns)).await;
            unfinalize_all(Api::<Environment>::namespaced(client, &ns)).await;
        });
    }
}

/// Removes the finalizers of every object of `api` (best effort: cleanup must not fail).
async fn unfinalize_all<K>(api: Api<K>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let unfinalize = json!({"metadata": {"finalizers": null}});
    let pp = PatchParams::default();
    let items = api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for o in items {
        let _ = api
            .patch(&o.name_any(), &pp, &Patch::Merge(&unfinalize))
            .await;
    }
}

async fn fixture(test: &str) -> Res<Fixture> {
    // Operator logs when RUST_LOG is set (e.g. RUST_LOG=envbridge=debug).
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
    }
    let tns = TestNamespace::new(&format!("op-{test}")).await;
    install(&tns.client).await?;
    // What the daemon does where it puts environments: the operator may write workloads here.
    let cfg = envbridge::bridge::BridgeConfig::default();
    envbridge::bridge::namespace::grant_operator(&tns.client, &cfg, &tns.name).await?;
    Ok(Fixture {
        admin: tns.client.clone(),
        ns: tns.name.clone(),
        kubeconfig: tns.info.kubeconfig.clone(),
        _ns: tns,
    })
}

/// CRDs, the operator's RBAC and our TaskTemplates, applied server-side (idempotent).
async fn install(admin: &Client) -> Res {
    envbridge::install::crds(admin).await?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    let files = [
        "deploy/base/namespace.yaml",
        "deploy/base/operator-rbac.yaml",
    ]
    .into_iter()
    .map(String::from)
    .chain(
        ["readout", "stfbuilder-senderoutput", "stfsender"]
            .map(|t| format!("task-templates/{t}.yaml")),
    );
    for file in files {
        envbridge::dev::fixtures::apply_file(admin, &root.join(file), "envbridge-tests").await?;
    }
    Ok(())
}

/// A client acting as the operator's ServiceAccount (the RBAC of manifests/deploy/ applies).
async fn operator_client(kubeconfig: &Path) -> Res<Client> {
    Ok(Client::try_from(operator_config(kubeconfig).await?)?)
}

/// The configuration of [`operator_client`].
async fn operator_config(kubeconfig: &Path) -> Res<Config> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let mut cfg = Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    cfg.auth_info.impersonate = Some(OPERATOR_SA.into());
    cfg.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        "system:serviceaccounts:envbridge-system".into(),
        "system:authenticated".into(),
    ]);
    Ok(cfg)
}

struct Running {
    stop: CancellationToken,
    handle: JoinHandle<Result<(), envbridge::operator::Error>>,
}

impl Running {
    async fn stop(self) -> Res {
        self.stop.cancel();
        tokio::time::timeout(WAIT, self.handle).await???;
        Ok(())
    }
}

fn args(ns: &str, lease: Option<&str>) -> OperatorArgs {
    OperatorArgs {
        namespace: Some(ns.into()),
        headless_discovery_port: DISCOVERY_PORT,
        lease: envbridge::launch::lease::OperatorLease {
            no_leader_election: lease.is_none(),
            lease_name: lease.map(String::from),
            lease_namespace: Some("envbridge-system".into()),
            identity: None,
            lease_duration: None,
        },
        connect_timeout_seconds: 10,
        ..OperatorArgs::default()
    }
}

async fn start(fx: &Fixture, lease: Option<&str>) -> Res<Running> {
    start_with(fx, args(&fx.ns, lease)).await
}

/// An operator with arguments of the test's own (a shorter timeout, ...).
async fn start_with(fx: &Fixture, args: OperatorArgs) -> Res<Running> {
    let client = operator_client(&fx.kubeconfig).await?;
    let stop = CancellationToken::new();
    let handle = tokio::spawn(envbridge::operator::run(client, args, stop.clone()));
    Ok(Running { stop, handle })
}

fn task_ref(env: &str, host: &str, class: &str, n: u16, mode: ControlMode) -> TaskRef {
    TaskRef {
        name: format!("{env}-{class}-{host}-{n}"),
        id: format!("{env}-{class}-{host}-{n}"),
        path: format!("rd.host-{host}.{class}{n}"),
        class: class.into(),
        node: host.into(),
        template: class.into(),
        control_mode: mode,
        control_port: 47100 + n,
        critical: true,
        command: "/opt/o2/bin/task".into(),
        user: Some("alice".into()),
        env: vec![
            EnvVar {
                name: "O2_ROLE".into(),
                value: host.into(),
            },
            EnvVar {
                name: "O2_SYSTEM".into(),
                value: "FLP".into(),
            },
        ],
        args: vec![
            "--bind=tcp://0.0.0.0:5555".into(),
            "consul-ini://localhost:8500/x".into(),
        ],
        channels: BTreeMap::from([(
            "chans.out.0.address".into(),
            format!("ipc://@{env}-{host}-{n}").into(),
        )]),
        ..Default::default()
    }
}

/// Writes the TaskSets and then the Environment naming them; `small_sets`: a set per task (a
/// one-byte budget), else the daemon's default budget.
async fn deploy(fx: &Fixture, name: &str, tasks: &[TaskRef], small_sets: bool) -> Res {
    let manager = "envbridge-tests";
    let budget = if small_sets {
        1
    } else {
        envbridge::plan::DEFAULT_TASK_SET_BUDGET
    };
    envbridge::dev::fixtures::deploy(&fx.admin, &fx.ns, name, tasks, budget, manager).await?;
    Ok(())
}

async fn wait_env(
    fx: &Fixture,
    name: &str,
    what: &str,
    cond: impl Fn(&Environment) -> bool,
) -> Res<Environment> {
    let api: Api<Environment> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(e) = api.get_opt(name).await?
            && cond(&e)
        {
            return Ok(e);
        }
        if Instant::now() > deadline {
            let e = api.get_opt(name).await?;
            return Err(format!(
                "environment {name} never reached: {what}; status: {:?}",
                e.and_then(|e| e.status)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn state_is(s: State) -> impl Fn(&Environment) -> bool {
    move |e| e.status.as_ref().and_then(|st| st.state) == Some(s)
}

async fn transition(fx: &Fixture, env: &str, id: &str, event: Event) -> Res {
    let api: Api<Environment> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let req = TransitionRequest {
        id: id.into(),
        event,
        arguments: BTreeMap::from([("run_number".into(), "7".into())]),
    };
    let patch = json!({"spec": {"transition": req, "desiredState": event.target()}});
    api.patch(env, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Waits until the transition `id` of `env` is no longer Running.
async fn wait_transition(fx: &Fixture, env: &str, id: &str) -> Res<Environment> {
    wait_env(fx, env, &format!("transition {id} done"), |e| {
        e.status
            .as_ref()
            .and_then(|s| s.transition.as_ref())
            .is_some_and(|t| t.id == id && t.phase != TransitionPhase::Running)
    })
    .await
}

/// Fails the test, naming the transition and the failing tasks, unless `env`'s last
/// transition Succeeded.
fn assert_succeeded(env: &Environment) {
    let st = env.status.clone().unwrap_or_default();
    assert_eq!(
        st.transition.as_ref().map(|t| t.phase),
        Some(TransitionPhase::Succeeded),
        "{:?} {:?}",
        st.transition,
        st.failing_tasks
    );
}

/// Asks `env` for `event` (transition `id`) and waits until it Succeeded; how long it took.
async fn transition_succeeds(fx: &Fixture, env: &str, id: &str, event: Event) -> Res<Duration> {
    let t0 = Instant::now();
    transition(fx, env, id, event).await?;
    let st = wait_transition(fx, env, id)
        .await?
        .status
        .unwrap_or_default();
    let phase = st.transition.as_ref().map(|t| t.phase);
    assert_eq!(
        phase,
        Some(TransitionPhase::Succeeded),
        "{:?}",
        st.transition
    );
    Ok(t0.elapsed())
}

/// Deletes the environment and waits until no Task, Pod or Service of the namespace remains.
async fn destroy(fx: &Fixture, env: &str) -> Res {
    let api: Api<Environment> = Api::namespaced(fx.admin.clone(), &fx.ns);
    api.delete(env, &DeleteParams::default()).await?;
    let deadline = Instant::now() + WAIT;
    loop {
        let lp = ListParams::default();
        let envs = api.list(&lp).await?.items.len();
        let tasks = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
            .list(&lp)
            .await?
            .items
            .len();
        let pods = Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
            .list(&lp)
            .await?
            .items
            .len();
        let svcs = Api::<Service>::namespaced(fx.admin.clone(), &fx.ns)
            .list(&lp)
            .await?
            .items
            .len();
        if envs + tasks + pods + svcs == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "left behind: {envs} envs, {tasks} tasks, {pods} pods, {svcs} services"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn finish(fx: Fixture) -> Res {
    drop(fx);
    Ok(())
}

async fn destroy_all(fx: &Fixture) -> Res {
    let deadline = Instant::now() + WAIT;
    loop {
        let lp = ListParams::default();
        let n = Api::<Environment>::namespaced(fx.admin.clone(), &fx.ns)
            .list(&lp)
            .await?
            .items
            .len()
            + Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
                .list(&lp)
                .await?
                .items
                .len()
            + Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
                .list(&lp)
                .await?
                .items
                .len();
        if n == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{n} objects left behind").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn env_value(pod: &Pod, name: &str) -> Option<String> {
    let c = &pod.spec.as_ref()?.containers[0];
    let e = c.env.as_ref()?.iter().find(|e| e.name == name)?;
    e.value.clone().or_else(|| {
        Some(
            e.value_from
                .as_ref()?
                .field_ref
                .as_ref()?
                .field_path
                .clone(),
        )
    })
}

/// Task simulators for the pods of one namespace, as `envbridge dev sim-runner` runs them for
/// the whole plane: one per Running pod on `<podIP>:$OCC_CONTROL_PORT`, fairmq when the pod
/// says so, failures from the pod's `ENVBRIDGE_SIM_*` env. A pod's simulator stops when the
/// pod is gone, as a process dies with its pod: the plane reuses a deleted pod's IP, and a
/// simulator left on it would answer for another test's pod. An address that cannot be bound
/// yet (another test's simulator not stopped yet) is tried again at the next look.
struct Sims {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Sims {
    fn start(fx: &Fixture) -> Sims {
        use envbridge::control::sim::{SimConfig, SimMode, Simulator, bind, serve};
        let stop = CancellationToken::new();
        let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
        let token = stop.clone();
        let handle = tokio::spawn(async move {
            let mut served = std::collections::HashMap::<String, CancellationToken>::new();
            while !token.is_cancelled() {
                let Ok(list) = pods.list(&ListParams::default()).await.map(|l| l.items) else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let listed: std::collections::HashSet<String> =
                    list.iter().filter_map(|p| p.uid()).collect();
                served.retain(|uid, sim| {
                    let keep = listed.contains(uid);
                    if !keep {
                        sim.cancel();
                    }
                    keep
                });
                for pod in list {
                    let uid = pod.uid().unwrap_or_default();
                    let running =
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
                    let (Some(ip), true) = (ip, running) else {
                        continue;
                    };
                    if served.contains_key(&uid) {
                        continue;
                    }
                    let get = |k: &str| env_value(&pod, k).unwrap_or_default();
                    let Ok(port) = get("OCC_CONTROL_PORT").parse::<u16>() else {
                        continue;
                    };
                    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
                        continue;
                    };
                    let mode = if get("ENVBRIDGE_CONTROL_MODE") == "fairmq" {
                        SimMode::Fairmq
                    } else {
                        SimMode::Direct
                    };
                    let list = |k: &str| -> Vec<String> {
                        get(k).split(',').map(str::to_string).collect()
                    };
                    let Ok(config) = SimConfig::parse(
                        mode,
                        &list("ENVBRIDGE_SIM_DELAY"),
                        &list("ENVBRIDGE_SIM_FAIL_ON"),
                        &list("ENVBRIDGE_SIM_CRASH_ON"),
                        &list("ENVBRIDGE_SIM_HANG_ON"),
                        &list("ENVBRIDGE_SIM_STUCK_ON"),
                    ) else {
                        continue;
                    };
                    let Ok(listener) = bind(std::net::SocketAddr::new(ip, port), false).await
                    else {
                        continue;
                    };
                    let t = token.child_token();
                    served.insert(uid, t.clone());
                    tokio::spawn(async move {
                        let _ = serve(listener, Simulator::new(config), async move {
                            t.cancelled().await
                        })
                        .await;
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Sims { stop, handle }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.handle.await;
    }
}

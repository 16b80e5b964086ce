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
mod hooks;
mod probes;
mod real_nodes;
mod shards;
mod status_refused;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_become_tasks_pods_and_services_and_leave_nothing_behind() -> Res {
    let fx = fixture("three").await?;
    let op = start(&fx, None).await?;
    let hosts = ["flp001", "flp002", "flp003"];
    let tasks: Vec<TaskRef> = hosts
        .iter()
        .map(|h| task_ref("e3", h, "readout", 1, ControlMode::Basic))
        .collect();
    deploy(&fx, "e3", &tasks, true).await?;
    let env = wait_env(&fx, "e3", "STANDBY 3/3", |e| {
        state_is(State::Standby)(e)
            && e.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("3/3")
    })
    .await?;
    let st = env.status.unwrap();
    assert_eq!(st.counts, BTreeMap::from([(State::Standby, 3)]));
    assert_eq!(st.observed_generation, env.metadata.generation);
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "TaskSetsVerified" && c.status == "True")
    );

    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let task_api: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let svcs: Api<Service> = Api::namespaced(fx.admin.clone(), &fx.ns);
    for (host, tref) in hosts.iter().zip(&tasks) {
        let task = task_api.get(&tref.name).await?;
        assert_eq!(task.owner_references()[0].kind, "Environment");
        assert_eq!(task.labels()["envbridge.dev/node"], *host);
        assert_eq!(task.annotations()["envbridge.dev/role-path"], tref.path);
        let ts = task.status.clone().unwrap();
        let node = format!("{host}.cluster.local");
        assert_eq!(ts.node_name.as_deref(), Some(node.as_str()));
        assert_eq!(ts.pod_phase.as_deref(), Some("Running"));
        assert!(
            ts.pod_ip
                .as_deref()
                .is_some_and(|ip| ip.starts_with("127.")),
            "{:?}",
            ts.pod_ip
        );

        let pod = pods.get(&tref.name).await?;
        let spec = pod.spec.clone().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(node.as_str()));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.owner_references()[0].kind, "Task");
        assert_eq!(pod.owner_references()[0].uid, task.uid().unwrap());
        assert_eq!(env_value(&pod, "USER").as_deref(), Some("alice"));
        assert_eq!(env_value(&pod, "HOME").as_deref(), Some("/home/alice"));
        assert_eq!(env_value(&pod, "POD_IP").as_deref(), Some("status.podIP"));
        assert_eq!(
            env_value(&pod, "OCC_CONTROL_PORT").as_deref(),
            Some("47101")
        );
        assert_eq!(
            env_value(&pod, "ENVBRIDGE_CONTROL_MODE").as_deref(),
            Some("basic")
        );
        assert_eq!(env_value(&pod, "O2_ROLE").as_deref(), Some(*host));
        // The template's logFile wraps the command in bash + tee; the task's args follow it.
        let c = &spec.containers[0];
        assert_eq!(c.command.as_ref().unwrap()[0], "/bin/bash");
        assert!(c.command.as_ref().unwrap()[2].contains("tee -a /tmp/envbridge-readout.log"));
        assert_eq!(
            c.args.as_ref().unwrap(),
            &vec![
                "/opt/o2/bin/task".to_string(),
                "--bind=tcp://$(POD_IP):5555".into(),
                "consul-ini://localhost:8500/x".into()
            ]
        );
        let svc = svcs.get(&tref.name).await?;
        let sspec = svc.spec.unwrap();
        assert_eq!(sspec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(sspec.ports.unwrap()[0].port, i32::from(DISCOVERY_PORT));
    }

    // A transition is copied to every Task and reported on the Environment by its id.
    transition(&fx, "e3", "cfg-1", Event::Configure).await?;
    let env = wait_env(&fx, "e3", "CONFIGURED", state_is(State::Configured)).await?;
    let tr = env.status.unwrap().transition.unwrap();
    assert_eq!(
        (tr.id.as_str(), tr.phase),
        ("cfg-1", TransitionPhase::Succeeded)
    );
    for t in task_api.list(&ListParams::default()).await? {
        assert_eq!(t.spec.transition.as_ref().unwrap().id, "cfg-1");
    }
    // A transition that does not apply fails, naming the task, without touching states.
    transition(&fx, "e3", "recover-1", Event::Recover).await?;
    let env = wait_env(&fx, "e3", "RECOVER failed", |e| {
        e.status
            .as_ref()
            .and_then(|s| s.transition.as_ref())
            .is_some_and(|t| t.id == "recover-1" && t.phase == TransitionPhase::Failed)
    })
    .await?;
    let st = env.status.unwrap();
    let msg = st.transition.unwrap().message;
    assert!(
        msg.contains("RECOVER does not apply in state CONFIGURED"),
        "{msg}"
    );
    assert_eq!(st.state, Some(State::Configured));

    destroy(&fx, "e3").await?;
    op.stop().await?;
    finish(fx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_pod_turns_task_and_environment_to_error_unless_not_critical() -> Res {
    let fx = fixture("fail").await?;
    let op = start(&fx, None).await?;
    let mut tasks: Vec<TaskRef> = ["flp001", "flp002"]
        .iter()
        .map(|h| task_ref("ef", h, "readout", 1, ControlMode::Basic))
        .collect();
    tasks[1].critical = false;
    deploy(&fx, "ef", &tasks, false).await?;
    wait_env(&fx, "ef", "STANDBY", state_is(State::Standby)).await?;
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let fail_pod = |name: String| {
        let pods = pods.clone();
        async move {
            let patch = json!({"metadata": {
                "labels": {"envbridge.dev/sim-fail": "1"},
                "annotations": {"envbridge.dev/sim-message": "disk full"}}});
            pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
    };

    // Non-critical: reported and named, the environment's state stays.
    fail_pod(tasks[1].name.clone()).await?;
    let t0 = Instant::now();
    let env = wait_env(&fx, "ef", "non-critical failure listed", |e| {
        e.status
            .as_ref()
            .is_some_and(|s| !s.failing_tasks.is_empty())
    })
    .await?;
    println!(
        "non-critical pod failure reported on the environment after {:?}",
        t0.elapsed()
    );
    let st = env.status.unwrap();
    assert_eq!(st.state, Some(State::Standby));
    assert_eq!(st.failing_tasks.len(), 1);
    let f = &st.failing_tasks[0];
    assert_eq!(
        (f.name.as_str(), f.critical),
        (tasks[1].name.as_str(), false)
    );
    assert!(f.message.contains("disk full"), "{}", f.message);
    let task = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&tasks[1].name)
        .await?;
    let ts = task.status.unwrap();
    assert_eq!(ts.state, Some(State::Error));
    assert_eq!(ts.pod_phase.as_deref(), Some("Failed"));
    assert!(ts.message.unwrap().contains("exited with code"));

    // Critical: the environment turns ERROR, naming the task and the reason.
    fail_pod(tasks[0].name.clone()).await?;
    let t0 = Instant::now();
    let env = wait_env(&fx, "ef", "ERROR", state_is(State::Error)).await?;
    println!(
        "critical pod failure turned the environment to ERROR after {:?}",
        t0.elapsed()
    );
    let st = env.status.unwrap();
    let crit = st
        .failing_tasks
        .iter()
        .find(|f| f.critical)
        .expect("critical task named");
    assert_eq!(crit.name, tasks[0].name);
    assert!(crit.message.contains("disk full"));
    // A failed task's story survives: its last log lines (the termination message) and the
    // pod's Warning events are in its status; its pod is kept (for `envbridge logs`) until
    // the environment goes, and no new pod is made.
    let task = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&tasks[0].name)
        .await?;
    let ts = task.status.unwrap();
    assert!(
        ts.last_log
            .as_deref()
            .is_some_and(|l| l.contains("disk full")),
        "{ts:?}"
    );
    let deadline = Instant::now() + WAIT;
    let mut ts = ts;
    while !ts.pod_events.iter().any(|e| e.starts_with("BackOff: ")) {
        // kwok writes the event just after the status: the operator looks again for a while.
        assert!(Instant::now() < deadline, "no BackOff event in {ts:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        ts = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
            .get(&tasks[0].name)
            .await?
            .status
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let kept = pods.list(&ListParams::default()).await?.items;
    assert_eq!(
        kept.len(),
        2,
        "failed pods are kept until the environment goes"
    );
    assert!(
        kept.iter()
            .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")),
        "a failed task's pod was re-created"
    );
    let task_events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.admin.clone(), &fx.ns)
            .list(&ListParams::default())
            .await?;
    assert!(
        task_events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("ProcessFailed")
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Task")),
        "no ProcessFailed event on the Task"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&ListParams::default())
        .await?;
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("StateError")),
        "no StateError event"
    );

    destroy(&fx, "ef").await?;
    assert!(
        pods.list(&ListParams::default()).await?.items.is_empty(),
        "the environment's destroy leaves no pod"
    );
    op.stop().await?;
    finish(fx).await
}

/// A pod that is not Running within the start-up timeout fails its task with the pod's own
/// words (held Pending by the `pod-sim-pending` kwok stage, which adds FailedScheduling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_pending_past_the_startup_timeout_fails_its_task_with_its_events() -> Res {
    let fx = fixture("pending").await?;
    let op = start_with(
        &fx,
        OperatorArgs {
            // Long enough that kwok has marked the pod Unschedulable under a loaded machine
            // (3 s once passed before it had, while a release build ran beside the suite).
            startup_timeout_seconds: 8,
            ..args(&fx.ns, None)
        },
    )
    .await?;
    let mut t = task_ref("ep", "flp001", "readout", 1, ControlMode::Basic);
    t.env.push(EnvVar {
        name: envbridge::dev::stages::SIM_PENDING_ENV.into(),
        value: "1".into(),
    });
    deploy(&fx, "ep", &[t.clone()], false).await?;
    let started = Instant::now();
    let env = wait_env(&fx, "ep", "ERROR", state_is(State::Error)).await?;
    println!("start-up failure reported after {:?}", started.elapsed());
    let st = env.status.unwrap();
    let f = &st.failing_tasks[0];
    assert_eq!(f.name, t.name);
    assert!(f.message.contains("not Running after 8s"), "{}", f.message);
    assert!(f.message.contains("Unschedulable"), "{}", f.message);
    let task = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&t.name)
        .await?;
    let ts = task.status.unwrap();
    assert!(
        ts.pod_events
            .iter()
            .any(|e| e.starts_with("FailedScheduling: ") && e.contains("hugepages")),
        "{ts:?}"
    );
    destroy(&fx, "ep").await?;
    op.stop().await?;
    finish(fx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_restart_reattaches_pods_without_duplicates() -> Res {
    let fx = fixture("restart").await?;
    let lease = fx.ns.clone();
    let op = start(&fx, Some(&lease)).await?;
    let tasks: Vec<TaskRef> = (1..=4)
        .flat_map(|n| {
            ["flp001", "flp002", "flp003"]
                .map(|h| task_ref("er", h, "readout", n, ControlMode::Basic))
        })
        .collect();
    deploy(&fx, "er", &tasks, false).await?;
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    // Stop mid-way: as soon as some pods exist.
    let deadline = Instant::now() + WAIT;
    while pods.list(&ListParams::default()).await?.items.is_empty() {
        assert!(Instant::now() < deadline, "no pod appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    op.stop().await?;
    let before: BTreeMap<String, String> = pods
        .list(&ListParams::default())
        .await?
        .into_iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect();
    println!(
        "{} of {} pods existed when the operator stopped",
        before.len(),
        tasks.len()
    );

    let op = start(&fx, Some(&lease)).await?;
    wait_env(&fx, "er", "STANDBY 12/12", |e| {
        state_is(State::Standby)(e)
            && e.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("12/12")
    })
    .await?;
    let after = pods.list(&ListParams::default()).await?;
    assert_eq!(after.items.len(), tasks.len(), "one pod per task");
    for p in &after {
        if let Some(uid) = before.get(&p.name_any()) {
            assert_eq!(
                p.uid().as_ref(),
                Some(uid),
                "pod {} was replaced instead of re-attached",
                p.name_any()
            );
        }
    }
    let tasks_now = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&ListParams::default())
        .await?;
    assert_eq!(tasks_now.items.len(), tasks.len());

    destroy(&fx, "er").await?;
    op.stop().await?;
    finish(fx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_template_and_taskset_problems_are_reported() -> Res {
    let fx = fixture("problems").await?;
    // A template without hostNetwork/hostIPC (admins write templates: the admin client here).
    let tmpl_name = format!("{}-nohost", fx.ns);
    let tmpl: TaskTemplate = serde_json::from_value(json!({
        "apiVersion": "envbridge.dev/v1alpha1", "kind": "TaskTemplate",
        "metadata": {"name": tmpl_name},
        "spec": {"controlMode": "basic", "pod": {"containers": [{"name": "t", "image": "registry.invalid/x:1"}]}}
    }))?;
    let tmpls: Api<TaskTemplate> = Api::all(fx.admin.clone());
    tmpls
        .patch(
            &tmpl_name,
            &PatchParams::apply("envbridge-tests").force(),
            &Patch::Apply(&tmpl),
        )
        .await?;
    // The operator's identity may read templates but not write them.
    let as_operator: Api<TaskTemplate> = Api::all(operator_client(&fx.kubeconfig).await?);
    let denied = as_operator
        .delete(&tmpl_name, &DeleteParams::default())
        .await;
    assert!(
        matches!(denied, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{denied:?}"
    );

    let op = start(&fx, None).await?;
    let mut ipc = task_ref("ep", "flp001", "readout", 1, ControlMode::Basic);
    ipc.template = tmpl_name.clone();
    let nowhere = task_ref("ep", "flp999", "readout", 2, ControlMode::Basic);
    let mut no_tmpl = task_ref("ep", "flp002", "readout", 3, ControlMode::Basic);
    no_tmpl.template = "does-not-exist".into();
    deploy(
        &fx,
        "ep",
        &[ipc.clone(), nowhere.clone(), no_tmpl.clone()],
        false,
    )
    .await?;
    let env = wait_env(&fx, "ep", "ERROR with 3 failing", |e| {
        state_is(State::Error)(e)
            && e.status
                .as_ref()
                .is_some_and(|s| s.failing_tasks.len() == 3)
    })
    .await?;
    let msg = |name: &str| {
        env.status
            .as_ref()
            .unwrap()
            .failing_tasks
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.message.clone())
            .unwrap_or_default()
    };
    assert!(
        msg(&ipc.name).contains("lacks hostNetwork and hostIPC"),
        "{}",
        msg(&ipc.name)
    );
    assert!(
        msg(&nowhere.name).contains("no Node for machine_id \"flp999\""),
        "{}",
        msg(&nowhere.name)
    );
    assert!(
        msg(&no_tmpl.name).contains("TaskTemplate \"does-not-exist\" not found"),
        "{}",
        msg(&no_tmpl.name)
    );
    assert!(
        Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );

    // An Environment naming a TaskSet that is not there (or altered) gets no Tasks at all.
    let sets: Api<TaskSet> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let good = [task_ref("eh", "flp001", "readout", 1, ControlMode::Basic)];
    deploy(&fx, "eh", &good, false).await?;
    wait_env(&fx, "eh", "STANDBY", state_is(State::Standby)).await?;
    let altered = TaskSet::new(
        "eh2-0",
        TaskSetSpec {
            environment: "eh2".into(),
            tasks: vec![task_ref("eh2", "flp001", "readout", 1, ControlMode::Basic)],
        },
    );
    sets.patch(
        "eh2-0",
        &PatchParams::apply("envbridge-tests").force(),
        &Patch::Apply(&altered),
    )
    .await?;
    let env = Environment::new(
        "eh2",
        EnvironmentSpec {
            id: "eh2".into(),
            tasks: 1,
            nodes: 1,
            task_sets: vec![
                TaskSetRef {
                    name: "eh2-0".into(),
                    blake3: "0".repeat(64),
                    tasks: 1,
                },
                TaskSetRef {
                    name: "eh2-missing".into(),
                    blake3: "0".repeat(64),
                    tasks: 0,
                },
            ],
            ..Default::default()
        },
    );
    Api::<Environment>::namespaced(fx.admin.clone(), &fx.ns)
        .patch(
            "eh2",
            &PatchParams::apply("envbridge-tests").force(),
            &Patch::Apply(&env),
        )
        .await?;
    let e = wait_env(&fx, "eh2", "TaskSetsVerified=False", |e| {
        e.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "TaskSetsVerified" && c.status == "False")
        })
    })
    .await?;
    let cond = e
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "TaskSetsVerified")
        .unwrap();
    assert_eq!(cond.reason, "HashMismatch", "{}", cond.message);
    let eh2_tasks = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&ListParams::default().labels("envbridge.dev/environment=eh2"))
        .await?;
    assert!(
        eh2_tasks.items.is_empty(),
        "tasks were created from an unverified set"
    );

    for e in ["ep", "eh", "eh2"] {
        Api::<Environment>::namespaced(fx.admin.clone(), &fx.ns)
            .delete(e, &DeleteParams::default())
            .await?;
    }
    destroy_all(&fx).await?;
    tmpls.delete(&tmpl_name, &DeleteParams::default()).await?;
    op.stop().await?;
    finish(fx).await
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

/// An operator killed half-way through a FairMQ device's CONFIGURE (the device left in
/// BOUND) is replaced: the new operator carries the sequence on from BOUND (CONNECT, INIT
/// TASK) and the transition succeeds; it is neither failed as "unreachable" nor started over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_carries_on_a_fairmq_sequence_left_part_way() -> Res {
    let fx = fixture("fmq-resume").await?;
    let sims = Sims::start(&fx);
    let op = start(&fx, None).await?;
    let mut t = task_ref(
        "eq",
        "flp003",
        "stfbuilder-senderoutput",
        7,
        ControlMode::Fairmq,
    );
    t.channels
        .insert("chans.out.0.transport".into(), "shmem".into());
    deploy(&fx, "eq", std::slice::from_ref(&t), false).await?;
    wait_env(&fx, "eq", "STANDBY", state_is(State::Standby)).await?;
    op.stop().await?;

    // What the killed operator had sent: the first three of CONFIGURE's five steps.
    let pod = Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&t.name)
        .await?;
    let ip = pod.status.and_then(|s| s.pod_ip).ok_or("no pod IP")?;
    let addr = std::net::SocketAddr::new(ip.parse()?, t.control_port);
    for (from, event) in [
        ("IDLE", "INIT DEVICE"),
        ("INITIALIZING DEVICE", "COMPLETE INIT"),
        ("INITIALIZED", "BIND"),
    ] {
        let reply = envbridge::control::ControlClient::default()
            .device_step(addr, from.parse()?, event.parse()?, Duration::from_secs(5))
            .await?;
        assert!(reply.ok, "{event}: {reply:?}");
    }

    let op = start(&fx, None).await?;
    transition(&fx, "eq", "c1", Event::Configure).await?;
    let t0 = Instant::now();
    assert_succeeded(&wait_transition(&fx, "eq", "c1").await?);
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t0.elapsed()
    );
    wait_env(&fx, "eq", "CONFIGURED", state_is(State::Configured)).await?;
    destroy(&fx, "eq").await?;
    op.stop().await?;
    sims.stop().await;
    finish(fx).await
}

/// Task simulators for the pods of one namespace, as `envbridge dev sim-runner` runs them for
/// the whole plane: one per Running pod on `<podIP>:$OCC_CONTROL_PORT`, fairmq when the pod
/// says so, failures from the pod's `ENVBRIDGE_SIM_*` env. An address already served (by a
/// sim-runner) is left to it.
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
            let mut served = std::collections::HashSet::new();
            while !token.is_cancelled() {
                let list = pods
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default();
                for pod in list {
                    let uid = pod.uid().unwrap_or_default();
                    let running =
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
                    let (Some(ip), true) = (ip, running) else {
                        continue;
                    };
                    if served.contains(&uid) {
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
                    served.insert(uid);
                    let Ok(listener) = bind(std::net::SocketAddr::new(ip, port), false).await
                    else {
                        continue;
                    };
                    let t = token.clone();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_and_fairmq_tasks_are_driven_over_the_control_protocol() -> Res {
    let fx = fixture("drive").await?;
    let sims = Sims::start(&fx);
    let op = start(&fx, None).await?;
    let mut tasks = Vec::new();
    for host in ["flp001", "flp002"] {
        tasks.push(task_ref("ed", host, "readout", 1, ControlMode::Direct));
        let mut stfb = task_ref(
            "ed",
            host,
            "stfbuilder-senderoutput",
            2,
            ControlMode::Fairmq,
        );
        stfb.channels
            .insert("chans.out.0.transport".into(), "shmem".into());
        tasks.push(stfb);
    }
    deploy(&fx, "ed", &tasks, false).await?;
    wait_env(&fx, "ed", "STANDBY 4/4", |e| {
        state_is(State::Standby)(e)
            && e.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("4/4")
    })
    .await?;
    // Each Task keeps the pid its process reported when it first answered.
    let task_api: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    for t in &tasks {
        let got = task_api.get(&t.name).await?;
        let pid = got.status.and_then(|s| s.pid);
        assert!(pid.is_some_and(|p| p > 0), "{}: pid {pid:?}", t.name);
    }
    for (id, event, target) in [
        ("c1", Event::Configure, State::Configured),
        ("s1", Event::Start, State::Running),
        ("p1", Event::Stop, State::Configured),
        ("r1", Event::Reset, State::Standby),
    ] {
        let took = transition_succeeds(&fx, "ed", id, event).await?;
        println!("{event}: {took:?} for 4 tasks (2 direct, 2 fairmq)");
        let env = wait_env(&fx, "ed", &format!("{target}"), state_is(target)).await?;
        assert_eq!(env.status.unwrap().ready.as_deref(), Some("4/4"));
    }

    // A task whose process answers CONFIGURE with ok=false: its Task and the transition fail,
    // naming it, and the environment turns ERROR.
    let mut bad = task_ref("eb", "flp003", "readout", 1, ControlMode::Direct);
    bad.env.push(EnvVar {
        name: "ENVBRIDGE_SIM_FAIL_ON".into(),
        value: "CONFIGURE".into(),
    });
    let good = task_ref("eb", "flp003", "readout", 2, ControlMode::Direct);
    deploy(&fx, "eb", &[bad.clone(), good], false).await?;
    wait_env(&fx, "eb", "STANDBY", state_is(State::Standby)).await?;
    let t0 = Instant::now();
    transition(&fx, "eb", "c1", Event::Configure).await?;
    let env = wait_env(&fx, "eb", "CONFIGURE failed", |e| {
        e.status
            .as_ref()
            .and_then(|s| s.transition.as_ref())
            .is_some_and(|t| t.phase == TransitionPhase::Failed)
    })
    .await?;
    println!("failed CONFIGURE reported after {:?}", t0.elapsed());
    let st = env.status.unwrap();
    let msg = st.transition.unwrap().message;
    assert!(msg.contains(&bad.name), "{msg}");
    let env = wait_env(&fx, "eb", "ERROR", state_is(State::Error)).await?;
    assert_eq!(env.status.unwrap().failing_tasks[0].name, bad.name);

    for e in ["ed", "eb"] {
        Api::<Environment>::namespaced(fx.admin.clone(), &fx.ns)
            .delete(e, &DeleteParams::default())
            .await?;
    }
    destroy_all(&fx).await?;
    op.stop().await?;
    sims.stop().await;
    finish(fx).await
}

/// The operator's ServiceAccount writes pods only where the workloads role is bound.
#[tokio::test]
async fn the_operator_writes_pods_only_where_environments_live() -> Res {
    let fx = fixture("rbac-scope").await?;
    let other = TestNamespace::new("op-unmanaged").await;
    let op = operator_client(&fx.kubeconfig).await?;
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))?;
    let denied = Api::<Pod>::namespaced(op.clone(), &other.name)
        .create(&Default::default(), &pod)
        .await
        .expect_err("a pod in an unmanaged namespace");
    assert!(
        matches!(denied, kube::Error::Api(ref s) if s.code == 403),
        "{denied}"
    );
    // Reading is allowed everywhere (its watches are label-selected, cluster-wide).
    Api::<Pod>::namespaced(op.clone(), &other.name)
        .list(&ListParams::default())
        .await?;
    let made = Api::<Pod>::namespaced(op, &fx.ns)
        .create(&Default::default(), &pod)
        .await?;
    assert_eq!(made.name_any(), "probe");
    finish(fx).await
}

/// A pod on a node whose kubelet is dead stays Terminating: the Task's finalizer removes it by
/// force past the bound, so destroying the environment ends (the node here is a Node object
/// that kwok does not manage: nothing answers for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_cannot_hold_an_environment_forever() -> Res {
    use k8s_openapi::api::core::v1::Node;
    let fx = fixture("deadnode").await?;
    let host = format!("dead{}", &fx.ns[fx.ns.len() - 6..]);
    let nodes: Api<Node> = Api::all(fx.admin.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": host.clone(), "labels": {"envbridge.dev/host": host.clone()}}
    }))?;
    nodes.create(&Default::default(), &node).await?;
    let op = start_with(
        &fx,
        OperatorArgs {
            pod_deletion_timeout_seconds: 3,
            ..args(&fx.ns, None)
        },
    )
    .await?;
    let t = task_ref("ed", &host, "readout", 1, ControlMode::Basic);
    deploy(&fx, "ed", std::slice::from_ref(&t), false).await?;
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let deadline = Instant::now() + WAIT;
    while pods.get_opt(&t.name).await?.is_none() {
        assert!(Instant::now() < deadline, "no pod on the dead node");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let started = Instant::now();
    destroy(&fx, "ed").await?;
    println!(
        "environment on a dead node destroyed in {:?}",
        started.elapsed()
    );
    assert!(pods.get_opt(&t.name).await?.is_none());
    let _ = nodes.delete(&host, &Default::default()).await;
    op.stop().await?;
    finish(fx).await
}

/// A deleted environment's finalizer counts its Tasks going by the index and reads the Pod and
/// Service stores only once none is left: an object labelled with the environment that no
/// Task owns (its Task's finalizer removed by hand) still holds the environment until it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_of_the_environment_that_no_task_owns_holds_its_teardown() -> Res {
    use envbridge::crd::labels;
    let fx = fixture("stray").await?;
    let op = start(&fx, None).await?;
    let tasks: Vec<TaskRef> = ["flp001", "flp002"]
        .iter()
        .map(|h| task_ref("es", h, "readout", 1, ControlMode::Basic))
        .collect();
    deploy(&fx, "es", &tasks, false).await?;
    wait_env(&fx, "es", "STANDBY", state_is(State::Standby)).await?;
    let svcs: Api<Service> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let stray: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "stray", "labels": {
            labels::MANAGED_BY: labels::MANAGER, labels::ENVIRONMENT: "es"}},
        "spec": {"clusterIP": "None", "ports": [{"port": 1}]}
    }))?;
    svcs.create(&Default::default(), &stray).await?;

    let envs: Api<Environment> = Api::namespaced(fx.admin.clone(), &fx.ns);
    envs.delete("es", &DeleteParams::default()).await?;
    let task_api: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let lp = ListParams::default();
    wait_for("the environment's tasks and pods to go", WAIT, || async {
        let tasks = task_api.list(&lp).await.ok()?.items.len();
        let pods = pods.list(&lp).await.ok()?.items.len();
        (tasks + pods == 0).then_some(())
    })
    .await;
    // Every task gone: the finalizer now waits for the stray Service (its retry is 0.5 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = envs.get_opt("es").await?;
    assert!(
        held.is_some_and(|e| e.metadata.deletion_timestamp.is_some()),
        "the environment went while an object labelled with it was left"
    );
    let left: Vec<String> = svcs.list(&lp).await?.iter().map(|s| s.name_any()).collect();
    assert_eq!(left, ["stray"]);
    svcs.delete("stray", &DeleteParams::default()).await?;
    wait_for(
        "the environment to go once nothing is left",
        WAIT,
        || async { envs.get_opt("es").await.ok()?.is_none().then_some(()) },
    )
    .await;
    op.stop().await?;
    finish(fx).await
}

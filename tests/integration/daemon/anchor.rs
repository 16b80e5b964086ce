//! The anchor's own workflow, unmodified (readout-dataflow of its ControlWorkflows, read from
//! ../shared), with a configuration store in the anchor's layout and the project's class ->
//! TaskTemplate mapping: created through the daemon, its tasks (readout, StfBuilder,
//! StfSender and its hook tasks) deployed, CONFIGURE -> START -> STOP -> RESET -> destroy with
//! simulators standing in for every process (basic and hook tasks run to completion).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use envbridge::server::pb;

use super::fixture::{self, Daemon, fixed_ns};
use super::{Child, transition};
use crate::support::{self, TestNamespace};

fn shared() -> PathBuf {
    for c in ["../shared", "../../shared"] {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(c);
        if p.join("conformance/aliecs").is_dir() {
            return p;
        }
    }
    panic!("../shared/conformance/aliecs not found beside the repository");
}

/// The operator (in the test's namespace), a sim-runner for one environment's pods (basic
/// and hook tasks run to completion) and a daemon on the anchor's ControlWorkflows with the
/// `caches` case's store and the project's template mapping.
struct Stack {
    _sim: Child,
    operator: fixture::Operator,
    daemon: Daemon,
}

impl Stack {
    async fn start(
        ns: &TestNamespace,
        id: &str,
        ports: u16,
        integrations: &[(&str, String)],
    ) -> Stack {
        let store = shared().join("conformance/aliecs/caches/config.yaml");
        Stack::with_store(ns, id, ports, integrations, store).await
    }

    async fn with_store(
        ns: &TestNamespace,
        id: &str,
        ports: u16,
        integrations: &[(&str, String)],
        store: PathBuf,
    ) -> Stack {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
        envbridge::install::crds(&ns.client).await.expect("CRDs");
        envbridge::install::task_templates(&ns.client, &root.join("task-templates"))
            .await
            .expect("TaskTemplates");
        let selector =
            format!("app.kubernetes.io/managed-by=envbridge,envbridge.dev/environment={id}");
        let sim = Child(
            std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
                .args(["dev", "sim-runner", "--in-process", "--complete-tasks"])
                .args(["--selector", &selector])
                .arg("--kubeconfig")
                .arg(&ns.info.kubeconfig)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("sim-runner"),
        );
        let operator = fixture::Operator::start(ns.client.clone(), &ns.name);
        let shared = shared();
        let cw = shared.join("corpus/aliecs/controlworkflows");
        let mut cfg = fixed_ns(&ns.name);
        cfg.tasks_dir = cw.join("tasks");
        cfg.workflows_dir = cw.join("workflows");
        cfg.config_store = Some(store);
        cfg.templates = Some(root.join("site/templates.yaml"));
        cfg.integrations = integrations
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        // Nodes are shared with other tests' environments: ports of our own, away from theirs.
        cfg.control_ports = ports..=ports + 49;
        cfg.tcp_ports = ports + 50..=ports + 99;
        let renderer = envbridge::bridge::render::renderer(&cfg);
        let daemon = Daemon::start(ns.client.clone(), cfg, renderer).await;
        Stack {
            _sim: sim,
            operator,
            daemon,
        }
    }

    async fn stop(self) {
        self.operator.stop().await;
    }
}

fn create(id: &str, vars: &[(&str, &str)]) -> pb::CreateEnvironmentRequest {
    pb::CreateEnvironmentRequest {
        workflow: "readout-dataflow".into(),
        variables: vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
        env_id: id.to_string(),
        wait: true,
        timeout_seconds: 120,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anchor_s_readout_dataflow_runs_its_cycle_through_the_daemon() {
    let ns = TestNamespace::new("anchor-e2e").await;
    let id = format!("anchor{}", support::random_suffix());
    let stack = Stack::start(&ns, &id, 55000, &[]).await;
    let mut api = stack.daemon.client().await;
    let c = fixture::create(
        &mut api,
        create(
            &id,
            &[
                ("hosts", r#"["flp001","flp002"]"#),
                ("drop_caches_enabled", "true"),
                ("roc_cleanup_enabled", "true"),
            ],
        ),
    )
    .await;
    assert_eq!(
        (c.outcome.as_str(), c.nodes, c.tasks),
        ("reached", 2, 14),
        "{} {:?}",
        c.message,
        c.failures
    );
    let env = fixture::get(&mut api, &id).await;
    let classes: std::collections::BTreeSet<&str> =
        env.tasks.iter().map(|t| t.class.as_str()).collect();
    for class in [
        "readout",
        "stfbuilder-senderoutput",
        "stfsender",
        "shell-command",
        "fairmq-shmmonitor",
        "o2-roc-cleanup",
    ] {
        assert!(classes.contains(class), "{class} missing from {classes:?}");
    }
    let envs: kube::Api<envbridge::crd::Environment> =
        kube::Api::namespaced(ns.client.clone(), &ns.name);
    let tasks: kube::Api<envbridge::crd::Task> = kube::Api::namespaced(ns.client.clone(), &ns.name);
    for (event, args) in [
        ("CONFIGURE", &[][..]),
        ("START", &[("run_number", "7"), ("run_type", "PHYSICS")][..]),
        ("STOP", &[][..]),
        ("RESET", &[][..]),
    ] {
        let r = fixture::run_transition(&mut api, transition(&id, event, args)).await;
        assert!(r.ok, "{event}: {} {:?}", r.message, r.failures);
        // Each transition carries exactly its own arguments, on the Environment and the Tasks.
        let want: std::collections::BTreeMap<String, String> = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = envs.get(&id).await.expect("environment");
        let tr = env.spec.transition.expect("transition");
        assert_eq!((tr.event.as_str(), &tr.arguments), (event, &want));
        for t in tasks.list(&Default::default()).await.expect("tasks").items {
            if let Some(tr) = t.spec.transition.filter(|tr| tr.event.as_str() == event) {
                assert_eq!(tr.arguments, want, "{event} on {:?}", t.metadata.name);
            }
        }
    }
    let gone = fixture::destroy(&mut api, &id, 90).await;
    assert!(gone.gone, "{id}: {}", gone.message);
    stack.stop().await;
}

/// The anchor's o2-roc-config: one basic task per CRU card of the host's inventory; its
/// process runs to completion and the environment still goes through its cycle (a basic task
/// that ended keeps following the transitions, as in the anchor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anchor_s_basic_tasks_run_to_completion_and_follow_the_cycle() {
    let ns = TestNamespace::new("anchor-basic").await;
    let id = format!("roc{}", support::random_suffix());
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("config.yaml");
    let text = std::fs::read_to_string(shared().join("conformance/aliecs/base/config.yaml"))
        .unwrap()
        .replace(
            "cards: '{}'",
            r#"cards: '{"0":{"serial":"1041","endpoint":"0"},"1":{"serial":"1041","endpoint":"1"}}'"#,
        );
    std::fs::write(&store, text).unwrap();
    let stack = Stack::with_store(&ns, &id, 55200, &[], store).await;
    let mut api = stack.daemon.client().await;
    let mut req = create(&id, &[("hosts", r#"["flp001"]"#)]);
    req.workflow = "o2-roc-config".into();
    let c = fixture::create(&mut api, req).await;
    assert_eq!(
        (c.outcome.as_str(), c.tasks),
        ("reached", 1),
        "{} {:?}",
        c.message,
        c.failures
    );
    for (event, args) in [
        ("CONFIGURE", &[][..]),
        ("START", &[("run_number", "3")][..]),
        ("STOP", &[][..]),
        ("RESET", &[][..]),
    ] {
        let r = fixture::run_transition(&mut api, transition(&id, event, args)).await;
        assert!(r.ok, "{event}: {} {:?}", r.message, r.failures);
    }
    let env = fixture::get(&mut api, &id).await;
    assert_eq!(env.tasks[0].pod_phase, "Succeeded", "{:?}", env.tasks[0]);
    let gone = fixture::destroy(&mut api, &id, 90).await;
    assert!(gone.gone, "{id}: {}", gone.message);
    stack.stop().await;
}

/// A test integration server on 127.0.0.1: records every call; answers `"ok": false` to
/// `fail_function` while `failing` is set.
struct Integration {
    url: String,
    seen: Arc<Mutex<Vec<serde_json::Value>>>,
    failing: Arc<std::sync::atomic::AtomicBool>,
}

async fn integration(fail_function: &'static str) -> Integration {
    let seen: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let failing: Arc<std::sync::atomic::AtomicBool> = Arc::default();
    let (s, f) = (seen.clone(), failing.clone());
    let app = axum::Router::new().route(
        "/call",
        axum::routing::post(move |axum::Json(v): axum::Json<serde_json::Value>| {
            let (s, f) = (s.clone(), f.clone());
            async move {
                let fail =
                    f.load(std::sync::atomic::Ordering::SeqCst) && v["function"] == fail_function;
                s.lock().unwrap().push(v);
                match fail {
                    true => {
                        axum::Json(serde_json::json!({"ok": false, "error": "refused by the test"}))
                    }
                    false => axum::Json(serde_json::json!({"ok": true})),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Integration {
        url: format!("http://{addr}/call"),
        seen,
        failing,
    }
}

/// The anchor's DCS calls reach the integration at their moments, in order, with the
/// documented payload; a critical call that fails fails the transition, naming it; a
/// critical call no endpoint serves refuses the create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anchor_s_calls_reach_the_integration_at_their_moments() {
    let ns = TestNamespace::new("anchor-calls").await;
    let id = format!("calls{}", support::random_suffix());
    let dcs = integration("StartOfRun").await;
    let stack = Stack::start(&ns, &id, 55100, &[("dcs", dcs.url.clone())]).await;
    let mut api = stack.daemon.client().await;
    let vars = [("hosts", r#"["flp001"]"#), ("dcs_enabled", "true")];

    // Another plugin's critical call that nothing serves: the create is refused, naming it.
    let refused = api
        .create_environment(create(
            &format!("{id}x"),
            &[("hosts", r#"["flp001"]"#), ("ddsched_enabled", "true")],
        ))
        .await;
    let msg = match refused {
        Err(status) => status.message().to_string(),
        Ok(r) => format!("{:?}", r.into_inner()),
    };
    assert!(
        msg.contains("ddsched") && msg.contains("no endpoint"),
        "{msg}"
    );

    let c = fixture::create(&mut api, create(&id, &vars)).await;
    assert_eq!(c.outcome, "reached", "{} {:?}", c.message, c.failures);
    let calls =
        |from: usize| -> Vec<serde_json::Value> { dcs.seen.lock().unwrap()[from..].to_vec() };
    let mut at = 0;
    for (event, args, function, trigger) in [
        ("CONFIGURE", &[][..], "PrepareForRun", "before_CONFIGURE"),
        (
            "START",
            &[("run_number", "7")][..],
            "StartOfRun",
            "before_START_ACTIVITY+100",
        ),
        ("STOP", &[][..], "EndOfRun", "after_STOP_ACTIVITY-50"),
    ] {
        let r = fixture::run_transition(&mut api, transition(&id, event, args)).await;
        assert!(r.ok, "{event}: {} {:?}", r.message, r.failures);
        let got = calls(at);
        at += got.len();
        let functions: Vec<&str> = got.iter().filter_map(|v| v["function"].as_str()).collect();
        assert_eq!(functions, [function], "{event}: {got:?}");
        let v = &got[0];
        assert_eq!(v["plugin"], "dcs");
        assert_eq!(v["event"], event);
        assert_eq!(v["trigger"], trigger);
        assert_eq!(v["environmentId"], id.as_str());
        assert!(
            v["call"]
                .as_str()
                .unwrap()
                .starts_with("readout-dataflow.dcs."),
            "{v}"
        );
        // The DCS role's own settings (readout-dataflow's `dcs` role declares them).
        let detectors = v["variables"]["dcs_detectors"].as_str().unwrap_or_default();
        assert_eq!(detectors, r#"["TST"]"#, "{v}");
        // The run's number while it runs (START and STOP), as the anchor sends it.
        match event {
            "CONFIGURE" => assert!(v["runNumber"].is_null(), "{v}"),
            _ => assert_eq!(v["runNumber"], "7", "{v}"),
        }
    }
    // START again, with the integration refusing the critical StartOfRun: START fails, named.
    dcs.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let r =
        fixture::run_transition(&mut api, transition(&id, "START", &[("run_number", "8")])).await;
    assert!(!r.ok, "START with a failing critical call: {r:?}");
    let said = format!("{} {:?}", r.message, r.failures);
    assert!(
        said.contains("readout-dataflow.dcs.sor") && said.contains("refused by the test"),
        "{said}"
    );
    // Destroy sends the calls triggered at DESTROY before the objects go.
    at = dcs.seen.lock().unwrap().len();
    let gone = fixture::destroy(&mut api, &id, 90).await;
    assert!(gone.gone, "{id}: {}", gone.message);
    let at_destroy = calls(at);
    let functions: Vec<(&str, &str)> = at_destroy
        .iter()
        .map(|v| {
            (
                v["function"].as_str().unwrap_or(""),
                v["event"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(functions, [("Cleanup", "DESTROY")], "{at_destroy:?}");
    stack.stop().await;
}

/// The store in a ConfigMap, read through the API: the first version, a broken one that is
/// refused (the last good one stays), then a new good one, in that order.
#[tokio::test]
async fn the_store_in_a_config_map_follows_its_versions_and_keeps_the_last_good_one() {
    use envbridge::bridge::config_map_store::{self, KEY, SharedStore};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

    let ns = TestNamespace::new("store-cm").await;
    let api: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
    let text = std::fs::read_to_string(shared().join("conformance/aliecs/its/config.yaml"))
        .expect("store");
    let cm = |t: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some("site-store".into()),
            ..Default::default()
        },
        data: Some([(KEY.to_string(), t.to_string())].into()),
        ..Default::default()
    };
    api.create(&PostParams::default(), &cm(&text))
        .await
        .expect("create");
    let shared = SharedStore::new(&ns.name, "site-store");
    let stop = tokio_util::sync::CancellationToken::new();
    let watch = tokio::spawn(config_map_store::watch(
        ns.client.clone(),
        ns.name.clone(),
        "site-store".into(),
        shared.clone(),
        stop.clone(),
    ));
    let detector = || {
        shared
            .current()
            .ok()
            .and_then(|s| s.detector_for_host("flp001").ok())
    };
    let until = |want: &'static str| async move {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if detector().as_deref() == Some(want) {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        false
    };
    assert!(
        until("ITS").await,
        "first version read: {:?}",
        shared.current()
    );
    let put = |t: String| {
        let api = api.clone();
        let patch = serde_json::json!({"data": {KEY: t}});
        async move {
            api.patch("site-store", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("patch");
        }
    };
    put("o2: [\n".into()).await;
    put(text.replace("ITS:", "TPC:")).await;
    assert!(
        until("TPC").await,
        "new version read: {:?}",
        shared.current()
    );
    // A broken version is refused and the last good one stays.
    let refused = shared.rejected();
    assert!(refused >= 1, "the broken version in between was refused");
    put("o2: {broken: [\n".into()).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while shared.rejected() == refused && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        shared.rejected(),
        refused + 1,
        "the broken version was seen"
    );
    assert_eq!(detector().as_deref(), Some("TPC"), "last good version kept");
    stop.cancel();
    let _ = watch.await;
}

/// A critical call at `before_DEPLOY` (the anchor's `lhc.UpdateFillInfo()`) runs before any
/// Task is written: answered ok, the environment deploys; refused, the create fails naming
/// the call and no Task of it is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_call_before_deploy_gates_the_deployment() {
    let ns = TestNamespace::new("anchor-deploy").await;
    let suffix = support::random_suffix();
    let (ok_id, bad_id) = (format!("dep{suffix}"), format!("depbad{suffix}"));
    let lhc = integration("UpdateFillInfo").await;
    // One sim-runner selector covers one environment: the refused one never gets a pod.
    let stack = Stack::start(&ns, &ok_id, 55300, &[("lhc", lhc.url.clone())]).await;
    let mut api = stack.daemon.client().await;
    let vars = [("hosts", r#"["flp001"]"#), ("lhc_enabled", "true")];
    let c = fixture::create(&mut api, create(&ok_id, &vars)).await;
    assert_eq!(c.outcome, "reached", "{} {:?}", c.message, c.failures);
    let seen: Vec<serde_json::Value> = lhc.seen.lock().unwrap().clone();
    let deploy: Vec<&serde_json::Value> = seen.iter().filter(|v| v["event"] == "DEPLOY").collect();
    assert_eq!(deploy.len(), 1, "{seen:?}");
    assert_eq!(deploy[0]["function"], "UpdateFillInfo");
    assert_eq!(deploy[0]["trigger"], "before_DEPLOY-50");

    // The anchor's store lists flp001 under a detector: while ok_id holds it, a second
    // environment there is refused naming the detector and the holder, before any call.
    let busy = api
        .create_environment(create(&bad_id, &vars))
        .await
        .expect_err("the detector is in use");
    assert_eq!(busy.code(), tonic::Code::FailedPrecondition);
    assert!(
        busy.message().contains("is in use by environment") && busy.message().contains(&ok_id),
        "{}",
        busy.message()
    );
    let gone = fixture::destroy(&mut api, &ok_id, 90).await;
    assert!(gone.gone, "{ok_id}: {}", gone.message);

    lhc.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut req = create(&bad_id, &vars);
    req.timeout_seconds = 60;
    let started = std::time::Instant::now();
    let b = api
        .create_environment(req)
        .await
        .expect("create")
        .into_inner();
    assert_ne!(b.outcome, "reached", "{b:?}");
    let said = format!("{} {:?}", b.message, b.failures);
    assert!(
        said.contains("lhc") && said.contains("refused by the test"),
        "{said}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "reported after {:?}",
        started.elapsed()
    );
    let tasks: kube::Api<envbridge::crd::Task> = kube::Api::namespaced(ns.client.clone(), &ns.name);
    let written = tasks
        .list(&kube::api::ListParams::default())
        .await
        .expect("tasks")
        .items
        .into_iter()
        .filter(|t| t.spec.environment.contains(&bad_id))
        .count();
    assert_eq!(written, 0, "no Task of the refused deployment");
    let gone = fixture::destroy(&mut api, &bad_id, 90).await;
    assert!(gone.gone, "{bad_id}: {}", gone.message);
    stack.stop().await;
}

/// What the ControlGUI's create form sends for the anchor's readout-dataflow: every public
/// variable with a default, as listed for GetWorkflowTemplates (`detectors` left out, as the
/// form leaves it out), `hosts` chosen, as a caller without site rights. Accepted (the public
/// variables of the nested roles too), deployed, destroyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controlgui_s_create_of_the_anchor_s_readout_dataflow_is_accepted() {
    let ns = TestNamespace::new("anchor-gui").await;
    let id = format!("gui{}", support::random_suffix());
    let stack = Stack::start(&ns, &id, 55400, &[]).await;
    let bridge = stack.daemon.bridge.clone();
    let templates = envbridge::bridge::templates::list(&bridge.cfg).expect("the templates");
    let rd = templates
        .iter()
        .find(|t| t.name == "readout-dataflow")
        .expect("readout-dataflow listed");
    let mut variables: std::collections::BTreeMap<String, String> = rd
        .vars
        .iter()
        .filter(|d| d.meta.public && &*d.name != "detectors")
        .filter_map(|d| {
            let value = d.default.clone().or_else(|| {
                d.meta
                    .fields
                    .get("value")
                    .and_then(|v| v.as_str().map(str::to_string))
            })?;
            (!value.is_empty()).then(|| (d.name.to_string(), value))
        })
        .collect();
    let nested = ["dcs_sor_parameters", "dcs_eor_parameters"];
    for n in nested {
        assert!(
            variables.contains_key(n),
            "{n} among {:?}",
            variables.keys()
        );
    }
    assert!(variables.len() > 30, "{} public defaults", variables.len());
    variables.insert("hosts".into(), r#"["flp001","flp002"]"#.into());
    let spec = envbridge::bridge::CreateSpec {
        workflow: "readout-dataflow".into(),
        variables,
        idempotency_key: None,
        env_id: Some(id.clone()),
        site_variables: false,
    };
    let created = bridge.create(&spec).await.expect("the GUI's create");
    assert!(created.tasks >= 6, "{} tasks", created.tasks);
    let key = envbridge::roster::EnvKey::new(&created.namespace, &created.name);
    let up = bridge
        .roster
        .wait_state(
            &key,
            envbridge::state::State::Standby,
            tokio::time::Instant::now() + std::time::Duration::from_secs(120),
        )
        .await;
    assert!(
        matches!(up, Ok(envbridge::roster::Outcome::Reached { .. })),
        "{up:?}"
    );
    let mut api = stack.daemon.client().await;
    let gone = fixture::destroy(&mut api, &id, 90).await;
    assert!(gone.gone, "{id}: {}", gone.message);
    stack.stop().await;
}

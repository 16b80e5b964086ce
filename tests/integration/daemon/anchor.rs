//! The anchor's own workflow, unmodified (readout-dataflow of its ControlWorkflows, read from
//! ../shared), with a configuration store in the anchor's layout and the project's class ->
//! TaskTemplate mapping: created through the daemon, its tasks (readout, StfBuilder,
//! StfSender and its hook tasks) deployed, CONFIGURE -> START -> STOP -> RESET -> destroy with
//! simulators standing in for every process (basic and hook tasks run to completion).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use envbridge::server::pb;

use super::fixture::{self, Daemon, fixed_ns};
use super::{Child, WAIT, transition};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anchor_s_readout_dataflow_runs_its_cycle_through_the_daemon() {
    let ns = TestNamespace::new("anchor-e2e").await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    envbridge::install::crds(&ns.client).await.expect("CRDs");
    envbridge::install::task_templates(&ns.client, &root.join("task-templates"))
        .await
        .expect("TaskTemplates");
    let id = format!("anchor{}", support::random_suffix());
    let selector = format!("app.kubernetes.io/managed-by=envbridge,envbridge.dev/environment={id}");
    let _sim = Child(
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
    let op_stop = tokio_util::sync::CancellationToken::new();
    let operator = tokio::spawn(envbridge::operator::run(
        ns.client.clone(),
        envbridge::operator::OperatorArgs {
            namespace: Some(ns.name.clone()),
            no_leader_election: true,
            connect_timeout_seconds: 20,
            ..envbridge::operator::OperatorArgs::default()
        },
        op_stop.clone(),
    ));

    let shared = shared();
    let cw = shared.join("corpus/aliecs/controlworkflows");
    let mut cfg = fixed_ns(&ns.name);
    cfg.tasks_dir = cw.join("tasks");
    cfg.workflows_dir = cw.join("workflows");
    cfg.config_store = Some(shared.join("conformance/aliecs/caches/config.yaml"));
    cfg.templates = Some(root.join("site/templates.yaml"));
    // Nodes are shared with other tests' environments: ports of our own, away from theirs.
    cfg.control_ports = 55000..=55049;
    cfg.tcp_ports = 55050..=55099;
    let renderer = envbridge::bridge::render::renderer(&cfg);
    let d = Daemon::start(ns.client.clone(), cfg, renderer).await;
    let mut api = d.client().await;
    let variables = HashMap::from([
        ("hosts".to_string(), r#"["flp001","flp002"]"#.to_string()),
        ("drop_caches_enabled".to_string(), "true".to_string()),
        ("roc_cleanup_enabled".to_string(), "true".to_string()),
    ]);
    let c = fixture::create(
        &mut api,
        pb::CreateEnvironmentRequest {
            workflow: "readout-dataflow".into(),
            variables,
            env_id: id.clone(),
            wait: true,
            timeout_seconds: 120,
            ..Default::default()
        },
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
    for (event, args) in [
        ("CONFIGURE", &[][..]),
        ("START", &[("run_number", "7"), ("run_type", "PHYSICS")][..]),
        ("STOP", &[][..]),
        ("RESET", &[][..]),
    ] {
        let r = fixture::run_transition(&mut api, transition(&id, event, args)).await;
        assert!(r.ok, "{event}: {} {:?}", r.message, r.failures);
    }
    let gone = fixture::destroy(&mut api, &id, 90).await;
    assert!(gone.gone, "{id}: {}", gone.message);
    op_stop.cancel();
    let _ = tokio::time::timeout(WAIT, operator).await;
}

//! An environment's life through the daemon's API: create, transitions (a failure fails
//! the call at once, naming the task; a non-critical one does not), the roster's watch
//! events, and the cycle of a rendered readout-dataflow with the operator.

use super::*;

#[tokio::test]
async fn readout_dataflow_lifecycle_through_the_api() {
    let ns = Setup::shared("daemon-life").await;
    let _sim = ns.sim(SimConfig::default());
    let d = ns.daemon().await;
    let mut api = d.client().await;

    let key = format!("{}-run", ns.name);
    let created = fixture::create(&mut api, create_req(&key, "flp001,flp002,flp003", 47100)).await;
    assert!(created.created);
    assert_eq!((created.tasks, created.nodes), (9, 3));
    assert_eq!(created.outcome, "reached", "{}", created.message);

    // Its tasks are in the roster, with node, state and pod data.
    let env = fixture::get(&mut api, &created.id).await;
    assert_eq!(env.tasks.len(), 9);
    assert!(
        env.tasks
            .iter()
            .all(|t| t.state == "STANDBY" && t.pod_phase == "Running" && !t.pod_ip.is_empty())
    );
    let nodes: std::collections::BTreeSet<_> = env.tasks.iter().map(|t| t.node.as_str()).collect();
    assert_eq!(
        nodes.into_iter().collect::<Vec<_>>(),
        ["flp001", "flp002", "flp003"]
    );

    // A retried create (same idempotency key) returns the same environment, makes no second one.
    let again = fixture::create(&mut api, create_req(&key, "flp001,flp002,flp003", 47100)).await;
    assert!(!again.created);
    assert_eq!(again.id, created.id);
    assert_eq!(names::<Environment>(&ns.client, &ns.name).await.len(), 1);

    let run = [
        ("run_number", "4242"),
        ("run_type", "PHYSICS"),
        ("detector", "TPC"),
    ];
    for (event, args, target) in [
        ("CONFIGURE", &[][..], "CONFIGURED"),
        ("START", &run[..], "RUNNING"),
        ("STOP", &[][..], "CONFIGURED"),
        ("RESET", &[][..], "STANDBY"),
    ] {
        let r = fixture::run_transition(&mut api, transition(&created.id, event, args)).await;
        assert!(r.ok, "{event}: {} {:?}", r.message, r.failures);
        assert_eq!(
            (r.outcome.as_str(), r.tasks, r.target_state.as_str()),
            ("reached", 9, target)
        );
        let env = fixture::get(&mut api, &created.id).await;
        assert!(
            env.tasks
                .iter()
                .all(|t| t.state == target && t.transition_id == r.transition_id),
            "{event}"
        );
        if event == "START" {
            // The run arguments reached every task.
            let tasks: Api<Task> = ns.api();
            for t in tasks.list(&Default::default()).await.expect("tasks").items {
                let args = t.spec.transition.expect("transition on the task").arguments;
                assert_eq!(args.get("run_number").map(String::as_str), Some("4242"));
                assert_eq!(args.get("run_type").map(String::as_str), Some("PHYSICS"));
            }
        }
    }

    // An event that no task can take is refused before anything is written.
    let refused = api
        .transition(transition(&created.id, "STOP", &[]))
        .await
        .expect_err("STOP from STANDBY");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);

    // Kill one task: it is deleted, leaves the roster, and is not brought back.
    let victim = format!("{}-flp002-stfsender", created.id);
    assert!(fixture::kill(&mut api, &created.id, &victim).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!names::<Task>(&ns.client, &ns.name).await.contains(&victim));
    let env = fixture::get(&mut api, &created.id).await;
    assert_eq!((env.tasks.len(), env.tasks_expected), (8, 8));
    // ... and the environment still transitions without it.
    let r = fixture::run_transition(&mut api, transition(&created.id, "CONFIGURE", &[])).await;
    assert!(r.ok && r.tasks == 8, "{}", r.message);

    // Destroy: Environment, Tasks and TaskSets are gone.
    let gone = fixture::destroy(&mut api, &created.id, 60).await;
    assert!(gone.gone, "{}", gone.message);
    assert!(names::<Environment>(&ns.client, &ns.name).await.is_empty());
    assert!(names::<Task>(&ns.client, &ns.name).await.is_empty());
    assert!(names::<TaskSet>(&ns.client, &ns.name).await.is_empty());
    let listed = fixture::list(&mut api).await;
    assert!(listed.environments.is_empty(), "{:?}", listed.environments);

    // /healthz and /metrics answer on the HTTP listener.
    let http = |path: &'static str| {
        let addr = d.http;
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("http");
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        }
    };
    let health = http("/healthz").await;
    assert!(
        health.starts_with("HTTP/1.0 200") && health.contains("\"synced\":true"),
        "{health}"
    );
    let metrics = http("/metrics").await;
    assert!(metrics.contains("envbridge_roster_tasks"), "{metrics}");
    assert!(
        metrics.contains("envbridge_transitions_total{event=\"START\",outcome=\"reached\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_failing_configure_fails_the_call_at_once_naming_the_task() {
    let ns = Setup::shared("daemon-fail").await;
    let sim = ns.sim(SimConfig::default());
    let mut cfg = fixed_ns(&ns.name);
    cfg.transition_timeouts
        .insert(Event::Configure, Duration::from_secs(60));
    let d = ns.daemon_with(cfg).await;
    let mut api = d.client().await;
    let c = fixture::create(&mut api, create_req("", "flp001,flp002,flp003", 47100)).await;
    assert_eq!(c.outcome, "reached", "{}", c.message);

    let bad = format!("{}-flp002-stfbuilder", c.id);
    sim.fail(
        &bad,
        Event::Configure,
        "INIT DEVICE: channel readout refused the socket",
    );
    let mut req = transition(&c.id, "CONFIGURE", &[]);
    req.timeout_seconds = 0; // the configured 60 s: the answer must come long before
    let started = Instant::now();
    let r = fixture::run_transition(&mut api, req).await;
    let took = started.elapsed();
    assert!(!r.ok);
    assert_eq!(r.outcome, "failed");
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert_eq!(r.failures[0].task, bad);
    assert_eq!(
        r.failures[0].message,
        "INIT DEVICE: channel readout refused the socket"
    );
    assert!(r.message.contains(&bad));
    assert!(
        took < Duration::from_secs(2),
        "failure reported after {took:?}"
    );

    // The CLI prints the failing task and exits non-zero.
    sim.fail(&bad, Event::Recover, "still broken");
    let addr = format!("http://{}", d.grpc);
    let out = fixture::cli(&[
        "env",
        "transition",
        &c.id,
        "RECOVER",
        "--addr",
        &addr,
        "--timeout",
        "30",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {stdout} stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&bad) && stdout.contains("still broken"),
        "{stdout}"
    );

    // -o json from `env get` carries the tasks.
    let out = fixture::cli(&["env", "get", &c.id, "--addr", &addr, "-o", "json"]).await;
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["tasks"].as_array().map(Vec::len), Some(9));
    let bad_task = v["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"] == bad.as_str())
        .expect("bad task");
    assert_eq!(bad_task["state"], "ERROR");
}

#[tokio::test]
async fn a_non_critical_failure_is_reported_but_does_not_fail() {
    let ns = Setup::shared("daemon-soft").await;
    let sim = ns.sim(SimConfig::default());
    let d = ns.daemon().await;
    // Objects with one non-critical task, applied directly.
    let mut objs = fixture::readout_dataflow(
        "soft",
        &ns.tpl.prefix,
        &fixture::hosts(1),
        47300,
        &Default::default(),
    );
    objs.task_sets[0].spec.tasks[2].critical = false;
    let objs = envbridge::objects::pack(
        "soft",
        "soft",
        "readout-dataflow",
        objs.task_sets[0].spec.tasks.clone(),
    );
    fixture::apply_standby(&d, &ns.name, objs).await;
    let mut api = d.client().await;
    sim.fail("soft-flp001-stfsender", Event::Configure, "qc unavailable");
    let r = fixture::run_transition(&mut api, transition("soft", "CONFIGURE", &[])).await;
    assert!(r.ok, "{}", r.message);
    assert_eq!(r.warnings.len(), 1);
    assert_eq!(r.warnings[0].task, "soft-flp001-stfsender");
    assert!(!r.warnings[0].critical);
}

#[tokio::test]
async fn watch_events_stream_roster_changes() {
    let ns = Setup::shared("daemon-events").await;
    let _sim = ns.sim(SimConfig::default());
    let d = ns.daemon().await;
    let mut api = d.client().await;
    let mut stream = api
        .watch_events(pb::WatchEventsRequest {
            id: String::new(),
            snapshot: true,
        })
        .await
        .expect("watch")
        .into_inner();
    let c = fixture::create(&mut api, create_req("", "flp001", 48200)).await;
    let mut seen_env = false;
    let mut standby = std::collections::BTreeSet::new();
    let deadline = Instant::now() + WAIT;
    while standby.len() < 3 && Instant::now() < deadline {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an event")
            .expect("stream")
            .expect("event");
        if ev.env_name != c.name {
            continue;
        }
        seen_env |= ev.kind == "env-applied";
        if let Some(t) = ev.task.filter(|t| t.state == "STANDBY") {
            standby.insert(t.name);
        }
    }
    assert!(seen_env);
    assert_eq!(standby.len(), 3);
}

/// The real thing: the render core on our manifests, the operator, and one task simulator per
/// pod (`envbridge dev sim-runner`), driven through the daemon's API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_operator_a_rendered_readout_dataflow_runs_its_cycle_and_fails_fast() {
    let ns = TestNamespace::new("daemon-e2e").await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    envbridge::install::crds(&ns.client).await.expect("CRDs");
    envbridge::install::task_templates(&ns.client, &root.join("task-templates"))
        .await
        .expect("TaskTemplates");
    let suffix = support::random_suffix();
    let (ok_id, bad_id) = (format!("ok{suffix}"), format!("bad{suffix}"));

    let mut sims = Vec::new();
    for id in [&ok_id, &bad_id] {
        let selector =
            format!("app.kubernetes.io/managed-by=envbridge,envbridge.dev/environment={id}");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
            .args(["dev", "sim-runner", "--in-process", "--selector", &selector])
            .arg("--kubeconfig")
            .arg(&ns.info.kubeconfig)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("sim-runner");
        sims.push(Child(child));
    }
    let operator = fixture::Operator::start(ns.client.clone(), &ns.name);

    let mut cfg = fixed_ns(&ns.name);
    cfg.tasks_dir = root.join("control-workflows/tasks");
    cfg.workflows_dir = root.join("control-workflows/workflows");
    cfg.defaults_files = vec![root.join("site/local.yaml")];
    // Nodes are shared with other tests' environments: ports of our own, away from theirs.
    let base = 52000 + (u16::from_str_radix(&suffix[..4], 16).unwrap_or(0) % 100) * 100;
    cfg.control_ports = base..=base + 49;
    cfg.tcp_ports = base + 50..=base + 99;
    let renderer = envbridge::bridge::render::renderer(&cfg);
    let d = Daemon::start(ns.client.clone(), cfg, renderer).await;
    let mut api = d.client().await;
    let hosts = r#"["flp001","flp002","flp003"]"#;
    let create = |id: &str, extra: &[(&str, &str)]| {
        let mut variables = HashMap::from([("hosts".to_string(), hosts.to_string())]);
        variables.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        pb::CreateEnvironmentRequest {
            workflow: "readout-dataflow".into(),
            variables,
            env_id: id.to_string(),
            wait: true,
            timeout_seconds: 120,
            ..Default::default()
        }
    };
    let c = fixture::create(&mut api, create(&ok_id, &[])).await;
    assert_eq!(
        (c.outcome.as_str(), c.nodes),
        ("reached", 3),
        "{} {:?}",
        c.message,
        c.failures
    );
    let env = fixture::get(&mut api, &ok_id).await;
    assert_eq!(env.tasks.len() as u32, c.tasks);
    assert!(
        env.tasks
            .iter()
            .all(|t| t.state == "STANDBY" && t.pod_phase == "Running")
    );
    for (event, args) in [
        ("CONFIGURE", &[][..]),
        (
            "START",
            &[("run_number", "7"), ("run_type", "TECHNICAL")][..],
        ),
        ("STOP", &[][..]),
        ("RESET", &[][..]),
    ] {
        let r = fixture::run_transition(&mut api, transition(&ok_id, event, args)).await;
        assert!(r.ok, "{event}: {} {:?}", r.message, r.failures);
        assert_eq!(r.tasks, c.tasks);
    }

    // A task told to fail CONFIGURE (StfBuilder on flp002) fails the call at once, named.
    let b = api
        .create_environment(create(
            &bad_id,
            &[("sim_fail_host", "flp002"), ("sim_fail_on", "CONFIGURE")],
        ))
        .await
        .expect("create")
        .into_inner();
    assert_eq!(b.outcome, "reached", "{}", b.message);
    let mut req = transition(&bad_id, "CONFIGURE", &[]);
    req.timeout_seconds = 0;
    let started = Instant::now();
    let r = fixture::run_transition(&mut api, req).await;
    let took = started.elapsed();
    assert!(!r.ok && r.outcome == "failed", "{r:?}");
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert_eq!(r.failures[0].node, "flp002");
    assert!(r.failures[0].path.contains("stfb"), "{:?}", r.failures[0]);
    assert!(
        took < Duration::from_secs(2),
        "failure reported after {took:?}"
    );

    for id in [&ok_id, &bad_id] {
        let gone = fixture::destroy(&mut api, id, 90).await;
        assert!(gone.gone, "{id}: {}", gone.message);
    }
    operator.stop().await;
}

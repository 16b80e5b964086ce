//! Task pods on REAL nodes of the local plane: a kubelet and a containerd per node run the
//! envbridge image (`localhost/envbridge:dev`, built from this build), in which the anchor's
//! command paths start the task simulator. Nothing stands in for the kubelet here.

use envbridge::dev::realnode::{self, RealNodeState};
use kube::api::LogParams;

use super::*;

fn real_task(env: &str, host: &str, class: &str, n: u16, mode: ControlMode, cmd: &str) -> TaskRef {
    let mut t = task_ref(env, host, class, n, mode);
    t.command = cmd.into();
    t
}

/// The running real nodes (started with the plane when missing).
async fn real_nodes() -> Res<Vec<RealNodeState>> {
    crate::support::real_cluster().await;
    Ok(envbridge::dev::real_nodes()?)
}

fn node<'a>(nodes: &'a [RealNodeState], host: &str) -> &'a RealNodeState {
    nodes
        .iter()
        .find(|n| n.host == host)
        .unwrap_or_else(|| panic!("no real node {host} in {nodes:?}"))
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Pids of the node's pod processes whose command line starts with `argv0`.
fn pod_processes(n: &RealNodeState, argv0: &str) -> Vec<i32> {
    let cgroup = format!("{}/kubepods", n.layout().cgroup);
    realnode::teardown::processes(&cgroup)
        .into_iter()
        .filter(|p| cmdline(*p).starts_with(argv0))
        .collect()
}

fn ns_of(pid: &str, ns: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// One direct task (readout: a log file, privileged, hostIPC) and one FairMQ device on a real
/// node: the processes run in containers of the node's kubepods cgroup, as the template's
/// user, on the node's address; they reach STANDBY and follow a whole cycle; their logs come
/// from the kubelet; destroying the environment ends every container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_run_in_real_containers_and_follow_a_cycle() -> Res {
    let nodes = real_nodes().await?;
    let n1 = node(&nodes, "real001");
    let fx = fixture("real-cycle").await?;
    let op = start(&fx, None).await?;
    let tasks = vec![
        real_task(
            "er",
            "real001",
            "readout",
            1,
            ControlMode::Direct,
            "/opt/o2/bin/o2-readout-exe",
        ),
        real_task(
            "er",
            "real001",
            "stfbuilder-senderoutput",
            2,
            ControlMode::Fairmq,
            "/opt/o2/bin/StfBuilder",
        ),
    ];
    deploy(&fx, "er", &tasks, false).await?;
    let t0 = Instant::now();
    wait_env(&fx, "er", "STANDBY 2/2", |e| {
        state_is(State::Standby)(e)
            && e.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("2/2")
    })
    .await?;
    println!("create -> STANDBY on a real node: {:?}", t0.elapsed());

    // The processes: in containers (own mount namespace, the node's kubepods cgroup), on the
    // host's network and IPC namespaces as the templates ask, as uid 1100, with HOME.
    let readout = pod_processes(n1, "/opt/o2/bin/o2-readout-exe");
    let stfb = pod_processes(n1, "/opt/o2/bin/StfBuilder");
    assert_eq!(
        (readout.len(), stfb.len()),
        (1, 1),
        "processes {readout:?} {stfb:?}"
    );
    for pid in [readout[0], stfb[0]] {
        let p = pid.to_string();
        assert_ne!(ns_of(&p, "mnt"), ns_of("self", "mnt"), "not in a container");
        assert_eq!(ns_of(&p, "net"), ns_of("self", "net"), "hostNetwork");
        assert_eq!(ns_of(&p, "ipc"), ns_of("self", "ipc"), "hostIPC");
        let cg = std::fs::read_to_string(format!("/proc/{p}/cgroup"))?;
        assert!(cg.contains("kubepods"), "{cg}");
        let status = std::fs::read_to_string(format!("/proc/{p}/status"))?;
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or("");
        assert!(uid.split_whitespace().nth(1) == Some("1100"), "{uid}");
        let environ = std::fs::read(format!("/proc/{p}/environ"))?;
        let environ = String::from_utf8_lossy(&environ);
        assert!(
            environ.split('\0').any(|v| v.starts_with("HOME=/")),
            "no HOME"
        );
    }
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let pod = pods.get(&tasks[0].name).await?;
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    assert_eq!(
        ip,
        n1.ip.to_string(),
        "a host-network pod has the node's address"
    );

    for (id, event, target) in [
        ("c1", Event::Configure, State::Configured),
        ("s1", Event::Start, State::Running),
        ("p1", Event::Stop, State::Configured),
        ("r1", Event::Reset, State::Standby),
    ] {
        let took = transition_succeeds(&fx, "er", id, event).await?;
        println!("{event} on a real node: {took:?}");
        wait_env(&fx, "er", &format!("{target}"), state_is(target)).await?;
    }

    // Logs are the kubelet's: the container's own output, and the readout log file.
    let log = pods.logs(&tasks[0].name, &LogParams::default()).await?;
    assert!(
        log.contains(&format!("listening on {}:{}", n1.ip, tasks[0].control_port)),
        "kubelet log: {log}"
    );
    let want = format!("listening on {}:{}", n1.ip, tasks[0].control_port);
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .args(["logs", "er", &tasks[0].name, "-n", &fx.ns])
        .arg(format!("--kubeconfig={}", fx.kubeconfig.display()))
        .output()?;
    let cli_out = String::from_utf8_lossy(&cli.stdout);
    assert!(
        cli.status.success() && cli_out.contains(&want),
        "envbridge logs: {cli:?}"
    );
    let info = crate::support::cluster().await;
    let kubectl = std::process::Command::new(&info.kubectl)
        .arg(format!("--kubeconfig={}", info.kubeconfig.display()))
        .args(["logs", "-n", &fx.ns, &tasks[0].name])
        .output()?;
    assert!(
        String::from_utf8_lossy(&kubectl.stdout).contains(&want),
        "kubectl logs: {kubectl:?}"
    );
    let file = std::fs::read_to_string("/tmp/envbridge-readout.log")?;
    assert!(file.contains(&format!("{}:{}", n1.ip, tasks[0].control_port)));

    destroy(&fx, "er").await?;
    let deadline = Instant::now() + WAIT;
    loop {
        let left: Vec<i32> = pod_processes(n1, "/opt/o2/bin/o2-readout-exe")
            .into_iter()
            .chain(pod_processes(n1, "/opt/o2/bin/StfBuilder"))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "containers left after destroy: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    op.stop().await?;
    finish(fx).await
}

/// A container that exits fails its Task with the exit code (the simulator exits 70 on an
/// injected crash); an image the node lacks, or a mount the kubelet refuses, fails its Task
/// at start-up with the kubelet's own words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_exit_and_a_missing_image_fail_their_tasks_with_the_kubelets_words() -> Res {
    real_nodes().await?;
    let fx = fixture("real-fail").await?;
    let absent = format!("absent-{}", crate::support::random_suffix());
    let templates: Api<TaskTemplate> = Api::all(fx.admin.clone());
    let tt: TaskTemplate = serde_json::from_value(json!({
        "apiVersion": "envbridge.dev/v1alpha1", "kind": "TaskTemplate",
        "metadata": {"name": absent},
        "spec": {"controlMode": "direct", "pod": {"hostNetwork": true, "hostIPC": true, "containers": [
            {"name": "t", "image": "localhost/envbridge:absent", "imagePullPolicy": "Never"}]}}
    }))?;
    templates.create(&Default::default(), &tt).await?;
    // A mount the kubelet refuses: a hostPath of type Directory that does not exist.
    let refused = format!("refused-{}", crate::support::random_suffix());
    let tt: TaskTemplate = serde_json::from_value(json!({
        "apiVersion": "envbridge.dev/v1alpha1", "kind": "TaskTemplate",
        "metadata": {"name": refused},
        "spec": {"controlMode": "direct", "pod": {"hostNetwork": true, "hostIPC": true,
            "containers": [{"name": "t", "image": envbridge::dev::image::IMAGE,
                "volumeMounts": [{"name": "gone", "mountPath": "/gone"}]}],
            "volumes": [{"name": "gone",
                "hostPath": {"path": "/nonexistent/envbridge-test", "type": "Directory"}}]}}
    }))?;
    templates.create(&Default::default(), &tt).await?;
    let op = start_with(
        &fx,
        OperatorArgs {
            // The refused mount is reported with the kubelet's events once the pod is
            // not Running after this long.
            startup_timeout_seconds: 15,
            ..args(&fx.ns, None)
        },
    )
    .await?;
    let mut crash = real_task(
        "ex",
        "real002",
        "readout",
        1,
        ControlMode::Direct,
        "/opt/o2/bin/o2-readout-exe",
    );
    crash.env.push(EnvVar {
        name: "ENVBRIDGE_SIM_CRASH_ON".into(),
        value: "START".into(),
    });
    let mut missing = real_task(
        "ex",
        "real002",
        "readout",
        2,
        ControlMode::Direct,
        "/opt/o2/bin/o2-task",
    );
    missing.template = absent.clone();
    missing.critical = false;
    let mut mount = real_task(
        "ex",
        "real002",
        "readout",
        3,
        ControlMode::Direct,
        "/opt/o2/bin/o2-task",
    );
    mount.template = refused.clone();
    mount.critical = false;
    deploy(&fx, "ex", &[crash.clone(), missing.clone()], false).await?;
    // The refused mount in an environment of its own: its start-up timeout never races the
    // other environment's transitions.
    mount.name = format!("em-{}", mount.name);
    mount.id = mount.name.clone();
    deploy(&fx, "em", std::slice::from_ref(&mount), false).await?;

    let tasks: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let deadline = Instant::now() + WAIT;
    let message = loop {
        let ts = tasks
            .get_opt(&missing.name)
            .await?
            .and_then(|t| t.status)
            .unwrap_or_default();
        if ts.state == Some(State::Error) {
            break ts.message.unwrap_or_default();
        }
        assert!(
            Instant::now() < deadline,
            "missing image never failed its task: {ts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(message.contains("ErrImageNeverPull"), "{message}");
    assert!(message.contains("localhost/envbridge:absent"), "{message}");
    let deadline = Instant::now() + WAIT;
    let message = loop {
        let ts = tasks
            .get_opt(&mount.name)
            .await?
            .and_then(|t| t.status)
            .unwrap_or_default();
        if ts.state == Some(State::Error) {
            break format!("{} {:?}", ts.message.unwrap_or_default(), ts.pod_events);
        }
        assert!(
            Instant::now() < deadline,
            "the refused mount never failed its task: {ts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(message.contains("FailedMount"), "{message}");
    assert!(message.contains("/nonexistent/envbridge-test"), "{message}");

    wait_env(&fx, "ex", "the crashing task in STANDBY", |e| {
        e.status
            .as_ref()
            .and_then(|s| s.counts.get(&State::Standby))
            == Some(&1)
    })
    .await?;
    transition(&fx, "ex", "c1", Event::Configure).await?;
    wait_transition(&fx, "ex", "c1").await?;
    transition(&fx, "ex", "s1", Event::Start).await?;
    let env = wait_env(&fx, "ex", "ERROR", state_is(State::Error)).await?;
    let st = env.status.unwrap();
    let f = st
        .failing_tasks
        .iter()
        .find(|f| f.name == crash.name)
        .unwrap_or_else(|| panic!("crashed task not named: {:?}", st.failing_tasks));
    // The container's own exit, as the kubelet reports it: the Task says the code, and its
    // pod ends Failed (restartPolicy Never).
    let deadline = Instant::now() + WAIT;
    let mut ts = tasks.get(&crash.name).await?.status.unwrap_or_default();
    while !(ts
        .message
        .as_deref()
        .unwrap_or("")
        .contains("exited with code 70")
        && ts.pod_phase.as_deref() == Some("Failed"))
    {
        assert!(
            Instant::now() < deadline,
            "no exit code on the task: {ts:?} ({f:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        ts = tasks.get(&crash.name).await?.status.unwrap_or_default();
    }

    // destroy() waits for the whole namespace to be empty: both environments go.
    Api::<Environment>::namespaced(fx.admin.clone(), &fx.ns)
        .delete("em", &DeleteParams::default())
        .await?;
    destroy(&fx, "ex").await?;
    templates.delete(&absent, &DeleteParams::default()).await?;
    templates.delete(&refused, &DeleteParams::default()).await?;
    op.stop().await?;
    finish(fx).await
}

/// Two faults of one node, RUNNING: first its kubelet stops alone (its containers keep
/// answering): the Node goes NotReady, but no task is failed and a transition still goes
/// through; then the node is lost (kubelet, containerd and containers all stopped, as when a
/// machine dies): its tasks and the environment fail within 45 s, named. The node is started
/// again afterwards for the tests that follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_stopped_alone_fails_nothing_and_a_node_lost_fails_its_tasks_within_45_s() -> Res
{
    let nodes = real_nodes().await?;
    let n3 = node(&nodes, "real003").clone();
    let fx = fixture("real-lost").await?;
    let op = start(&fx, None).await?;
    let tasks: Vec<TaskRef> = (1..=2)
        .map(|n| {
            real_task(
                "el",
                "real003",
                "readout",
                n,
                ControlMode::Direct,
                "/opt/o2/bin/o2-readout-exe",
            )
        })
        .collect();
    deploy(&fx, "el", &tasks, false).await?;
    wait_env(&fx, "el", "STANDBY", state_is(State::Standby)).await?;
    for (id, event) in [("c1", Event::Configure), ("s1", Event::Start)] {
        transition_succeeds(&fx, "el", id, event).await?;
    }
    wait_env(&fx, "el", "RUNNING", state_is(State::Running)).await?;

    // The kubelet alone: the Node goes NotReady (the controller-manager's grace period) while
    // the containers keep answering their control connections.
    realnode::stop_kubelet(&n3);
    let nodes_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(fx.admin.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = nodes_api
            .get(&n3.name)
            .await?
            .status
            .and_then(|s| s.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status);
        if ready.as_deref() != Some("True") {
            break;
        }
        assert!(Instant::now() < deadline, "{} never went NotReady", n3.name);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // A few more heartbeats' worth: nothing may fail meanwhile.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let env = Api::<Environment>::namespaced(fx.admin.clone(), &fx.ns)
        .get("el")
        .await?;
    let st = env.status.clone().unwrap_or_default();
    assert_eq!(st.state, Some(State::Running), "{st:?}");
    assert!(st.failing_tasks.is_empty(), "{:?}", st.failing_tasks);
    let took = transition_succeeds(&fx, "el", "p1", Event::Stop).await?;
    println!("STOP with the node's kubelet down (Node NotReady): {took:?}");
    transition_succeeds(&fx, "el", "s2", Event::Start).await?;

    let lost = Instant::now();
    let left = tokio::task::spawn_blocking(move || realnode::stop(&n3)).await?;
    assert!(left.is_empty(), "the lost node left {left:?}");
    let env = wait_env(&fx, "el", "ERROR with both tasks named", |e| {
        state_is(State::Error)(e)
            && e.status.as_ref().is_some_and(|s| {
                tasks
                    .iter()
                    .all(|t| s.failing_tasks.iter().any(|f| f.name == t.name))
            })
    })
    .await?;
    let took = lost.elapsed();
    println!("node lost -> environment ERROR with its tasks named: {took:?}");
    assert!(took < Duration::from_secs(45), "took {took:?}");
    assert!(env.status.is_some());

    // Bring the node back for whoever comes next; the environment goes with the namespace.
    let spec = envbridge::dev::UpSpec {
        nodes: crate::support::NODES,
        real_nodes: crate::support::REAL_NODES,
        exe: Some(env!("CARGO_BIN_EXE_envbridge").into()),
        ..Default::default()
    };
    envbridge::dev::ensure_up_with(&spec).await?;
    destroy(&fx, "el").await?;
    op.stop().await?;
    finish(fx).await
}

//! Live run control through the daemon and the operator, with one simulator process per pod:
//! a task that moves itself to ERROR while RUNNING, and a task process killed while RUNNING,
//! both reach the Environment and the daemon's WatchEvents without any transition; a destroy
//! takes running tasks out the anchor's way (STOP, RESET, EXIT / END) before their pods go.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envbridge::control::{ControlClient, TaskEndpoint};
use envbridge::crd::Task;
use envbridge::plan::ControlMode;
use envbridge::server::pb;
use futures::StreamExt;
use kube::Api;

use super::fixture;
use super::stack::Stack;
use super::transition;
use crate::support::{self, TestNamespace};

/// How long a live failure may take to show in the test (the benchmark measures the figure).
const SEEN_WITHIN: Duration = Duration::from_secs(20);

fn create(id: &str, extra: &[(&str, &str)]) -> pb::CreateEnvironmentRequest {
    let mut variables = HashMap::from([("hosts".to_string(), r#"["flp001","flp002"]"#.into())]);
    variables.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    pb::CreateEnvironmentRequest {
        workflow: "readout-dataflow".into(),
        variables,
        env_id: id.to_string(),
        wait: true,
        timeout_seconds: 120,
        ..Default::default()
    }
}

/// Creates environment `id`, whose StfBuilder (a FairMQ device) on flp002 moves itself to
/// ERROR 3 s into RUNNING.
async fn create_failing_when_running(
    api: &mut envbridge::server::pb::env_bridge_client::EnvBridgeClient<tonic::transport::Channel>,
    id: &str,
) {
    let fails = [("sim_fail_host", "flp002"), ("sim_fail_in", "RUNNING=3s")];
    let c = fixture::create(api, create(id, &fails)).await;
    assert_eq!(c.outcome, "reached", "{}", c.message);
}

/// The task [`create_failing_when_running`] makes fail: the StfBuilder on flp002.
async fn the_failing_task(tasks: &Api<Task>) -> String {
    tasks
        .list(&Default::default())
        .await
        .expect("tasks")
        .items
        .into_iter()
        .find(|t| t.spec.task.class.contains("stfbuilder") && t.spec.task.node == "flp002")
        .and_then(|t| t.metadata.name)
        .expect("stfbuilder on flp002")
}

/// Waits until the environment shows ERROR with `task` failing; returns the failure's message
/// and how long it took.
async fn until_error(
    api: &mut envbridge::server::pb::env_bridge_client::EnvBridgeClient<tonic::transport::Channel>,
    id: &str,
    task: &str,
) -> (String, Duration) {
    let started = Instant::now();
    loop {
        let env = fixture::get(api, id).await;
        if env.state == "ERROR"
            && let Some(f) = env.failing.iter().find(|f| f.task == task)
        {
            return (f.message.clone(), started.elapsed());
        }
        assert!(
            started.elapsed() < SEEN_WITHIN,
            "{id}: no ERROR naming {task} within {SEEN_WITHIN:?}: state {} failing {:?}",
            env.state,
            env.failing
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether environment `id`'s spec asks GO_ERROR.
async fn go_error_asked(envs: &Api<envbridge::crd::Environment>, id: &str) -> bool {
    envs.list(&Default::default())
        .await
        .expect("environments")
        .items
        .iter()
        .any(|e| {
            e.spec.id == id
                && e.spec
                    .transition
                    .as_ref()
                    .is_some_and(|t| t.event == envbridge::state::Event::GoError)
        })
}

/// Waits until GO_ERROR is asked for `id`, at most [`SEEN_WITHIN`] after `since` (what the
/// test just did), and prints how long it took.
async fn until_go_error_asked(envs: &Api<envbridge::crd::Environment>, id: &str, since: &str) {
    let started = Instant::now();
    while !go_error_asked(envs, id).await {
        assert!(
            started.elapsed() < SEEN_WITHIN,
            "{id}: no GO_ERROR asked within {SEEN_WITHIN:?} after {since}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("GO_ERROR asked {:?} after {since}", started.elapsed());
}

/// WatchEvents delivers the task's ERROR (no transition asked for it).
async fn watch_sees_error(
    events: &mut (impl futures::Stream<Item = Result<pb::RosterEvent, tonic::Status>> + Unpin),
    task: &str,
) {
    let deadline = Instant::now() + SEEN_WITHIN;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, events.next())
            .await
            .unwrap_or_else(|_| panic!("WatchEvents: no ERROR of {task} within {SEEN_WITHIN:?}"))
            .expect("stream open")
            .expect("event");
        if let Some(t) = ev.task
            && t.name == task
            && t.state == "ERROR"
        {
            assert!(!t.message.is_empty(), "the event says why: {t:?}");
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_between_transitions_reach_the_environment_and_watch_events() {
    let ns = TestNamespace::new("daemon-live").await;
    let suffix = support::random_suffix();
    let (self_id, kill_id) = (format!("self{suffix}"), format!("kill{suffix}"));
    let ports = 54000 + (u16::from_str_radix(&suffix[..4], 16).unwrap_or(0) % 100) * 100;
    let stack = Stack::start(&ns, &[&self_id, &kill_id], ports, None).await;
    let mut api = stack.daemon.client().await;
    let mut events = api
        .watch_events(pb::WatchEventsRequest {
            id: String::new(),
            snapshot: false,
        })
        .await
        .expect("WatchEvents")
        .into_inner();

    create_failing_when_running(&mut api, &self_id).await;
    let k = fixture::create(&mut api, create(&kill_id, &[])).await;
    assert_eq!(k.outcome, "reached", "{}", k.message);
    for id in [&self_id, &kill_id] {
        for (ev, args) in [
            ("CONFIGURE", &[][..]),
            ("START", &[("run_number", "7"), ("k", "v")][..]),
        ] {
            let r = fixture::run_transition(&mut api, transition(id, ev, args)).await;
            assert!(r.ok, "{id} {ev}: {} {:?}", r.message, r.failures);
        }
    }
    let tasks: Api<Task> = Api::namespaced(ns.client.clone(), &ns.name);
    let all = tasks.list(&Default::default()).await.expect("tasks");
    let named = |env: &str, class: &str| {
        all.items
            .iter()
            .find(|t| {
                t.spec.environment.ends_with(env)
                    && t.spec.task.class.contains(class)
                    && t.spec.task.node == "flp002"
            })
            .unwrap_or_else(|| panic!("{env}: no {class} task on flp002"))
            .clone()
    };

    let stfb = named(&self_id, "stfbuilder");
    let stfb_name = stfb.metadata.name.clone().unwrap_or_default();
    let (why, took) = until_error(&mut api, &self_id, &stfb_name).await;
    eprintln!("self-inflicted ERROR seen on the Environment {took:?} after START returned: {why}");
    assert!(why.contains("RUNNING"), "{why}");
    watch_sees_error(&mut events, &stfb_name).await;

    // The anchor's way out: the daemon requests GO_ERROR by itself; the tasks still RUNNING
    // are stopped (STOP), the failed one stays ERROR, the environment stays ERROR.
    let envs: Api<envbridge::crd::Environment> = Api::namespaced(ns.client.clone(), &ns.name);
    let started = Instant::now();
    loop {
        let all = tasks.list(&Default::default()).await.expect("tasks");
        let mine: Vec<&Task> = all
            .items
            .iter()
            .filter(|t| t.spec.environment.ends_with(&self_id))
            .collect();
        let go_error = go_error_asked(&envs, &self_id).await;
        let stopped = mine.iter().all(|t| {
            let st = t.status.as_ref().and_then(|s| s.state);
            if t.metadata.name.as_deref() == Some(stfb_name.as_str()) {
                st == Some(envbridge::state::State::Error)
            } else {
                st == Some(envbridge::state::State::Configured)
            }
        });
        if go_error && stopped && !mine.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < SEEN_WITHIN,
            "no GO_ERROR, or tasks not stopped: go_error {go_error}, states {:?}",
            mine.iter()
                .map(|t| (
                    t.metadata.name.clone(),
                    t.status.as_ref().and_then(|s| s.state)
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let env = fixture::get(&mut api, &self_id).await;
    assert_eq!(env.state, "ERROR");

    // The readout process (direct mode) on flp002 of the other environment is killed.
    let readout = named(&kill_id, "readout");
    let ip = readout
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    let addr = SocketAddr::new(ip.parse().expect("ip"), readout.spec.task.control_port);
    let (state, pid) = ControlClient::default()
        .get_state(
            &TaskEndpoint::new(addr, ControlMode::Direct),
            Duration::from_secs(5),
        )
        .await
        .expect("GetState of the readout simulator");
    assert_eq!(state.to_string(), "RUNNING");
    assert!(pid > 1);
    let killed = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let readout_name = readout.metadata.name.clone().unwrap_or_default();
    let (why, _) = until_error(&mut api, &kill_id, &readout_name).await;
    eprintln!(
        "killed process seen on the Environment {:?} after the kill: {why}",
        killed.elapsed()
    );
    assert!(
        why.contains("control connection lost while RUNNING"),
        "{why}"
    );
    watch_sees_error(&mut events, &readout_name).await;

    // Destroy takes the running tasks out first: STOP, RESET, EXIT (direct) / END (FairMQ).
    let out = named(&kill_id, "stfbuilder");
    let out_name = out.metadata.name.clone().unwrap_or_default();
    let other_readout = all
        .items
        .iter()
        .find(|t| {
            t.spec.environment.ends_with(&kill_id)
                && t.spec.task.class.contains("readout")
                && t.spec.task.node == "flp001"
        })
        .and_then(|t| t.metadata.name.clone())
        .expect("readout on flp001");
    // START carried `runNumber=7` (the key real processes read) and `k=v`; CONFIGURE the
    // task's properties and channels.
    let log = stack.sim_log(&ns.name, &other_readout);
    let section = |event: &str| -> String {
        let start = log
            .find(&format!("received transition {event} "))
            .unwrap_or_else(|| panic!("no {event} in:\n{log}"));
        let rest = &log[start + 1..];
        let end = rest.find("received transition").map_or(rest.len(), |e| e);
        rest[..end].to_string()
    };
    let start = section("START");
    assert!(start.contains("argument runNumber = 7"), "{start}");
    assert!(start.contains("argument k = v"), "{start}");
    assert!(start.contains("argument cleanup = 0"), "{start}");
    let configure = section("CONFIGURE");
    assert!(
        configure.contains("argument environment_id = "),
        "{configure}"
    );
    assert!(
        configure.contains("argument chans.readout.0.address = "),
        "{configure}"
    );
    assert!(!configure.contains("runNumber"), "{configure}");
    for id in [&self_id, &kill_id] {
        let gone = fixture::destroy(&mut api, id, 90).await;
        assert!(gone.gone, "{id}: {}", gone.message);
    }
    let direct = stack.sim_log(&ns.name, &other_readout);
    let stop = &direct[direct.find("received transition STOP ").expect("STOP")..];
    let stop = &stop[..stop[1..]
        .find("received transition")
        .map_or(stop.len(), |e| e + 1)];
    assert!(
        stop.contains("received transition STOP in RUNNING (0 arguments"),
        "{stop}"
    );
    assert!(
        !stop.contains("runNumber") && !stop.contains("argument k"),
        "{stop}"
    );
    let order: Vec<&str> = ["transition STOP", "transition RESET", "transition EXIT"]
        .into_iter()
        .filter(|w| direct.contains(&format!("received {w}")))
        .collect();
    assert_eq!(order.len(), 3, "readout's simulator log:\n{direct}");
    let fmq = stack.sim_log(&ns.name, &out_name);
    for step in ["STOP", "RESET TASK", "RESET DEVICE", "END"] {
        assert!(
            fmq.contains(&format!("received transition {step} ")),
            "StfBuilder's simulator did not receive {step}:\n{fmq}"
        );
    }
    stack.stop().await;
}

/// The automatic GO_ERROR whose request the apiserver refuses (as it refuses every write while
/// it or etcd is down) is asked again once writes pass: the environment is not left ERROR with
/// its other tasks RUNNING. The refusal is real: a ValidatingAdmissionPolicy denying
/// Environment updates that ask GO_ERROR in the test's namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_automatic_go_error_is_asked_again_once_writes_pass() {
    let ns = TestNamespace::new("daemon-go-error").await;
    let suffix = support::random_suffix();
    let id = format!("goerr{suffix}");
    // Beside the other live test's ranges (ports..ports+49).
    let ports = 54050 + (u16::from_str_radix(&suffix[..4], 16).unwrap_or(0) % 100) * 100;
    let stack = Stack::start(&ns, &[&id], ports, None).await;
    let mut api = stack.daemon.client().await;
    create_failing_when_running(&mut api, &id).await;
    let policy = ns.name.clone();
    let go_error = "has(object.spec.transition) && object.spec.transition.event == 'GO_ERROR'";
    support::refusal::refuse_updates(&ns.client, &ns.name, &policy, "environments", go_error)
        .await
        .expect("refusal");
    for (ev, args) in [
        ("CONFIGURE", &[][..]),
        ("START", &[("run_number", "8")][..]),
    ] {
        let r = fixture::run_transition(&mut api, transition(&id, ev, args)).await;
        assert!(r.ok, "{id} {ev}: {} {:?}", r.message, r.failures);
    }
    let tasks: Api<Task> = Api::namespaced(ns.client.clone(), &ns.name);
    let failed = the_failing_task(&tasks).await;
    until_error(&mut api, &id, &failed).await;
    let envs: Api<envbridge::crd::Environment> = Api::namespaced(ns.client.clone(), &ns.name);
    // Long enough for the leader to ask, be refused, and ask again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !go_error_asked(&envs, &id).await,
        "the refusal did not hold"
    );

    support::refusal::lift(&ns.client, &policy)
        .await
        .expect("lift");
    until_go_error_asked(&envs, &id, "writes passed again").await;
    let gone = fixture::destroy(&mut api, &id, 90).await;
    assert!(gone.gone, "{id}: {}", gone.message);
    stack.stop().await;
}

/// The leader gone between a critical task's failure and its automatic GO_ERROR: a replica
/// that stood by all along (its roster fed by its own watches) leads next and asks it. The
/// leader is "killed" by taking its lease away just after START (it can ask nothing after),
/// the task fails 3 s into RUNNING, and the standby is made leader once the failure shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_leader_asks_the_go_error_its_dead_predecessor_did_not() {
    use std::sync::atomic::Ordering;
    let ns = TestNamespace::new("daemon-go-error-next").await;
    let suffix = support::random_suffix();
    let id = format!("gonext{suffix}");
    // Offsets 25-35 and 75-85 of a hundred: beside the other live tests' ranges, whatever
    // their suffixes (each uses the first ports of its two halves).
    let ports = 54025 + (u16::from_str_radix(&suffix[..4], 16).unwrap_or(0) % 100) * 100;
    let stack = Stack::start(&ns, &[&id], ports, None).await;
    let standby = stack.another_daemon().await;
    standby.bridge.leader_flag().store(false, Ordering::Release);
    let mut api = stack.daemon.client().await;
    create_failing_when_running(&mut api, &id).await;
    for (ev, args) in [
        ("CONFIGURE", &[][..]),
        ("START", &[("run_number", "9")][..]),
    ] {
        let r = fixture::run_transition(&mut api, transition(&id, ev, args)).await;
        assert!(r.ok, "{id} {ev}: {} {:?}", r.message, r.failures);
    }
    stack
        .daemon
        .bridge
        .leader_flag()
        .store(false, Ordering::Release);
    let tasks: Api<Task> = Api::namespaced(ns.client.clone(), &ns.name);
    let failed = the_failing_task(&tasks).await;
    let mut reads = standby.client().await;
    until_error(&mut reads, &id, &failed).await;
    let envs: Api<envbridge::crd::Environment> = Api::namespaced(ns.client.clone(), &ns.name);
    // Long enough for either replica to have asked, had it led.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !go_error_asked(&envs, &id).await,
        "asked with no leader: the test shows nothing"
    );

    standby.bridge.leader_flag().store(true, Ordering::Release);
    until_go_error_asked(&envs, &id, "the standby led").await;
    let gone = fixture::destroy(&mut reads, &id, 90).await;
    assert!(gone.gone, "{id}: {}", gone.message);
    stack.stop().await;
}

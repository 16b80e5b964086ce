//! Task control protocol end to end on 127.0.0.1: the real client against the task simulator
//! (as a child process, as the demo and the local control plane run it, or in-process for
//! the many-task case). No cluster needed.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envbridge::control::sim::{self, SimConfig, SimMode, Simulator};
use envbridge::control::{self, ControlClient, ControlError, TaskEndpoint};
use envbridge::plan::ControlMode;
use envbridge::state::{Event, State};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const DEADLINE: Duration = Duration::from_secs(5);

/// A task simulator child process and everything it logged so far.
pub(super) struct SimProc {
    pub(super) child: Child,
    pub(super) addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl SimProc {
    pub(super) async fn start(args: &[&str], env: &[(&str, &str)]) -> SimProc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_envbridge"));
        cmd.arg("task-sim")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(args);
        for v in [
            "RUST_LOG",
            "OCC_CONTROL_PORT",
            "ENVBRIDGE_SIM_MODE",
            "ENVBRIDGE_SIM_DELAY",
            "ENVBRIDGE_SIM_FAIL_ON",
            "ENVBRIDGE_SIM_CRASH_ON",
            "ENVBRIDGE_SIM_HANG_ON",
            "ENVBRIDGE_SIM_STUCK_ON",
        ] {
            cmd.env_remove(v);
        }
        cmd.envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn envbridge task-sim");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sink = log.clone();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.split("listening on ").nth(1)
                    && let Some(tx) = tx.take()
                {
                    let addr: SocketAddr = rest.split_whitespace().next().unwrap().parse().unwrap();
                    let _ = tx.send(addr);
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = tokio::time::timeout(Duration::from_secs(20), rx)
            .await
            .expect("simulator did not say where it listens within 20 s")
            .expect("simulator exited before listening");
        SimProc { child, addr, log }
    }

    pub(super) fn ep(&self, mode: ControlMode) -> TaskEndpoint {
        TaskEndpoint::new(self.addr, mode)
    }

    pub(super) fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Lines mentioning `needle`, in order.
    pub(super) fn lines_with(&self, needle: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }
}

fn args(kv: &[(&str, &str)]) -> Vec<(String, String)> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn direct_lifecycle_configure_start_stop_reset() {
    let ctl = ControlClient::default();
    let sim = SimProc::start(&["--mode", "direct", "--delay", "20ms"], &[]).await;
    let ep = sim.ep(ControlMode::Direct);
    let (state, pid) = ctl.get_state(&ep, DEADLINE).await.unwrap();
    assert_eq!(state, State::Standby);
    assert_eq!(Some(pid), sim.child.id());

    let mut at = State::Standby;
    for (event, want, a) in [
        (
            Event::Configure,
            State::Configured,
            args(&[("chans.out.0.address", "ipc://@x-1")]),
        ),
        (Event::Start, State::Running, args(&[("run_number", "42")])),
        (Event::Stop, State::Configured, vec![]),
        (Event::Reset, State::Standby, vec![]),
    ] {
        at = ctl.transition(&ep, at, event, &a, DEADLINE).await.unwrap();
        assert_eq!(at, want, "after {event}");
        assert_eq!(ctl.get_state(&ep, DEADLINE).await.unwrap().0, want);
    }
    // The simulator logged each event it received, once, in order.
    let got: Vec<String> = sim.lines_with("received transition");
    assert_eq!(got.len(), 4, "{}", sim.log_text());
    for (line, ev) in got.iter().zip(["CONFIGURE", "START", "STOP", "RESET"]) {
        assert!(line.contains(&format!("transition {ev} ")), "{line}");
    }
    // An event that does not apply is refused before anything is sent.
    let e = ctl
        .transition(&ep, State::Standby, Event::Stop, &[], DEADLINE)
        .await
        .unwrap_err();
    assert!(matches!(e, ControlError::NotApplicable { .. }), "{e}");
    // A wrong source state is the task's own refusal (INVALID_ARGUMENT), not a silent success.
    let e = ctl
        .transition(&ep, State::Configured, Event::Start, &[], DEADLINE)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("state mismatch"), "{e}");
}

#[tokio::test]
async fn fairmq_configure_is_the_multi_step_sequence_in_the_simulator_log() {
    let ctl = ControlClient::default();
    let sim = SimProc::start(&["--mode", "fairmq", "--verbose"], &[]).await;
    let ep = sim.ep(ControlMode::Fairmq);
    assert_eq!(
        ctl.get_state(&ep, DEADLINE).await.unwrap().0,
        State::Standby
    );
    let a = args(&[
        ("chans.data.0.address", "tcp://*:5555"),
        ("chans.data.numSockets", "1"),
    ]);
    let s = ctl
        .transition(&ep, State::Standby, Event::Configure, &a, DEADLINE)
        .await
        .unwrap();
    assert_eq!(s, State::Configured);
    let s = ctl
        .transition(
            &ep,
            s,
            Event::Start,
            &args(&[("run_number", "7")]),
            DEADLINE,
        )
        .await
        .unwrap();
    assert_eq!(s, State::Running);
    let s = ctl
        .transition(&ep, s, Event::Stop, &[], DEADLINE)
        .await
        .unwrap();
    let s = ctl
        .transition(&ep, s, Event::Reset, &[], DEADLINE)
        .await
        .unwrap();
    assert_eq!(s, State::Standby);

    let steps: Vec<String> = sim
        .lines_with("received transition")
        .iter()
        .map(|l| {
            let after = l.split("received transition ").nth(1).unwrap();
            after.split(" in ").next().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        steps,
        [
            "INIT DEVICE",
            "COMPLETE INIT",
            "BIND",
            "CONNECT",
            "INIT TASK",
            "RUN",
            "STOP",
            "RESET TASK",
            "RESET DEVICE"
        ],
        "{}",
        sim.log_text()
    );
    // Arguments went with INIT DEVICE (CONFIGURE) and RUN (START), over the JSON variant.
    let text = sim.log_text();
    assert!(
        text.contains("argument chans.data.0.address = tcp://*:5555"),
        "{text}"
    );
    assert!(text.contains("argument run_number = 7"), "{text}");
    assert!(
        text.contains("received transition INIT DEVICE in IDLE (2 arguments, Json)"),
        "{text}"
    );
    assert!(
        text.contains("received transition COMPLETE INIT in INITIALIZING DEVICE (0 arguments"),
        "{text}"
    );
}

/// One raw FairMQ step, as a driver killed part-way had sent it.
async fn raw_step(sim: &SimProc, from: &str, event: &str) -> String {
    let reply = ControlClient::default()
        .device_step(
            sim.addr,
            from.parse().unwrap(),
            event.parse().unwrap(),
            DEADLINE,
        )
        .await
        .unwrap();
    assert!(reply.ok, "{event} from {from}: {reply:?}");
    reply.state
}

/// The events the simulator received, in order.
fn received(sim: &SimProc) -> Vec<String> {
    sim.lines_with("received transition")
        .iter()
        .map(|l| {
            let after = l.split("received transition ").nth(1).unwrap();
            after.split(" in ").next().unwrap().to_string()
        })
        .collect()
}

/// A device left part-way through CONFIGURE (its driver killed after BIND) is carried on
/// from where it is: CONNECT and INIT TASK only, never INIT DEVICE again; one left done is
/// sent nothing at all.
#[tokio::test]
async fn a_fairmq_sequence_left_part_way_is_carried_on_not_started_over() {
    let ctl = ControlClient::default();
    let sim = SimProc::start(&["--mode", "fairmq", "--verbose"], &[]).await;
    let ep = sim.ep(ControlMode::Fairmq);
    for (from, event) in [
        ("IDLE", "INIT DEVICE"),
        ("INITIALIZING DEVICE", "COMPLETE INIT"),
        ("INITIALIZED", "BIND"),
    ] {
        raw_step(&sim, from, event).await;
    }
    let e = ctl.get_state(&ep, DEADLINE).await.unwrap_err();
    assert!(matches!(e, ControlError::Between { .. }), "{e}");
    // Its Task still says STANDBY: the CONFIGURE is asked again.
    let s = ctl
        .transition(&ep, State::Standby, Event::Configure, &[], DEADLINE)
        .await
        .unwrap();
    assert_eq!(s, State::Configured);
    assert_eq!(
        received(&sim),
        [
            "INIT DEVICE",
            "COMPLETE INIT",
            "BIND",
            "CONNECT",
            "INIT TASK"
        ],
        "{}",
        sim.log_text()
    );
    // Done, but its Task never heard: asked again, nothing is sent.
    let s = ctl
        .transition(&ep, State::Standby, Event::Configure, &[], DEADLINE)
        .await
        .unwrap();
    assert_eq!(s, State::Configured);
    assert_eq!(received(&sim).len(), 5, "{}", sim.log_text());
}

#[tokio::test]
async fn injected_failure_fails_within_two_seconds_naming_the_event() {
    let ctl = ControlClient::default();
    for (mode, cm) in [
        ("direct", ControlMode::Direct),
        ("fairmq", ControlMode::Fairmq),
    ] {
        let sim = SimProc::start(&["--mode", mode, "--fail-on", "CONFIGURE"], &[]).await;
        let t = Instant::now();
        let e = ctl
            .transition(&sim.ep(cm), State::Standby, Event::Configure, &[], DEADLINE)
            .await
            .unwrap_err();
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{mode}: took {:?}",
            t.elapsed()
        );
        let msg = e.to_string();
        assert!(msg.contains("CONFIGURE"), "{mode}: {msg}");
        assert!(msg.contains("ok=false"), "{mode}: {msg}");
        assert_eq!(e.reported_state(), Some(State::Error), "{mode}: {msg}");
        assert_eq!(
            ctl.get_state(&sim.ep(cm), DEADLINE).await.unwrap().0,
            State::Error
        );
    }
}

#[tokio::test]
async fn failure_injection_is_read_from_the_pod_environment() {
    let ctl = ControlClient::default();
    let sim = SimProc::start(
        &[],
        &[
            ("ENVBRIDGE_SIM_MODE", "fairmq"),
            ("ENVBRIDGE_SIM_FAIL_ON", "START"),
        ],
    )
    .await;
    let ep = sim.ep(ControlMode::Fairmq);
    let s = ctl
        .transition(&ep, State::Standby, Event::Configure, &[], DEADLINE)
        .await
        .unwrap();
    let e = ctl
        .transition(&ep, s, Event::Start, &[], DEADLINE)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("START (FairMQ step RUN)"), "{e}");
}

#[tokio::test]
async fn hanging_simulator_hits_the_deadline() {
    let ctl = ControlClient::default();
    let sim = SimProc::start(&["--hang-on", "START"], &[]).await;
    let ep = sim.ep(ControlMode::Direct);
    ctl.transition(&ep, State::Standby, Event::Configure, &[], DEADLINE)
        .await
        .unwrap();
    let deadline = Duration::from_millis(500);
    let t = Instant::now();
    let e = ctl
        .transition(&ep, State::Configured, Event::Start, &[], deadline)
        .await
        .unwrap_err();
    let took = t.elapsed();
    assert!(e.is_deadline(), "{e}");
    assert!(e.to_string().contains("START"), "{e}");
    assert!(
        took >= deadline && took < Duration::from_secs(3),
        "took {took:?}"
    );
    assert!(sim.log_text().contains("hanging on START"));
}

#[tokio::test]
async fn crashing_simulator_is_an_error_and_exits_non_zero() {
    let ctl = ControlClient::default();
    let mut sim = SimProc::start(&["--crash-on", "CONFIGURE"], &[]).await;
    let e = ctl
        .transition(
            &sim.ep(ControlMode::Direct),
            State::Standby,
            Event::Configure,
            &[],
            DEADLINE,
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("CONFIGURE"), "{e}");
    assert!(
        !e.is_deadline(),
        "a crash must be noticed before the deadline: {e}"
    );
    let status = tokio::time::timeout(Duration::from_secs(5), sim.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(i32::from(sim::cli::EXIT_CRASHED)));
}

#[tokio::test]
async fn stuck_fairmq_step_is_rolled_back_with_reset_device() {
    let ctl = ControlClient::default();
    let sim = SimProc::start(&["--mode", "fairmq", "--stuck-on", "BIND"], &[]).await;
    let ep = sim.ep(ControlMode::Fairmq);
    let e = ctl
        .transition(&ep, State::Standby, Event::Configure, &[], DEADLINE)
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ControlError::Stuck { .. }), "{msg}");
    assert!(msg.contains("CONFIGURE (FairMQ step BIND)"), "{msg}");
    assert!(msg.contains("RESET DEVICE (now IDLE)"), "{msg}");
    assert!(
        sim.log_text()
            .contains("received transition RESET DEVICE in INITIALIZED")
    );
    assert_eq!(
        ctl.get_state(&ep, DEADLINE).await.unwrap().0,
        State::Standby
    );
}

#[tokio::test]
async fn json_codec_round_trip_against_the_simulator() {
    let ctl = ControlClient::default();
    use envbridge::control::json::JsonCodec;
    use envbridge::control::pb;
    use envbridge::control::wire::{Method, Variant};

    let sim = SimProc::start(&["--mode", "fairmq"], &[]).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", sim.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let svc = control::client::VariantChannel::new(channel, Variant::Json);
    let mut grpc = tonic::client::Grpc::new(svc);
    grpc.ready().await.unwrap();
    let req = pb::TransitionRequest {
        src_state: "IDLE".into(),
        transition_event: "INIT DEVICE".into(),
        arguments: vec![pb::ConfigEntry {
            key: "k".into(),
            value: "v".into(),
        }],
    };
    let resp = grpc
        .unary(
            tonic::Request::new(req),
            Method::Transition.path(Variant::Json),
            JsonCodec::<pb::TransitionRequest, pb::TransitionReply>::default(),
        )
        .await
        .unwrap();
    let reply = resp.get_ref();
    assert!(reply.ok);
    assert_eq!(reply.state, "INITIALIZING DEVICE");
    assert_eq!(reply.transition_event, "INIT DEVICE");
    assert_eq!(reply.trigger, pb::StateChangeTrigger::Executor as i32);
    // The simulator decoded it as JSON (not protobuf) and answered in kind.
    assert!(
        sim.log_text().contains("(1 arguments, Json)"),
        "{}",
        sim.log_text()
    );
    // As the real plugin, the device serves bare paths only: a protobuf call on the full
    // path (a direct-mode client) is UNIMPLEMENTED, and so is StateStream.
    let e = ctl
        .get_state(&sim.ep(ControlMode::Direct), DEADLINE)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            ControlError::Rpc {
                code: tonic::Code::Unimplemented,
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test]
async fn state_stream_notices_changes() {
    let ctl = ControlClient::default();
    let sim = SimProc::start(&[], &[]).await;
    let ep = sim.ep(ControlMode::Direct);
    // As the OCC library: only later changes, never the current state on subscribe.
    let mut states = ctl.state_stream(&ep);
    let none = tokio::time::timeout(Duration::from_millis(300), states.next()).await;
    assert!(none.is_err(), "nothing before a change: {none:?}");
    ctl.transition(&ep, State::Standby, Event::Configure, &[], DEADLINE)
        .await
        .unwrap();
    let next = tokio::time::timeout(DEADLINE, states.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next, State::Configured);

    // FairMQ has no StateStream: the client polls GetState (current state first).
    let fsim = SimProc::start(&["--mode", "fairmq"], &[]).await;
    let fep = fsim.ep(ControlMode::Fairmq);
    let mut fstates = ctl.state_stream(&fep);
    let first = tokio::time::timeout(DEADLINE, fstates.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first, State::Standby);
    ctl.transition(&fep, State::Standby, Event::Configure, &[], DEADLINE)
        .await
        .unwrap();
    let next = tokio::time::timeout(DEADLINE, fstates.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next, State::Configured);
}

#[tokio::test]
async fn basic_mode_has_no_protocol() {
    let ctl = ControlClient::default();
    let ep = TaskEndpoint::new("127.0.0.1:1".parse().unwrap(), ControlMode::Basic);
    let e = ctl
        .transition(&ep, State::Standby, Event::Configure, &[], DEADLINE)
        .await
        .unwrap_err();
    assert!(matches!(e, ControlError::NoProtocol { .. }));
    assert!(e.to_string().contains("no control protocol"), "{e}");
}

#[tokio::test]
async fn unreachable_task_is_an_error_naming_the_call() {
    let ctl = ControlClient::default();
    // Bind then drop to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ep = TaskEndpoint::new(
        SocketAddr::from(([127, 0, 0, 1], port)),
        ControlMode::Direct,
    );
    let e = ctl.get_state(&ep, DEADLINE).await.unwrap_err();
    assert!(matches!(e, ControlError::Rpc { .. }), "{e}");
    assert!(e.to_string().contains("GetState"), "{e}");
}

#[tokio::test]
async fn simulator_refuses_non_loopback_and_reports_a_taken_address() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .args(["task-sim", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(i32::from(sim::cli::EXIT_USAGE)));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("task simulator refuses to listen on 0.0.0.0:0"),
        "{err}"
    );

    let first = SimProc::start(&[], &[]).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .args(["task-sim", "--listen", &first.addr.to_string()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(i32::from(sim::cli::EXIT_BIND_FAILED))
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen on"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_transition_concurrently_in_process() {
    let ctl = ControlClient::default();
    // 200 in-process simulators, 100 ms per transition: the client's calls to different
    // tasks overlap. Prints the figure; asserts only correctness.
    const N: usize = 200;
    let config = SimConfig::parse(SimMode::Direct, &["100ms".into()], &[], &[], &[], &[]).unwrap();
    let mut eps = Vec::new();
    for _ in 0..N {
        let l = sim::bind("127.0.0.1:0".parse().unwrap(), false)
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(sim::serve(
            l,
            Simulator::new(config.clone()),
            std::future::pending(),
        ));
        eps.push(TaskEndpoint::new(addr, ControlMode::Direct));
    }
    for (event, from) in [
        (Event::Configure, State::Standby),
        (Event::Start, State::Configured),
    ] {
        let t = Instant::now();
        let results = futures::future::join_all(
            eps.iter()
                .map(|ep| ctl.transition(ep, from, event, &[], DEADLINE)),
        )
        .await;
        let wall = t.elapsed();
        for r in results {
            assert_eq!(r.unwrap(), event.target());
        }
        println!("{event} of {N} simulated tasks (100 ms each): wall {wall:?}");
    }
}

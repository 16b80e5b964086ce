//! Task control through the local control plane: `envbridge dev sim-runner` gives each kwok
//! pod a task simulator on `<podIP>:$OCC_CONTROL_PORT`, which the real client then drives.
//! (The protocol itself is tested without a cluster in control/protocol.rs.)

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use envbridge::control::{ControlClient, ControlError, TaskEndpoint};
use envbridge::dev::sim_runner::{self, SimRunnerArgs};
use envbridge::plan::ControlMode;
use envbridge::state::{Event, State};
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};

use crate::support::{TestNamespace, wait_for};

const WAIT: Duration = Duration::from_secs(60);
const CALL: Duration = Duration::from_secs(3);

fn sim_pod(name: &str, node: &str, env: &[(&str, String)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "envbridge".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            termination_grace_period_seconds: Some(0),
            containers: vec![Container {
                name: "task".into(),
                image: Some("envbridge-task-simulator".into()),
                env: Some(
                    env.iter()
                        .map(|(k, v)| EnvVar {
                            name: k.to_string(),
                            value: Some(v.clone()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn pod_ip(pods: &Api<Pod>, name: &str) -> IpAddr {
    wait_for(&format!("pod {name} Running with an IP"), WAIT, || async {
        let p = pods.get(name).await.ok()?;
        let st = p.status?;
        (st.phase.as_deref() == Some("Running")).then_some(())?;
        st.pod_ip?.parse::<IpAddr>().ok()
    })
    .await
}

/// A port nobody on this machine listens on right now (there is a race, as always).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(47999)
}

async fn answers(ctl: &ControlClient, ep: &TaskEndpoint) -> Option<State> {
    ctl.get_state(ep, CALL).await.ok().map(|(s, _)| s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_runner_serves_each_pod_and_stops_with_it() {
    let ctl = ControlClient::default();
    let ns = TestNamespace::new("control-simrunner").await;
    let pods: Api<Pod> = ns.api();
    let port = free_port();
    let env = |mode: &str, fail: &str| {
        vec![
            ("OCC_CONTROL_PORT", port.to_string()),
            ("ENVBRIDGE_CONTROL_MODE", mode.to_string()),
            ("ENVBRIDGE_SIM_FAIL_ON", fail.to_string()),
        ]
    };
    // Two pods on one port: different nodes, different loopback IPs, as on real machines.
    pods.create(
        &PostParams::default(),
        &sim_pod("readout", "flp001.cluster.local", &env("direct", "")),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &sim_pod("stfb", "flp002.cluster.local", &env("fairmq", "START")),
    )
    .await
    .unwrap();
    let readout_ip = pod_ip(&pods, "readout").await;
    let stfb_ip = pod_ip(&pods, "stfb").await;
    assert!(readout_ip.is_loopback() && stfb_ip.is_loopback());
    assert_ne!(readout_ip, stfb_ip);

    // Hold the readout pod's address first: the runner must report and retry, not give up.
    let squatter = std::net::TcpListener::bind(SocketAddr::new(readout_ip, port)).unwrap();

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let args = SimRunnerArgs {
        kubeconfig: ns.info.kubeconfig.clone(),
        selector: sim_runner::DEFAULT_SELECTOR.into(),
        namespace: Some(ns.name.clone()),
        sim_exe: Some(env!("CARGO_BIN_EXE_envbridge").into()),
        log_dir: None,
        in_process: false,
        complete_tasks: false,
        fault_dir: None,
    };
    let runner = tokio::spawn(sim_runner::serve(args, async move {
        let _ = stop_rx.await;
    }));

    let stfb = TaskEndpoint::new(SocketAddr::new(stfb_ip, port), ControlMode::Fairmq);
    let s = wait_for("the stfb pod's simulator", WAIT, || answers(&ctl, &stfb)).await;
    assert_eq!(s, State::Standby);
    let s = ctl
        .transition(&stfb, s, Event::Configure, &[], CALL)
        .await
        .unwrap();
    assert_eq!(s, State::Configured);
    // The pod's ENVBRIDGE_SIM_FAIL_ON=START reached its simulator.
    let t = Instant::now();
    let e = ctl
        .transition(&stfb, s, Event::Start, &[], CALL)
        .await
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(e.to_string().contains("START"), "{e}");
    assert_eq!(e.reported_state(), Some(State::Error));

    // The squatter goes away: the runner's retry brings the readout simulator up.
    drop(squatter);
    let readout = TaskEndpoint::new(SocketAddr::new(readout_ip, port), ControlMode::Direct);
    let s = wait_for("the readout pod's simulator after the retry", WAIT, || {
        answers(&ctl, &readout)
    })
    .await;
    assert_eq!(s, State::Standby);
    let s = ctl
        .transition(&readout, s, Event::Configure, &[], CALL)
        .await
        .unwrap();
    assert_eq!(s, State::Configured);

    // Deleting the pod stops its simulator.
    pods.delete("readout", &DeleteParams::default())
        .await
        .unwrap();
    ctl.forget(&readout.addr);
    wait_for("the readout simulator to stop", WAIT, || async {
        match ctl.get_state(&readout, CALL).await {
            Err(ControlError::Rpc { .. }) => Some(()),
            _ => None,
        }
    })
    .await;

    // Stopping the runner stops the simulators it started.
    stop_tx.send(()).unwrap();
    runner.await.unwrap().unwrap();
    ctl.forget(&stfb.addr);
    assert!(
        matches!(
            ctl.get_state(&stfb, CALL).await,
            Err(ControlError::Rpc { .. })
        ),
        "the stfb simulator outlived the runner"
    );
}

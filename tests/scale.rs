//! Large-scale behaviour on the local control plane, in a test binary of its own so that it
//! runs alone (cargo runs test binaries one after another) and its 2,000 pods do not slow the
//! other tests down.
//!
//! 2,000 tasks failing at once: every task simulator refuses CONFIGURE; the transition through
//! the daemon's API must fail fast (a generous bound; the figure is printed) and the
//! Environment's status must stay one object of bounded size (`failingCount` counts them all,
//! the list is capped).

// The daemon fixtures are shared with the `integration` binary, which uses all of them.
#![allow(dead_code)]

#[path = "integration/support/mod.rs"]
mod support;

#[path = "integration/daemon"]
mod daemon {
    pub mod fixture;
    pub mod plane;
    pub mod sim;
}

use std::time::{Duration, Instant};

use daemon::fixture::{self, Child, Setup};
use envbridge::crd::Environment;
use envbridge::plan::{ControlMode, EnvVar, TaskRef};
use envbridge::roster::EnvKey;
use envbridge::server::pb;
use envbridge::state::State;
use kube::Api;
use prost::Message;

const NODES: u32 = 10;
const PER_NODE: u16 = 200;
const CLASSES: [&str; 3] = ["readout", "stfbuilder", "stfsender"];
/// Generous: the figure measured here is about a second (printed below).
const FAIL_WITHIN: Duration = Duration::from_secs(60);
/// kwok marks the pods Running at its own pace (about 50 s for 2,000 on this machine).
const STANDBY_WITHIN: Duration = Duration::from_secs(400);

fn task_refs(env: &str, prefix: &str) -> Vec<TaskRef> {
    let mut out = Vec::new();
    for host in fixture::hosts(NODES) {
        for i in 0..PER_NODE {
            let class = CLASSES[usize::from(i) % CLASSES.len()];
            let port = 47100 + i;
            let var = |name: &str, value: String| EnvVar {
                name: name.into(),
                value: value.into(),
            };
            out.push(TaskRef {
                name: format!("{env}-{host}-{class}-{i}"),
                id: format!("{host}-{class}-{i}"),
                path: format!("readout-dataflow.host-{host}.{class}{i}"),
                class: class.into(),
                node: host.clone(),
                template: format!("{prefix}-{class}"),
                control_mode: ControlMode::Direct,
                control_port: port,
                critical: true,
                command: class.into(),
                env: vec![
                    var("O2_ROLE", host.clone()),
                    var("OCC_CONTROL_PORT", port.to_string()),
                    // Read by `envbridge dev sim-runner`: every simulator refuses CONFIGURE.
                    var("ENVBRIDGE_SIM_FAIL_ON", "CONFIGURE".into()),
                ],
                ..TaskRef::default()
            });
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_tasks_failing_at_once_fail_the_transition_fast_in_a_bounded_status() {
    // The shared plane, grown to NODES (a node's podCIDR holds 254 pods).
    envbridge::dev::ensure_up(NODES)
        .await
        .expect("the local control plane with 10 nodes");
    let ns = Setup::shared("mass").await;
    let _sims = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
            .args(["dev", "sim-runner", "--in-process", "--namespace", &ns.name])
            .arg("--kubeconfig")
            .arg(&ns.kubeconfig)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("sim-runner"),
    );
    let operator = fixture::Operator::start(ns.client.clone(), &ns.name);
    let d = ns.daemon().await;

    let refs = task_refs("mass", &ns.tpl.prefix);
    let total = refs.len();
    assert_eq!(total, 2000);
    let objs = envbridge::objects::pack("mass", "mass", "readout-dataflow", refs);
    let t0 = Instant::now();
    d.bridge
        .apply(objs, &ns.name, &Default::default())
        .await
        .expect("apply 2,000 tasks");
    let key = EnvKey::new(&ns.name, "mass");
    support::wait_for("2,000 tasks STANDBY", STANDBY_WITHIN, || async {
        d.bridge.roster.evaluate_state(&key, State::Standby).ok()
    })
    .await;
    println!("2,000 tasks STANDBY after {:?}", t0.elapsed());

    let mut api = d.client().await;
    let started = Instant::now();
    let reply = fixture::run_transition(
        &mut api,
        pb::TransitionRequest {
            id: "mass".into(),
            event: "CONFIGURE".into(),
            wait: true,
            timeout_seconds: FAIL_WITHIN.as_secs() as u32 * 2,
            ..Default::default()
        },
    )
    .await;
    let took = started.elapsed();
    println!(
        "CONFIGURE refused by all {total} tasks: the transition failed after {took:?} (reply {} bytes, {} failures listed)",
        reply.encoded_len(),
        reply.failures.len()
    );
    assert!(!reply.ok, "the transition must fail: {reply:?}");
    assert_eq!(reply.outcome, "failed", "{}", reply.message);
    assert!(
        took < FAIL_WITHIN,
        "2,000 failures took {took:?} (bound {FAIL_WITHIN:?})"
    );
    assert!(
        !reply.failures.is_empty() && reply.failures.len() <= total,
        "{} failures",
        reply.failures.len()
    );
    assert!(
        reply.failures.iter().all(|f| !f.message.is_empty()),
        "each failure says why"
    );
    assert!(
        reply.message.len() < 1024,
        "one short message: {}",
        reply.message
    );

    // The Environment object: ERROR, every failure counted, the list capped, the object small.
    let envs: Api<Environment> = ns.api();
    let env = support::wait_for(
        "the Environment's status counts 2,000 failures",
        FAIL_WITHIN,
        || {
            let envs = envs.clone();
            async move {
                let env = envs.get("mass").await.ok()?;
                let st = env.status.clone()?;
                (st.failing_count == Some(total as u32)).then_some(env)
            }
        },
    )
    .await;
    let st = env.status.as_ref().expect("status");
    assert_eq!(st.state, Some(State::Error));
    assert!(
        !st.failing_tasks.is_empty() && st.failing_tasks.len() <= 100,
        "failingTasks is capped: {}",
        st.failing_tasks.len()
    );
    assert!(st.failing_tasks.iter().all(|f| f.message.len() <= 512));
    let bytes = serde_json::to_vec(&env).expect("json").len();
    println!(
        "Environment object {bytes} bytes ({} failing listed, failingCount {:?})",
        st.failing_tasks.len(),
        st.failing_count
    );
    assert!(bytes < 256 << 10, "the Environment object is {bytes} bytes");
    // What a client reads of it is as bounded.
    let got = fixture::get(&mut api, "mass").await;
    assert_eq!(got.state, "ERROR");
    assert!(got.failing.len() <= 100, "{} listed", got.failing.len());
    println!("GetEnvironment reply {} bytes", got.encoded_len());

    let gone = fixture::destroy(&mut api, "mass", 300).await;
    assert!(gone.gone, "destroy: {}", gone.message);
    operator.stop().await;
}

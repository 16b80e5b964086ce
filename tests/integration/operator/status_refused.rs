//! A transition's answer whose status write the apiserver refuses (as it does while etcd or
//! the apiserver itself is down) is written again once writes pass, never re-derived by
//! sending the task the same step twice (the fault run's seed 2118642602097680009: etcd
//! killed mid-CONFIGURE, the task CONFIGURED, the retried CONFIGURE refused "state mismatch",
//! the transition failed though no task was faulty); and a task lost while its status
//! cannot be written is recorded once writes pass.
//!
//! The refusal is real: a ValidatingAdmissionPolicy denying this namespace's Task status
//! writes that record a CONFIGURE (or an ERROR), `support::refusal`.

use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::time::{Duration, Instant};

use envbridge::control::{ControlClient, TaskEndpoint};
use envbridge::crd::Task;
use envbridge::plan::ControlMode;
use envbridge::state::{Event, State};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use super::{
    Res, Sims, WAIT, assert_succeeded, deploy, destroy, finish, fixture, start, state_is, task_ref,
    transition, wait_env, wait_transition,
};
use crate::support::refusal::{lift, refuse_updates};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_status_write_is_written_again_and_the_step_is_not_sent_twice() -> Res {
    let fx = fixture("status-refused").await?;
    let policy = fx.ns.clone();
    let sims = Sims::start(&fx);
    let op = start(&fx, None).await?;
    let t = task_ref("sr", "flp004", "readout", 1, ControlMode::Direct);
    deploy(&fx, "sr", std::slice::from_ref(&t), false).await?;
    wait_env(&fx, "sr", "STANDBY", state_is(State::Standby)).await?;
    let pod = Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&t.name)
        .await?;
    let ip = pod.status.and_then(|s| s.pod_ip).ok_or("no pod IP")?;
    let ep = TaskEndpoint::new(
        SocketAddr::new(ip.parse()?, t.control_port),
        ControlMode::Direct,
    );

    let configure = "has(object.status) && has(object.status.transition) \
                     && object.status.transition.event == 'CONFIGURE'";
    refuse_updates(&fx.admin, &fx.ns, &policy, "tasks/status", configure).await?;
    transition(&fx, "sr", "c1", Event::Configure).await?;
    // The task answers CONFIGURE; its Task cannot record it.
    let t0 = Instant::now();
    loop {
        let (state, _) = ControlClient::default()
            .get_state(&ep, Duration::from_secs(5))
            .await?;
        if state == State::Configured {
            break;
        }
        assert!(t0.elapsed() < WAIT, "the task never reached CONFIGURED");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Long enough for the operator's refused write and its retries.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let task = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&t.name)
        .await?;
    let recorded = task.status.and_then(|s| s.transition).map(|t| t.id);
    assert_ne!(recorded.as_deref(), Some("c1"), "the refusal did not hold");

    lift(&fx.admin, &policy).await?;
    assert_succeeded(&wait_transition(&fx, "sr", "c1").await?);
    wait_env(&fx, "sr", "CONFIGURED", state_is(State::Configured)).await?;
    let (state, _) = ControlClient::default()
        .get_state(&ep, Duration::from_secs(5))
        .await?;
    assert_eq!(state, State::Configured);
    destroy(&fx, "sr").await?;
    op.stop().await?;
    sims.stop().await;
    finish(fx).await
}

/// A task process lost while its Task's status cannot be written (the fault run's seed
/// 14118305120460058142: the apiserver killed, and a task killed as it came back): the
/// follower reports a lost connection once, so the operator keeps what it saw until the
/// ERROR is written. The Task must end in ERROR once writes pass, not show STANDBY for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_lost_while_its_status_cannot_be_written_is_recorded_once_writes_pass() -> Res {
    let fx = fixture("lost-refused").await?;
    let policy = fx.ns.clone();
    let op = start(&fx, None).await?;
    let t = task_ref("lr", "flp004", "readout", 21, ControlMode::Direct);
    deploy(&fx, "lr", std::slice::from_ref(&t), false).await?;
    // The task's process is the test's child, so that it can be killed.
    let addr = SocketAddr::new(running_pod_ip(&fx, &t.name).await?, t.control_port);
    let mut process = tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .args(["task-sim", "--listen", &addr.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    wait_env(&fx, "lr", "STANDBY", state_is(State::Standby)).await?;

    let error = "has(object.status) && has(object.status.state) && object.status.state == 'ERROR'";
    refuse_updates(&fx.admin, &fx.ns, &policy, "tasks/status", error).await?;
    process.start_kill()?;
    process.wait().await?;
    // Long enough for the follower to find the process gone and the write to be refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tasks = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns);
    let state = |t: &Task| t.status.as_ref().and_then(|s| s.state);
    assert_eq!(
        state(&tasks.get(&t.name).await?),
        Some(State::Standby),
        "the refusal did not hold"
    );

    lift(&fx.admin, &policy).await?;
    let t0 = Instant::now();
    loop {
        let task = tasks.get(&t.name).await?;
        if state(&task) == Some(State::Error) {
            let message = task.status.and_then(|s| s.message).unwrap_or_default();
            assert!(
                message.contains("control connection lost while STANDBY"),
                "{message}"
            );
            break;
        }
        assert!(
            t0.elapsed() < WAIT,
            "the lost task still shows {:?}",
            state(&task)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_env(&fx, "lr", "ERROR", state_is(State::Error)).await?;
    destroy(&fx, "lr").await?;
    op.stop().await?;
    finish(fx).await
}

/// The IP of the task's pod once it runs.
async fn running_pod_ip(fx: &super::Fixture, name: &str) -> Res<IpAddr> {
    let pods = Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns);
    let t0 = Instant::now();
    loop {
        if let Some(status) = pods.get_opt(name).await?.and_then(|p| p.status)
            && status.phase.as_deref() == Some("Running")
            && let Some(ip) = status.pod_ip
        {
            return Ok(ip.parse()?);
        }
        if t0.elapsed() > WAIT {
            return Err(format!("pod {name} never ran").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

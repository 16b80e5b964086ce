//! Failover: the leading operator process dies (SIGKILL, its Lease not released) while its
//! tasks are RUNNING; the standby takes over once the Lease lapses and disturbs no task (no
//! pod created or deleted, no transition sent, no Task spec written), and follows every task
//! again. The time from the death to the standby following every task is printed.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envbridge::crd::Environment;
use envbridge::operator::metrics::Metrics;
use envbridge::operator::requests::RequestCount;
use envbridge::plan::{ControlMode, TaskRef};
use envbridge::state::{Event, State};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio_util::sync::CancellationToken;

use envbridge::dev::fixtures::failover_view;

use super::{
    DISCOVERY_PORT, Fixture, Res, Running, Sims, WAIT, args, deploy, destroy, finish, fixture,
    operator_config, state_is, task_ref, transition_succeeds, wait_env,
};

const LEASE_NAMESPACE: &str = "envbridge-system";
const LEASE_SECONDS: u64 = 3;

/// The leader as its own process (so that it can die), holding the Lease `lease` as "a".
/// Its log goes to `log` (read when it fails to lead).
fn leader_process(fx: &Fixture, lease: &str, log: &std::path::Path) -> Res<tokio::process::Child> {
    let log = std::fs::File::create(log)?;
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .args(["operator", "--namespace", &fx.ns, "--lease-name", lease])
        .args(["--lease-namespace", LEASE_NAMESPACE, "--identity", "a"])
        .args(["--lease-duration", &LEASE_SECONDS.to_string()])
        .args([
            "--metrics-listen",
            "127.0.0.1:0",
            "--connect-timeout-seconds",
            "10",
        ])
        .args(["--headless-discovery-port", &DISCOVERY_PORT.to_string()])
        .env("KUBECONFIG", &fx.kubeconfig)
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()?;
    Ok(child)
}

async fn holder(fx: &Fixture, lease: &str) -> Res<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(fx.admin.clone(), LEASE_NAMESPACE);
    Ok(leases
        .get_opt(lease)
        .await?
        .and_then(|l| l.spec?.holder_identity))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_disturbs_no_task_and_the_standby_follows_every_task() -> Res {
    let fx = fixture("failover").await?;
    let sims = Sims::start(&fx);
    let lease = fx.ns.clone();
    let log = std::env::temp_dir().join(format!("{}-leader.log", fx.ns));
    let mut leader = leader_process(&fx, &lease, &log)?;
    let deadline = Instant::now() + WAIT;
    while holder(&fx, &lease).await?.as_deref() != Some("a") {
        assert!(
            Instant::now() < deadline,
            "the leader process never took the Lease: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The standby, in this process, with its requests counted from its start.
    let count = Arc::new(RequestCount::default());
    let client = envbridge::launch::client::observed(
        operator_config(&fx.kubeconfig).await?,
        count.clone(),
        envbridge::launch::in_flight::IN_FLIGHT,
    )?;
    let metrics = Arc::new(Metrics::new(count.clone()));
    let mut a = args(&fx.ns, Some(&lease));
    a.lease.identity = Some("b".into());
    a.lease.lease_duration = Some(LEASE_SECONDS);
    let stop = CancellationToken::new();
    let standby = Running {
        stop: stop.clone(),
        handle: tokio::spawn(envbridge::operator::run_with_metrics(
            client,
            a,
            stop.clone(),
            metrics.clone(),
        )),
    };

    let tasks: Vec<TaskRef> = ["flp001", "flp002", "flp003"]
        .iter()
        .flat_map(|h| (1..=2).map(move |n| task_ref("fo", h, "readout", n, ControlMode::Direct)))
        .collect();
    deploy(&fx, "fo", &tasks, false).await?;
    wait_env(&fx, "fo", "STANDBY", state_is(State::Standby)).await?;
    transition_succeeds(&fx, "fo", "c1", Event::Configure).await?;
    transition_succeeds(&fx, "fo", "s1", Event::Start).await?;
    assert!(!metrics.leading(), "the standby leads already");
    let before = failover_view(&fx.admin, &fx.ns).await?;
    let writes_before = count.write.load(std::sync::atomic::Ordering::Relaxed);

    leader.start_kill()?;
    let died = Instant::now();
    leader.wait().await?;
    let _ = std::fs::remove_file(&log);
    let mut led_after = None;
    let followed_after = loop {
        let sample = metrics.sample();
        if led_after.is_none() && metrics.leading() {
            led_after = Some(died.elapsed());
        }
        if metrics.leading()
            && sample
                .as_ref()
                .is_some_and(|s| s.live_followers == tasks.len())
        {
            break died.elapsed();
        }
        assert!(
            died.elapsed() < WAIT,
            "the standby never followed every task: leading {}, following {:?}",
            metrics.leading(),
            sample.map(|s| s.live_followers)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "failover with {} tasks RUNNING: leading {:.2} s and following every task {:.2} s after the leader's death (Lease {LEASE_SECONDS} s)",
        tasks.len(),
        led_after.unwrap_or_default().as_secs_f64(),
        followed_after.as_secs_f64()
    );
    assert_eq!(holder(&fx, &lease).await?.as_deref(), Some("b"));

    // Time for anything the new leader would do of its own accord.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        failover_view(&fx.admin, &fx.ns).await?,
        before,
        "a task was disturbed"
    );
    let by_kind = count.by_kind();
    for verb in ["create pods", "delete pods", "patch tasks", "delete tasks"] {
        assert_eq!(by_kind.get(verb), None, "{verb}: {by_kind:?}");
    }
    println!(
        "the new leader's writes: {} ({by_kind:?})",
        count.write.load(std::sync::atomic::Ordering::Relaxed) - writes_before
    );
    let env: Api<Environment> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let e = env.get("fo").await?;
    assert_eq!(e.status.and_then(|s| s.state), Some(State::Running));

    // It leads for real: the run goes on under it.
    transition_succeeds(&fx, "fo", "t1", Event::Stop).await?;
    destroy(&fx, "fo").await?;
    standby.stop().await?;
    sims.stop().await;
    finish(fx).await
}

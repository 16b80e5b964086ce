//! Operator shards (`--shard`): each operator reconciles the environments labelled with its
//! shard, and sees (watches, stores) only their objects; an environment of another shard, or
//! of none, is never touched.

use std::sync::Arc;

use envbridge::crd::{Environment, Task, labels};
use envbridge::operator::metrics::Metrics;
use envbridge::operator::requests::RequestCount;
use envbridge::plan::{ControlMode, TaskRef};
use envbridge::state::{Event, State};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::{
    Fixture, Res, Running, WAIT, args, finish, fixture, operator_config, state_is, task_ref,
    transition_succeeds, wait_env,
};

fn tasks(env: &str, hosts: &[&str]) -> Vec<TaskRef> {
    hosts
        .iter()
        .map(|h| task_ref(env, h, "readout", 1, ControlMode::Basic))
        .collect()
}

async fn deploy(fx: &Fixture, name: &str, tasks: &[TaskRef], shard: Option<&str>) -> Res {
    envbridge::dev::fixtures::deploy_in_shard(
        &fx.admin,
        &fx.ns,
        name,
        tasks,
        envbridge::plan::DEFAULT_TASK_SET_BUDGET,
        "envbridge-tests",
        shard,
    )
    .await?;
    Ok(())
}

/// An operator of `shard` (no leader election), with its metrics to read its stores' counts.
async fn start(fx: &Fixture, shard: Option<&str>) -> Res<(Running, Arc<Metrics>)> {
    let count = Arc::new(RequestCount::default());
    let client = envbridge::launch::client::observed(
        operator_config(&fx.kubeconfig).await?,
        count.clone(),
        envbridge::launch::in_flight::IN_FLIGHT,
    )?;
    let metrics = Arc::new(Metrics::new(count));
    let mut a = args(&fx.ns, None);
    a.shard = shard.map(String::from);
    let stop = CancellationToken::new();
    let handle = tokio::spawn(envbridge::operator::run_with_metrics(
        client,
        a,
        stop.clone(),
        metrics.clone(),
    ));
    Ok((Running { stop, handle }, metrics))
}

/// The tasks an operator's store holds, in every state.
fn tasks_seen(m: &Metrics) -> u64 {
    m.sample()
        .map(|s| s.tasks.values().sum())
        .unwrap_or_default()
}

async fn objects_of(fx: &Fixture, env: &str) -> Res<(usize, usize, usize)> {
    let lp = ListParams::default().labels(&format!("{}={env}", labels::ENVIRONMENT));
    let t = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&lp)
        .await?;
    let p = Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&lp)
        .await?;
    let s = Api::<Service>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&lp)
        .await?;
    Ok((t.items.len(), p.items.len(), s.items.len()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_never_reconcile_each_others_environments() -> Res {
    let fx = fixture("shards").await?;
    deploy(&fx, "sa", &tasks("sa", &["flp001", "flp002"]), Some("its")).await?;
    deploy(&fx, "sb", &tasks("sb", &["flp003"]), Some("tpc")).await?;
    deploy(&fx, "s0", &tasks("s0", &["flp001"]), None).await?;

    // Shard "its" alone: its environment comes up, the others are not touched at all.
    let (its, its_m) = start(&fx, Some("its")).await?;
    wait_env(&fx, "sa", "STANDBY", state_is(State::Standby)).await?;
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    for p in pods.list(&ListParams::default()).await? {
        assert_eq!(
            p.labels().get(labels::SHARD).map(String::as_str),
            Some("its")
        );
    }
    // Long enough for a stray reconcile to have written something.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let envs: Api<Environment> = Api::namespaced(fx.admin.clone(), &fx.ns);
    for other in ["sb", "s0"] {
        assert_eq!(objects_of(&fx, other).await?, (0, 0, 0), "{other}");
        let e = envs.get(other).await?;
        assert!(e.status.is_none(), "{other} has a status: {:?}", e.status);
        assert!(e.finalizers().is_empty(), "{other}: {:?}", e.finalizers());
    }
    assert_eq!(tasks_seen(&its_m), 2);

    // Shard "tpc" and the unsharded operator take theirs; each store holds its own tasks only.
    let (tpc, tpc_m) = start(&fx, Some("tpc")).await?;
    let (none, none_m) = start(&fx, None).await?;
    wait_env(&fx, "sb", "STANDBY", state_is(State::Standby)).await?;
    wait_env(&fx, "s0", "STANDBY", state_is(State::Standby)).await?;
    assert_eq!(objects_of(&fx, "sb").await?, (1, 1, 1));
    assert_eq!(objects_of(&fx, "s0").await?, (1, 1, 1));
    assert_eq!(
        (tasks_seen(&its_m), tasks_seen(&tpc_m), tasks_seen(&none_m)),
        (2, 1, 1)
    );

    // A transition of one shard's environment is driven by that shard's operator only.
    transition_succeeds(&fx, "sb", "t1", Event::Configure).await?;
    let sa = envs.get("sa").await?;
    assert_eq!(sa.status.and_then(|s| s.state), Some(State::Standby));
    let (sb_tasks, s0_tasks): (Vec<Task>, Vec<Task>) = {
        let all = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
            .list(&ListParams::default())
            .await?
            .items;
        (
            all.iter()
                .filter(|t| t.spec.environment == "sb")
                .cloned()
                .collect(),
            all.into_iter()
                .filter(|t| t.spec.environment == "s0")
                .collect(),
        )
    };
    assert!(
        sb_tasks
            .iter()
            .all(|t| t.status.as_ref().and_then(|s| s.state) == Some(State::Configured))
    );
    assert!(
        s0_tasks
            .iter()
            .all(|t| t.status.as_ref().and_then(|s| s.state) == Some(State::Standby))
    );

    // Each operator tears its own environment down.
    for e in ["sa", "sb", "s0"] {
        envs.delete(e, &DeleteParams::default()).await?;
    }
    let deadline = std::time::Instant::now() + WAIT;
    while !envs.list(&ListParams::default()).await?.items.is_empty()
        || !pods.list(&ListParams::default()).await?.items.is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "environments left behind"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for op in [its, tpc, none] {
        op.stop().await?;
    }
    finish(fx).await
}

//! What may hold an environment's teardown and what may not: a dead node cannot, an object
//! labelled with the environment that no Task owns does.

use super::*;

/// A pod on a node whose kubelet is dead stays Terminating: the Task's finalizer removes it by
/// force past the bound, so destroying the environment ends (the node here is a Node object
/// that kwok does not manage: nothing answers for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_cannot_hold_an_environment_forever() -> Res {
    use k8s_openapi::api::core::v1::Node;
    let fx = fixture("deadnode").await?;
    let host = format!("dead{}", &fx.ns[fx.ns.len() - 6..]);
    let nodes: Api<Node> = Api::all(fx.admin.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": host.clone(), "labels": {"envbridge.dev/host": host.clone()}}
    }))?;
    nodes.create(&Default::default(), &node).await?;
    let op = start_with(
        &fx,
        OperatorArgs {
            pod_deletion_timeout_seconds: 3,
            ..args(&fx.ns, None)
        },
    )
    .await?;
    let t = task_ref("ed", &host, "readout", 1, ControlMode::Basic);
    deploy(&fx, "ed", std::slice::from_ref(&t), false).await?;
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let deadline = Instant::now() + WAIT;
    while pods.get_opt(&t.name).await?.is_none() {
        assert!(Instant::now() < deadline, "no pod on the dead node");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let started = Instant::now();
    destroy(&fx, "ed").await?;
    println!(
        "environment on a dead node destroyed in {:?}",
        started.elapsed()
    );
    assert!(pods.get_opt(&t.name).await?.is_none());
    let _ = nodes.delete(&host, &Default::default()).await;
    op.stop().await?;
    finish(fx).await
}

/// A deleted environment's finalizer counts its Tasks going by the index and reads the Pod and
/// Service stores only once none is left: an object labelled with the environment that no
/// Task owns (its Task's finalizer removed by hand) still holds the environment until it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_of_the_environment_that_no_task_owns_holds_its_teardown() -> Res {
    use envbridge::crd::labels;
    let fx = fixture("stray").await?;
    let op = start(&fx, None).await?;
    let tasks: Vec<TaskRef> = ["flp001", "flp002"]
        .iter()
        .map(|h| task_ref("es", h, "readout", 1, ControlMode::Basic))
        .collect();
    deploy(&fx, "es", &tasks, false).await?;
    wait_env(&fx, "es", "STANDBY", state_is(State::Standby)).await?;
    let svcs: Api<Service> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let stray: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "stray", "labels": {
            labels::MANAGED_BY: labels::MANAGER, labels::ENVIRONMENT: "es"}},
        "spec": {"clusterIP": "None", "ports": [{"port": 1}]}
    }))?;
    svcs.create(&Default::default(), &stray).await?;

    let envs: Api<Environment> = Api::namespaced(fx.admin.clone(), &fx.ns);
    envs.delete("es", &DeleteParams::default()).await?;
    let task_api: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let lp = ListParams::default();
    wait_for("the environment's tasks and pods to go", WAIT, || async {
        let tasks = task_api.list(&lp).await.ok()?.items.len();
        let pods = pods.list(&lp).await.ok()?.items.len();
        (tasks + pods == 0).then_some(())
    })
    .await;
    // Every task gone: the finalizer now waits for the stray Service (its retry is 0.5 s).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = envs.get_opt("es").await?;
    assert!(
        held.is_some_and(|e| e.metadata.deletion_timestamp.is_some()),
        "the environment went while an object labelled with it was left"
    );
    let left: Vec<String> = svcs.list(&lp).await?.iter().map(|s| s.name_any()).collect();
    assert_eq!(left, ["stray"]);
    svcs.delete("stray", &DeleteParams::default()).await?;
    wait_for(
        "the environment to go once nothing is left",
        WAIT,
        || async { envs.get_opt("es").await.ok()?.is_none().then_some(()) },
    )
    .await;
    op.stop().await?;
    finish(fx).await
}

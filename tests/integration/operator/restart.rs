//! A restarted operator: it re-attaches to the pods and processes it finds, with no
//! duplicate, and carries on a FairMQ sequence left part-way.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_restart_reattaches_pods_without_duplicates() -> Res {
    let fx = fixture("restart").await?;
    let lease = fx.ns.clone();
    let op = start(&fx, Some(&lease)).await?;
    let tasks: Vec<TaskRef> = (1..=4)
        .flat_map(|n| {
            ["flp001", "flp002", "flp003"]
                .map(|h| task_ref("er", h, "readout", n, ControlMode::Basic))
        })
        .collect();
    deploy(&fx, "er", &tasks, false).await?;
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    // Stop mid-way: as soon as some pods exist.
    let deadline = Instant::now() + WAIT;
    while pods.list(&ListParams::default()).await?.items.is_empty() {
        assert!(Instant::now() < deadline, "no pod appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    op.stop().await?;
    let before: BTreeMap<String, String> = pods
        .list(&ListParams::default())
        .await?
        .into_iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect();
    println!(
        "{} of {} pods existed when the operator stopped",
        before.len(),
        tasks.len()
    );

    let op = start(&fx, Some(&lease)).await?;
    wait_env(&fx, "er", "STANDBY 12/12", |e| {
        state_is(State::Standby)(e)
            && e.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("12/12")
    })
    .await?;
    let after = pods.list(&ListParams::default()).await?;
    assert_eq!(after.items.len(), tasks.len(), "one pod per task");
    for p in &after {
        if let Some(uid) = before.get(&p.name_any()) {
            assert_eq!(
                p.uid().as_ref(),
                Some(uid),
                "pod {} was replaced instead of re-attached",
                p.name_any()
            );
        }
    }
    let tasks_now = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&ListParams::default())
        .await?;
    assert_eq!(tasks_now.items.len(), tasks.len());

    destroy(&fx, "er").await?;
    op.stop().await?;
    finish(fx).await
}

/// An operator killed half-way through a FairMQ device's CONFIGURE (the device left in
/// BOUND) is replaced: the new operator carries the sequence on from BOUND (CONNECT, INIT
/// TASK) and the transition succeeds; it is neither failed as "unreachable" nor started over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_carries_on_a_fairmq_sequence_left_part_way() -> Res {
    let fx = fixture("fmq-resume").await?;
    let sims = Sims::start(&fx);
    let op = start(&fx, None).await?;
    let mut t = task_ref(
        "eq",
        "flp003",
        "stfbuilder-senderoutput",
        7,
        ControlMode::Fairmq,
    );
    t.channels
        .insert("chans.out.0.transport".into(), "shmem".into());
    deploy(&fx, "eq", std::slice::from_ref(&t), false).await?;
    wait_env(&fx, "eq", "STANDBY", state_is(State::Standby)).await?;
    op.stop().await?;

    // What the killed operator had sent: the first three of CONFIGURE's five steps.
    let pod = Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&t.name)
        .await?;
    let ip = pod.status.and_then(|s| s.pod_ip).ok_or("no pod IP")?;
    let addr = std::net::SocketAddr::new(ip.parse()?, t.control_port);
    for (from, event) in [
        ("IDLE", "INIT DEVICE"),
        ("INITIALIZING DEVICE", "COMPLETE INIT"),
        ("INITIALIZED", "BIND"),
    ] {
        let reply = envbridge::control::ControlClient::default()
            .device_step(addr, from.parse()?, event.parse()?, Duration::from_secs(5))
            .await?;
        assert!(reply.ok, "{event}: {reply:?}");
    }

    let op = start(&fx, None).await?;
    transition(&fx, "eq", "c1", Event::Configure).await?;
    let t0 = Instant::now();
    assert_succeeded(&wait_transition(&fx, "eq", "c1").await?);
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t0.elapsed()
    );
    wait_env(&fx, "eq", "CONFIGURED", state_is(State::Configured)).await?;
    destroy(&fx, "eq").await?;
    op.stop().await?;
    sims.stop().await;
    finish(fx).await
}

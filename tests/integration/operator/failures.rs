//! Failures the operator reports: a failed or never-Running pod, a placement, template or
//! TaskSet problem, each on its Task and Environment.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_pod_turns_task_and_environment_to_error_unless_not_critical() -> Res {
    let fx = fixture("fail").await?;
    let op = start(&fx, None).await?;
    let mut tasks: Vec<TaskRef> = ["flp001", "flp002"]
        .iter()
        .map(|h| task_ref("ef", h, "readout", 1, ControlMode::Basic))
        .collect();
    tasks[1].critical = false;
    deploy(&fx, "ef", &tasks, false).await?;
    wait_env(&fx, "ef", "STANDBY", state_is(State::Standby)).await?;
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let fail_pod = |name: String| {
        let pods = pods.clone();
        async move {
            let patch = json!({"metadata": {
                "labels": {"envbridge.dev/sim-fail": "1"},
                "annotations": {"envbridge.dev/sim-message": "disk full"}}});
            pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
    };

    // Non-critical: reported and named, the environment's state stays.
    fail_pod(tasks[1].name.clone()).await?;
    let t0 = Instant::now();
    let env = wait_env(&fx, "ef", "non-critical failure listed", |e| {
        e.status
            .as_ref()
            .is_some_and(|s| !s.failing_tasks.is_empty())
    })
    .await?;
    println!(
        "non-critical pod failure reported on the environment after {:?}",
        t0.elapsed()
    );
    let st = env.status.unwrap();
    assert_eq!(st.state, Some(State::Standby));
    assert_eq!(st.failing_tasks.len(), 1);
    let f = &st.failing_tasks[0];
    assert_eq!(
        (f.name.as_str(), f.critical),
        (tasks[1].name.as_str(), false)
    );
    assert!(f.message.contains("disk full"), "{}", f.message);
    let task = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&tasks[1].name)
        .await?;
    let ts = task.status.unwrap();
    assert_eq!(ts.state, Some(State::Error));
    assert_eq!(ts.pod_phase.as_deref(), Some("Failed"));
    assert!(ts.message.unwrap().contains("exited with code"));

    // Critical: the environment turns ERROR, naming the task and the reason.
    fail_pod(tasks[0].name.clone()).await?;
    let t0 = Instant::now();
    let env = wait_env(&fx, "ef", "ERROR", state_is(State::Error)).await?;
    println!(
        "critical pod failure turned the environment to ERROR after {:?}",
        t0.elapsed()
    );
    let st = env.status.unwrap();
    let crit = st
        .failing_tasks
        .iter()
        .find(|f| f.critical)
        .expect("critical task named");
    assert_eq!(crit.name, tasks[0].name);
    assert!(crit.message.contains("disk full"));
    // A failed task's story survives: its last log lines (the termination message) and the
    // pod's Warning events are in its status; its pod is kept (for `envbridge logs`) until
    // the environment goes, and no new pod is made.
    let task = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&tasks[0].name)
        .await?;
    let ts = task.status.unwrap();
    assert!(
        ts.last_log
            .as_deref()
            .is_some_and(|l| l.contains("disk full")),
        "{ts:?}"
    );
    let deadline = Instant::now() + WAIT;
    let mut ts = ts;
    while !ts.pod_events.iter().any(|e| e.starts_with("BackOff: ")) {
        // kwok writes the event just after the status: the operator looks again for a while.
        assert!(Instant::now() < deadline, "no BackOff event in {ts:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        ts = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
            .get(&tasks[0].name)
            .await?
            .status
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let kept = pods.list(&ListParams::default()).await?.items;
    assert_eq!(
        kept.len(),
        2,
        "failed pods are kept until the environment goes"
    );
    assert!(
        kept.iter()
            .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")),
        "a failed task's pod was re-created"
    );
    let task_events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.admin.clone(), &fx.ns)
            .list(&ListParams::default())
            .await?;
    assert!(
        task_events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("ProcessFailed")
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Task")),
        "no ProcessFailed event on the Task"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&ListParams::default())
        .await?;
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("StateError")),
        "no StateError event"
    );

    destroy(&fx, "ef").await?;
    assert!(
        pods.list(&ListParams::default()).await?.items.is_empty(),
        "the environment's destroy leaves no pod"
    );
    op.stop().await?;
    finish(fx).await
}

/// A pod that is not Running within the start-up timeout fails its task with the pod's own
/// words (held Pending by the `pod-sim-pending` kwok stage, which adds FailedScheduling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_pending_past_the_startup_timeout_fails_its_task_with_its_events() -> Res {
    let fx = fixture("pending").await?;
    let op = start_with(
        &fx,
        OperatorArgs {
            // Long enough that kwok has marked the pod Unschedulable under a loaded machine
            // (3 s once passed before it had, while a release build ran beside the suite).
            startup_timeout_seconds: 8,
            ..args(&fx.ns, None)
        },
    )
    .await?;
    let mut t = task_ref("ep", "flp001", "readout", 1, ControlMode::Basic);
    t.env.push(EnvVar {
        name: envbridge::dev::stages::SIM_PENDING_ENV.into(),
        value: "1".into(),
    });
    deploy(&fx, "ep", &[t.clone()], false).await?;
    let started = Instant::now();
    let env = wait_env(&fx, "ep", "ERROR", state_is(State::Error)).await?;
    println!("start-up failure reported after {:?}", started.elapsed());
    let st = env.status.unwrap();
    let f = &st.failing_tasks[0];
    assert_eq!(f.name, t.name);
    assert!(f.message.contains("not Running after 8s"), "{}", f.message);
    assert!(f.message.contains("Unschedulable"), "{}", f.message);
    let task = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&t.name)
        .await?;
    let ts = task.status.unwrap();
    assert!(
        ts.pod_events
            .iter()
            .any(|e| e.starts_with("FailedScheduling: ") && e.contains("hugepages")),
        "{ts:?}"
    );
    destroy(&fx, "ep").await?;
    op.stop().await?;
    finish(fx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_template_and_taskset_problems_are_reported() -> Res {
    let fx = fixture("problems").await?;
    // A template without hostNetwork/hostIPC (admins write templates: the admin client here).
    let tmpl_name = format!("{}-nohost", fx.ns);
    let tmpl: TaskTemplate = serde_json::from_value(json!({
        "apiVersion": "envbridge.dev/v1alpha1", "kind": "TaskTemplate",
        "metadata": {"name": tmpl_name},
        "spec": {"controlMode": "basic", "pod": {"containers": [{"name": "t", "image": "registry.invalid/x:1"}]}}
    }))?;
    let tmpls: Api<TaskTemplate> = Api::all(fx.admin.clone());
    tmpls
        .patch(
            &tmpl_name,
            &PatchParams::apply("envbridge-tests").force(),
            &Patch::Apply(&tmpl),
        )
        .await?;
    // The operator's identity may read templates but not write them.
    let as_operator: Api<TaskTemplate> = Api::all(operator_client(&fx.kubeconfig).await?);
    let denied = as_operator
        .delete(&tmpl_name, &DeleteParams::default())
        .await;
    assert!(
        matches!(denied, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{denied:?}"
    );

    let op = start(&fx, None).await?;
    let mut ipc = task_ref("ep", "flp001", "readout", 1, ControlMode::Basic);
    ipc.template = tmpl_name.clone();
    let nowhere = task_ref("ep", "flp999", "readout", 2, ControlMode::Basic);
    let mut no_tmpl = task_ref("ep", "flp002", "readout", 3, ControlMode::Basic);
    no_tmpl.template = "does-not-exist".into();
    deploy(
        &fx,
        "ep",
        &[ipc.clone(), nowhere.clone(), no_tmpl.clone()],
        false,
    )
    .await?;
    let env = wait_env(&fx, "ep", "ERROR with 3 failing", |e| {
        state_is(State::Error)(e)
            && e.status
                .as_ref()
                .is_some_and(|s| s.failing_tasks.len() == 3)
    })
    .await?;
    let msg = |name: &str| {
        env.status
            .as_ref()
            .unwrap()
            .failing_tasks
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.message.clone())
            .unwrap_or_default()
    };
    assert!(
        msg(&ipc.name).contains("lacks hostNetwork and hostIPC"),
        "{}",
        msg(&ipc.name)
    );
    assert!(
        msg(&nowhere.name).contains("no Node for machine_id \"flp999\""),
        "{}",
        msg(&nowhere.name)
    );
    assert!(
        msg(&no_tmpl.name).contains("TaskTemplate \"does-not-exist\" not found"),
        "{}",
        msg(&no_tmpl.name)
    );
    assert!(
        Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );

    // An Environment naming a TaskSet that is not there (or altered) gets no Tasks at all.
    let sets: Api<TaskSet> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let good = [task_ref("eh", "flp001", "readout", 1, ControlMode::Basic)];
    deploy(&fx, "eh", &good, false).await?;
    wait_env(&fx, "eh", "STANDBY", state_is(State::Standby)).await?;
    let altered = TaskSet::new(
        "eh2-0",
        TaskSetSpec {
            environment: "eh2".into(),
            tasks: vec![task_ref("eh2", "flp001", "readout", 1, ControlMode::Basic)],
        },
    );
    sets.patch(
        "eh2-0",
        &PatchParams::apply("envbridge-tests").force(),
        &Patch::Apply(&altered),
    )
    .await?;
    let env = Environment::new(
        "eh2",
        EnvironmentSpec {
            id: "eh2".into(),
            tasks: 1,
            nodes: 1,
            task_sets: vec![
                TaskSetRef {
                    name: "eh2-0".into(),
                    blake3: "0".repeat(64),
                    tasks: 1,
                },
                TaskSetRef {
                    name: "eh2-missing".into(),
                    blake3: "0".repeat(64),
                    tasks: 0,
                },
            ],
            ..Default::default()
        },
    );
    Api::<Environment>::namespaced(fx.admin.clone(), &fx.ns)
        .patch(
            "eh2",
            &PatchParams::apply("envbridge-tests").force(),
            &Patch::Apply(&env),
        )
        .await?;
    let e = wait_env(&fx, "eh2", "TaskSetsVerified=False", |e| {
        e.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "TaskSetsVerified" && c.status == "False")
        })
    })
    .await?;
    let cond = e
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "TaskSetsVerified")
        .unwrap();
    assert_eq!(cond.reason, "HashMismatch", "{}", cond.message);
    let eh2_tasks = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&ListParams::default().labels("envbridge.dev/environment=eh2"))
        .await?;
    assert!(
        eh2_tasks.items.is_empty(),
        "tasks were created from an unverified set"
    );

    for e in ["ep", "eh", "eh2"] {
        Api::<Environment>::namespaced(fx.admin.clone(), &fx.ns)
            .delete(e, &DeleteParams::default())
            .await?;
    }
    destroy_all(&fx).await?;
    tmpls.delete(&tmpl_name, &DeleteParams::default()).await?;
    op.stop().await?;
    finish(fx).await
}

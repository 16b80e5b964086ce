//! An environment through its life: Tasks, Pods and Services made on their hosts, the tasks
//! driven over their control protocols, everything gone after; only namespaces with
//! environments get pods.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_become_tasks_pods_and_services_and_leave_nothing_behind() -> Res {
    let fx = fixture("three").await?;
    let op = start(&fx, None).await?;
    let hosts = ["flp001", "flp002", "flp003"];
    let tasks: Vec<TaskRef> = hosts
        .iter()
        .map(|h| task_ref("e3", h, "readout", 1, ControlMode::Basic))
        .collect();
    deploy(&fx, "e3", &tasks, true).await?;
    let env = wait_env(&fx, "e3", "STANDBY 3/3", |e| {
        state_is(State::Standby)(e)
            && e.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("3/3")
    })
    .await?;
    let st = env.status.unwrap();
    assert_eq!(st.counts, BTreeMap::from([(State::Standby, 3)]));
    assert_eq!(st.observed_generation, env.metadata.generation);
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "TaskSetsVerified" && c.status == "True")
    );

    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let task_api: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let svcs: Api<Service> = Api::namespaced(fx.admin.clone(), &fx.ns);
    for (host, tref) in hosts.iter().zip(&tasks) {
        let task = task_api.get(&tref.name).await?;
        assert_eq!(task.owner_references()[0].kind, "Environment");
        assert_eq!(task.labels()["envbridge.dev/node"], *host);
        assert_eq!(task.annotations()["envbridge.dev/role-path"], tref.path);
        let ts = task.status.clone().unwrap();
        let node = format!("{host}.cluster.local");
        assert_eq!(ts.node_name.as_deref(), Some(node.as_str()));
        assert_eq!(ts.pod_phase.as_deref(), Some("Running"));
        assert!(
            ts.pod_ip
                .as_deref()
                .is_some_and(|ip| ip.starts_with("127.")),
            "{:?}",
            ts.pod_ip
        );

        let pod = pods.get(&tref.name).await?;
        let spec = pod.spec.clone().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(node.as_str()));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.owner_references()[0].kind, "Task");
        assert_eq!(pod.owner_references()[0].uid, task.uid().unwrap());
        assert_eq!(env_value(&pod, "USER").as_deref(), Some("alice"));
        assert_eq!(env_value(&pod, "HOME").as_deref(), Some("/home/alice"));
        assert_eq!(env_value(&pod, "POD_IP").as_deref(), Some("status.podIP"));
        assert_eq!(
            env_value(&pod, "OCC_CONTROL_PORT").as_deref(),
            Some("47101")
        );
        assert_eq!(
            env_value(&pod, "ENVBRIDGE_CONTROL_MODE").as_deref(),
            Some("basic")
        );
        assert_eq!(env_value(&pod, "O2_ROLE").as_deref(), Some(*host));
        // The template's logFile wraps the command in bash + tee; the task's args follow it.
        let c = &spec.containers[0];
        assert_eq!(c.command.as_ref().unwrap()[0], "/bin/bash");
        assert!(c.command.as_ref().unwrap()[2].contains("tee -a /tmp/envbridge-readout.log"));
        assert_eq!(
            c.args.as_ref().unwrap(),
            &vec![
                "/opt/o2/bin/task".to_string(),
                "--bind=tcp://$(POD_IP):5555".into(),
                "consul-ini://localhost:8500/x".into()
            ]
        );
        let svc = svcs.get(&tref.name).await?;
        let sspec = svc.spec.unwrap();
        assert_eq!(sspec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(sspec.ports.unwrap()[0].port, i32::from(DISCOVERY_PORT));
    }

    // A transition is copied to every Task and reported on the Environment by its id.
    transition(&fx, "e3", "cfg-1", Event::Configure).await?;
    let env = wait_env(&fx, "e3", "CONFIGURED", state_is(State::Configured)).await?;
    let tr = env.status.unwrap().transition.unwrap();
    assert_eq!(
        (tr.id.as_str(), tr.phase),
        ("cfg-1", TransitionPhase::Succeeded)
    );
    for t in task_api.list(&ListParams::default()).await? {
        assert_eq!(t.spec.transition.as_ref().unwrap().id, "cfg-1");
    }
    // A transition that does not apply fails, naming the task, without touching states.
    transition(&fx, "e3", "recover-1", Event::Recover).await?;
    let env = wait_env(&fx, "e3", "RECOVER failed", |e| {
        e.status
            .as_ref()
            .and_then(|s| s.transition.as_ref())
            .is_some_and(|t| t.id == "recover-1" && t.phase == TransitionPhase::Failed)
    })
    .await?;
    let st = env.status.unwrap();
    let msg = st.transition.unwrap().message;
    assert!(
        msg.contains("RECOVER does not apply in state CONFIGURED"),
        "{msg}"
    );
    assert_eq!(st.state, Some(State::Configured));

    destroy(&fx, "e3").await?;
    op.stop().await?;
    finish(fx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_and_fairmq_tasks_are_driven_over_the_control_protocol() -> Res {
    let fx = fixture("drive").await?;
    let sims = Sims::start(&fx);
    let op = start(&fx, None).await?;
    let mut tasks = Vec::new();
    for host in ["flp001", "flp002"] {
        tasks.push(task_ref("ed", host, "readout", 1, ControlMode::Direct));
        let mut stfb = task_ref(
            "ed",
            host,
            "stfbuilder-senderoutput",
            2,
            ControlMode::Fairmq,
        );
        stfb.channels
            .insert("chans.out.0.transport".into(), "shmem".into());
        tasks.push(stfb);
    }
    deploy(&fx, "ed", &tasks, false).await?;
    wait_env(&fx, "ed", "STANDBY 4/4", |e| {
        state_is(State::Standby)(e)
            && e.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("4/4")
    })
    .await?;
    // Each Task keeps the pid its process reported when it first answered.
    let task_api: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    for t in &tasks {
        let got = task_api.get(&t.name).await?;
        let pid = got.status.and_then(|s| s.pid);
        assert!(pid.is_some_and(|p| p > 0), "{}: pid {pid:?}", t.name);
    }
    for (id, event, target) in [
        ("c1", Event::Configure, State::Configured),
        ("s1", Event::Start, State::Running),
        ("p1", Event::Stop, State::Configured),
        ("r1", Event::Reset, State::Standby),
    ] {
        let took = transition_succeeds(&fx, "ed", id, event).await?;
        println!("{event}: {took:?} for 4 tasks (2 direct, 2 fairmq)");
        let env = wait_env(&fx, "ed", &format!("{target}"), state_is(target)).await?;
        assert_eq!(env.status.unwrap().ready.as_deref(), Some("4/4"));
    }

    // A task whose process answers CONFIGURE with ok=false: its Task and the transition fail,
    // naming it, and the environment turns ERROR.
    let mut bad = task_ref("eb", "flp003", "readout", 1, ControlMode::Direct);
    bad.env.push(EnvVar {
        name: "ENVBRIDGE_SIM_FAIL_ON".into(),
        value: "CONFIGURE".into(),
    });
    let good = task_ref("eb", "flp003", "readout", 2, ControlMode::Direct);
    deploy(&fx, "eb", &[bad.clone(), good], false).await?;
    wait_env(&fx, "eb", "STANDBY", state_is(State::Standby)).await?;
    let t0 = Instant::now();
    transition(&fx, "eb", "c1", Event::Configure).await?;
    let env = wait_env(&fx, "eb", "CONFIGURE failed", |e| {
        e.status
            .as_ref()
            .and_then(|s| s.transition.as_ref())
            .is_some_and(|t| t.phase == TransitionPhase::Failed)
    })
    .await?;
    println!("failed CONFIGURE reported after {:?}", t0.elapsed());
    let st = env.status.unwrap();
    let msg = st.transition.unwrap().message;
    assert!(msg.contains(&bad.name), "{msg}");
    let env = wait_env(&fx, "eb", "ERROR", state_is(State::Error)).await?;
    assert_eq!(env.status.unwrap().failing_tasks[0].name, bad.name);

    for e in ["ed", "eb"] {
        Api::<Environment>::namespaced(fx.admin.clone(), &fx.ns)
            .delete(e, &DeleteParams::default())
            .await?;
    }
    destroy_all(&fx).await?;
    op.stop().await?;
    sims.stop().await;
    finish(fx).await
}

/// The operator's ServiceAccount writes pods only where the workloads role is bound.
#[tokio::test]
async fn the_operator_writes_pods_only_where_environments_live() -> Res {
    let fx = fixture("rbac-scope").await?;
    let other = TestNamespace::new("op-unmanaged").await;
    let op = operator_client(&fx.kubeconfig).await?;
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    }))?;
    let denied = Api::<Pod>::namespaced(op.clone(), &other.name)
        .create(&Default::default(), &pod)
        .await
        .expect_err("a pod in an unmanaged namespace");
    assert!(
        matches!(denied, kube::Error::Api(ref s) if s.code == 403),
        "{denied}"
    );
    // Reading is allowed everywhere (its watches are label-selected, cluster-wide).
    Api::<Pod>::namespaced(op.clone(), &other.name)
        .list(&ListParams::default())
        .await?;
    let made = Api::<Pod>::namespaced(op, &fx.ns)
        .create(&Default::default(), &pod)
        .await?;
    assert_eq!(made.name_any(), "probe");
    finish(fx).await
}

/// A new render of an environment rewrites its Tasks to exactly the new references: a
/// field the new render drops is gone from the Task (Tasks are created by a plain create
/// and updated by merge patches, never server-side applied: an apply after a create would
/// leave such a field behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_render_rewrites_its_tasks_exactly() -> Res {
    let fx = fixture("rerender").await?;
    let op = start(&fx, None).await?;
    let first: Vec<TaskRef> = ["flp001", "flp002"]
        .iter()
        .map(|h| {
            let mut t = task_ref("er", h, "readout", 1, ControlMode::Basic);
            t.properties =
                BTreeMap::from([("kept".into(), "1".into()), ("gone".into(), "x".into())]);
            t
        })
        .collect();
    deploy(&fx, "er", &first, true).await?;
    wait_env(&fx, "er", "STANDBY 2/2", |e| {
        e.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("2/2")
    })
    .await?;
    let task_api: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    for t in &first {
        let task = task_api.get(&t.name).await?;
        assert_eq!(task.spec.task, *t);
        let applied = task
            .managed_fields()
            .iter()
            .any(|m| m.operation.as_deref() == Some("Apply"));
        assert!(!applied, "{:?}", task.managed_fields());
    }

    let second: Vec<TaskRef> = first
        .iter()
        .map(|t| {
            let mut t = t.clone();
            t.properties.remove("gone");
            t.user = None;
            t.args.pop();
            t
        })
        .collect();
    deploy(&fx, "er", &second, true).await?;
    let deadline = Instant::now() + WAIT;
    for t in &second {
        loop {
            let task = task_api.get(&t.name).await?;
            if task.spec.task == *t {
                assert!(
                    task.finalizers()
                        .iter()
                        .any(|f| f == "envbridge.dev/task-cleanup")
                );
                assert_eq!(task.owner_references().len(), 1);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "Task {} never became the new render: {:?}",
                t.name,
                task.spec.task
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Still driven as before.
    transition_succeeds(&fx, "er", "cfg-1", Event::Configure).await?;
    destroy(&fx, "er").await?;
    op.stop().await?;
    finish(fx).await
}

/// A create refused because the Task is there, unseen by the operator's store: a Task
/// without a controller (left by hand or orphaned) is made the wanted one and adopted; one
/// that another object controls is left alone and named in the Environment's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_already_there_is_adopted_or_named_as_taken() -> Res {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::PostParams;

    let fx = fixture("taken").await?;
    let tasks: Vec<TaskRef> = ["flp001", "flp002"]
        .iter()
        .map(|h| task_ref("ta", h, "readout", 1, ControlMode::Basic))
        .collect();
    let task_api: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let hand = |t: &TaskRef| {
        let mut task = t.clone();
        task.command = "/by/hand".into();
        Task::new(
            &t.name,
            envbridge::crd::TaskSpec {
                environment: "someone-else".into(),
                task,
                transition: None,
            },
        )
    };
    let pp = PostParams::default();
    task_api.create(&pp, &hand(&tasks[0])).await?;
    let holders: Api<ConfigMap> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let mut holder = ConfigMap::default();
    holder.metadata.name = Some("holder".into());
    let holder = holders.create(&pp, &holder).await?;
    let mut held = hand(&tasks[1]);
    held.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "holder".into(),
        uid: holder.uid().unwrap_or_default(),
        controller: Some(true),
        ..Default::default()
    }]);
    task_api.create(&pp, &held).await?;

    let op = start(&fx, None).await?;
    deploy(&fx, "ta", &tasks, true).await?;
    let env = wait_env(&fx, "ta", "TasksCreated False, NameTaken", |e| {
        e.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "TasksCreated" && c.reason == "NameTaken")
        })
    })
    .await?;
    let cond = env.status.unwrap_or_default().conditions;
    let cond = cond.iter().find(|c| c.type_ == "TasksCreated").unwrap();
    assert_eq!(cond.status, "False");
    assert!(
        cond.message.contains(&tasks[1].name) && cond.message.contains("ConfigMap/holder"),
        "{}",
        cond.message
    );
    // The uncontrolled one: the wanted Task, this environment's.
    let deadline = Instant::now() + WAIT;
    loop {
        let task = task_api.get(&tasks[0].name).await?;
        let owned = task
            .owner_references()
            .iter()
            .any(|o| o.kind == "Environment" && o.name == "ta" && o.controller == Some(true));
        if task.spec.task == tasks[0] && task.spec.environment == "ta" && owned {
            assert!(
                task.finalizers()
                    .iter()
                    .any(|f| f == "envbridge.dev/task-cleanup")
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never adopted: {:?} {:?}",
            task.spec,
            task.owner_references()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The held one is untouched.
    let still = task_api.get(&tasks[1].name).await?;
    assert_eq!(still.spec.task.command, "/by/hand");
    assert_eq!(still.owner_references().len(), 1);

    task_api
        .delete(&tasks[1].name, &DeleteParams::default())
        .await?;
    holders.delete("holder", &DeleteParams::default()).await?;
    destroy(&fx, "ta").await?;
    op.stop().await?;
    finish(fx).await
}

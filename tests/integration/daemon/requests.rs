//! What a create decides and refuses: a shard's labels, the ports of a kill's repack and of
//! live environments, every problem of an invalid request listed with nothing written.

use super::*;

/// A daemon of an operator shard labels what it creates with it (the Environment and its
/// TaskSets), and a kill's re-packed sets keep the environment's shard.
#[tokio::test]
async fn a_shard_daemon_labels_its_environments_and_their_sets() {
    use envbridge::crd::labels::SHARD;
    let ns = Setup::shared("daemon-shard").await;
    let _sim = ns.sim(SimConfig::default());
    let mut cfg = fixed_ns(&ns.name);
    cfg.shard = Some("its".into());
    let d = ns.daemon_with(cfg).await;
    let mut api = d.client().await;
    let c = fixture::create(&mut api, create_req("", "flp001,flp002", 48400)).await;
    assert_eq!(c.outcome, "reached", "{}", c.message);
    let envs: Api<Environment> = ns.api();
    let sets: Api<TaskSet> = ns.api();
    let shards = || async {
        let env = envs.get(&c.id).await.expect("environment");
        let mut found = vec![env.metadata.labels.unwrap_or_default().remove(SHARD)];
        for r in &env.spec.task_sets {
            let set = sets.get(&r.name).await.expect("set");
            found.push(set.metadata.labels.unwrap_or_default().remove(SHARD));
        }
        found
    };
    let before = shards().await;
    assert!(before.len() >= 2, "{before:?}");
    assert!(
        before.iter().all(|s| s.as_deref() == Some("its")),
        "{before:?}"
    );
    let victim = format!("{}-flp002-stfsender", c.id);
    assert!(fixture::kill(&mut api, &c.id, &victim).await);
    let after = shards().await;
    assert!(
        after.iter().all(|s| s.as_deref() == Some("its")),
        "{after:?}"
    );
}

/// A kill re-packs the environment with the render's packer: the sets are named
/// `{env}-{index:04}-{hash}` and verify against their content, also for an environment written
/// under the older scheme (one `{env}-{hash}` set per 200 tasks; here one per task).
#[tokio::test]
async fn a_kill_repacks_under_the_render_scheme_also_an_older_environment() {
    use envbridge::crd::{TaskSetRef, TaskSetSpec};
    use envbridge::model::digest::tasks_digest;
    let ns = Setup::shared("daemon-repack").await;
    let _sim = ns.sim(SimConfig::default());
    let d = ns.daemon().await;
    let id = "old";
    let mut objs = fixture::readout_dataflow(
        id,
        &ns.tpl.prefix,
        &fixture::hosts(2),
        48900,
        &Default::default(),
    );
    let tasks = objs.task_sets[0].spec.tasks.clone();
    objs.task_sets = tasks
        .iter()
        .map(|t| {
            let sha = tasks_digest(std::slice::from_ref(t));
            TaskSet::new(
                &format!("{id}-{}", &sha[..10]),
                TaskSetSpec {
                    environment: id.into(),
                    tasks: vec![t.clone()],
                },
            )
        })
        .collect();
    objs.environment.spec.task_sets = objs
        .task_sets
        .iter()
        .map(|ts| TaskSetRef {
            name: ts.metadata.name.clone().unwrap_or_default(),
            blake3: tasks_digest(&ts.spec.tasks),
            tasks: 1,
        })
        .collect();
    fixture::apply_standby(&d, &ns.name, objs).await;
    assert_eq!(names::<TaskSet>(&ns.client, &ns.name).await.len(), 6);

    let mut api = d.client().await;
    let victim = format!("{id}-flp002-stfsender");
    assert!(fixture::kill(&mut api, id, &victim).await);
    let envs: Api<Environment> = ns.api();
    let sets: Api<TaskSet> = ns.api();
    let env = envs.get(id).await.expect("environment");
    let in_cluster = names::<TaskSet>(&ns.client, &ns.name).await;
    let named: std::collections::BTreeSet<String> =
        env.spec.task_sets.iter().map(|r| r.name.clone()).collect();
    assert_eq!(
        in_cluster, named,
        "the old sets are gone, the new ones named"
    );
    let mut left = Vec::new();
    for r in &env.spec.task_sets {
        let (head, hash) = r.name.rsplit_once('-').expect("a hash");
        let index = head
            .strip_prefix(&format!("{id}-"))
            .expect("the environment");
        assert!(
            index.len() == 4 && index.bytes().all(|b| b.is_ascii_digit()),
            "{}",
            r.name
        );
        let ts = sets.get(&r.name).await.expect("set");
        assert_eq!(r.blake3, tasks_digest(&ts.spec.tasks), "{}", r.name);
        assert_eq!(hash, &r.blake3[..10]);
        left.extend(ts.spec.tasks.into_iter().map(|t| t.name));
    }
    assert_eq!((left.len(), env.spec.tasks), (5, 5));
    assert!(!left.contains(&victim));
    let r = fixture::run_transition(&mut api, transition(id, "CONFIGURE", &[])).await;
    assert!(r.ok && r.tasks == 5, "{}", r.message);
}

#[tokio::test]
async fn invalid_requests_list_every_problem_and_write_nothing() {
    let ns = Setup::shared("daemon-invalid").await;
    let d = ns.daemon().await;
    let mut objs = fixture::readout_dataflow(
        "bad",
        &ns.tpl.prefix,
        &fixture::hosts(2),
        47100,
        &Default::default(),
    );
    let tasks = &mut objs.task_sets[0].spec.tasks;
    tasks[0].template = "no-such-template".into();
    tasks[1].env.retain(|e| &*e.name != "OCC_CONTROL_PORT");
    tasks[4].name = "Bad_Name".into();
    let err = d
        .bridge
        .apply(objs, &ns.name, &Default::default())
        .await
        .expect_err("invalid");
    let msg = err.to_string();
    assert!(msg.contains("\"no-such-template\" does not exist"), "{msg}");
    assert!(
        msg.contains("bad-flp001-stfbuilder") && msg.contains("OCC_CONTROL_PORT"),
        "{msg}"
    );
    assert!(msg.contains("Bad_Name"), "{msg}");
    assert!(names::<TaskSet>(&ns.client, &ns.name).await.is_empty());
    assert!(names::<Environment>(&ns.client, &ns.name).await.is_empty());

    // Through the API: an unknown workflow is InvalidArgument, nothing written either.
    let mut api = d.client().await;
    let mut req = create_req("", "flp001", 47100);
    req.workflow = "nope".into();
    let st = api
        .create_environment(req)
        .await
        .expect_err("unknown workflow");
    assert_eq!(st.code(), tonic::Code::InvalidArgument);
    assert!(names::<Environment>(&ns.client, &ns.name).await.is_empty());
}

#[tokio::test]
async fn ports_stay_disjoint_across_live_environments() {
    let ns = Setup::shared("daemon-ports").await;
    let _sim = ns.sim(SimConfig::default());
    let d = ns.daemon().await;
    let mut api = d.client().await;
    let a = fixture::create(&mut api, create_req("a", "flp001,flp002", 47100)).await;
    // Same nodes, same preferred range: the second must get other ports.
    let b = fixture::create(&mut api, create_req("b", "flp002,flp003", 47100)).await;
    let ports = |id: &str| {
        let key = EnvKey::new(&ns.name, id);
        let mut m: HashMap<String, Vec<u16>> = HashMap::new();
        for t in d.bridge.roster.tasks_of(&key) {
            m.entry(t.node.to_string())
                .or_default()
                .extend(t.ports.iter());
        }
        m
    };
    let (pa, pb) = (ports(&a.id), ports(&b.id));
    let shared = &pa["flp002"];
    assert!(!shared.is_empty());
    assert!(
        pb["flp002"].iter().all(|p| !shared.contains(p)),
        "{pa:?} vs {pb:?}"
    );
    // Applying objects that reuse a live environment's ports is refused.
    let clash = fixture::readout_dataflow(
        "clash",
        &ns.tpl.prefix,
        &fixture::hosts(1),
        47100,
        &Default::default(),
    );
    let taken = d.bridge.taken_ports(None);
    let err = d
        .bridge
        .apply(clash, &ns.name, &taken)
        .await
        .expect_err("port clash");
    assert!(
        err.to_string()
            .contains("already used by another live environment"),
        "{err}"
    );
}

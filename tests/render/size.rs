//! Size: a synthetic environment of many nodes renders the same with any number of threads,
//! every object fits under 1 MiB, reserved ports are skipped.

use super::*;

/// A synthetic workflow: `per_node` tasks of one class per host, chained by TCP and IPC channels.
fn synthetic(dir: &Path, per_node: usize) {
    std::fs::create_dir_all(dir.join("tasks")).unwrap();
    let mut args = String::new();
    for i in 0..20 {
        args.push_str(&format!("    - \"--option-{i}={{{{ opt_{i} }}}}\"\n"));
    }
    let mut defaults = String::new();
    for i in 0..20 {
        defaults.push_str(&format!("  opt_{i}: value-{i}-{{{{ task_hostname }}}}\n"));
    }
    std::fs::write(
        dir.join("tasks/worker.yaml"),
        format!(
            "name: worker\ncontrol:\n  mode: fairmq\ndefaults:\n{defaults}bind:\n  - name: out\n    type: push\n    \
             addressing: tcp\n  - name: local\n    type: pub\n    addressing: ipc\n    transport: shmem\n\
             command:\n  env:\n    - O2_DETECTOR={{{{ detector }}}}\n    - O2_PARTITION={{{{ environment_id }}}}\n  \
             value: \"{{{{ o2_install_path }}}}/bin/worker\"\n  arguments:\n{args}    - \"{{{{ flag == 'true' ? '--x' : ' ' }}}}\"\n"
        ),
    )
    .unwrap();
    let mut roles = String::new();
    for i in 0..per_node {
        roles.push_str(&format!(
            "      - name: w{i}\n        task:\n          load: worker\n"
        ));
        if i > 0 {
            roles.push_str(&format!(
                "        connect:\n          - name: in\n            type: pull\n            target: \"{{{{ Parent().Path }}}}.w{}:out\"\n",
                i - 1
            ));
        }
    }
    std::fs::write(
        dir.join("big.yaml"),
        format!(
            "name: big\ndefaults:\n  flag: \"false\"\nroles:\n  - name: host-{{{{ it }}}}\n    for:\n      range: \"{{{{ hosts }}}}\"\n      var: it\n    constraints:\n      - attribute: machine_id\n        value: \"{{{{ it }}}}\"\n    roles:\n{roles}"
        ),
    )
    .unwrap();
}

fn big_request(dir: &Path, nodes: usize) -> RenderRequest {
    let hosts: Vec<String> = (1..=nodes).map(|i| format!("flp{i:03}")).collect();
    RenderRequest {
        sources: Sources {
            tasks_dir: dir.join("tasks"),
            workflows_dir: None,
            defaults_files: vec![repo("manifests/site/local.yaml")],
        },
        workflow: dir.join("big.yaml"),
        sets: vec![("hosts".into(), serde_json::to_string(&hosts).unwrap())],
        env_id: Some("big".into()),
        ..RenderRequest::default()
    }
}

/// Resolution and serialization run on several threads for a large render: the objects, and
/// the error reported for a bad input, must not depend on how many.
#[test]
fn the_same_objects_and_errors_for_any_number_of_threads() {
    let dir = tempfile::tempdir().unwrap();
    synthetic(dir.path(), 8);
    let render = |threads: usize, extra: Option<(&str, &str)>| {
        let mut req = big_request(dir.path(), 400);
        req.threads = threads;
        req.task_set_budget = 64 * 1024;
        if let Some((k, v)) = extra {
            req.sets.push((k.into(), v.into()));
        }
        envbridge::objects::render(&req)
            .map(|r| yaml_stream(&r))
            .map_err(|e| e.to_string())
    };
    let one = render(1, None).unwrap();
    assert!(one.matches("kind: TaskSet").count() > 10, "several sets");
    for threads in [2, 3, 8] {
        assert!(render(threads, None).unwrap() == one, "{threads} threads");
    }
    // Tasks on two hosts in different chunks fail; the first in order is reported.
    let bad = Some((
        "opt_3",
        "{{ task_hostname == 'flp399' || task_hostname == 'flp100' ? nope : 'x' }}",
    ));
    let e1 = render(1, bad).unwrap_err();
    assert!(e1.contains("flp100") && e1.contains("`nope`"), "{e1}");
    for threads in [2, 3, 8] {
        assert_eq!(render(threads, bad).unwrap_err(), e1, "{threads} threads");
    }
}

#[test]
fn large_environments_fit_every_object_under_1_mib() {
    const MIB: usize = 1024 * 1024;
    for (nodes, per_node) in [(250, 8), (250, 40)] {
        let dir = tempfile::tempdir().unwrap();
        synthetic(dir.path(), per_node);
        let r = envbridge::objects::render(&big_request(dir.path(), nodes))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.tasks().len(), nodes * per_node);
        assert!(r.task_sets.len() > 1, "split into several TaskSets");
        for v in r.to_json_values() {
            let n = serde_json::to_vec(&v).unwrap().len();
            assert!(n < MIB, "{} is {n} bytes", v["metadata"]["name"]);
        }
        assert!(serde_saphyr::to_string(&r.environment).unwrap().len() < MIB);
        // Ports: unique per node, control and TCP disjoint.
        let mut seen = std::collections::HashSet::new();
        for t in r.tasks() {
            assert!(seen.insert((t.node.clone(), t.control_port)));
            if let Some(a) = t.channels.get("chans.out.0.address") {
                let port: u16 = a.rsplit(':').next().unwrap().parse().unwrap();
                assert!(seen.insert((t.node.clone(), port)), "{a}");
            }
        }
    }
}

#[test]
fn reserved_ports_are_skipped() {
    let mut req = ours(r#"["flp001"]"#, "E1");
    req.reserved_ports
        .insert("flp001".into(), [47100u16, 47101].into_iter().collect());
    let r = envbridge::objects::render(&req).unwrap();
    assert!(r.tasks().all(|t| t.control_port >= 47102));
}

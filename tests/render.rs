//! The render core end to end (pure: no cluster): corpus loading, a golden 3-host
//! readout-dataflow, one test per error class, determinism, sizes, CRDs, fuzzing.
//!
//! Regenerate the golden files with `ENVBRIDGE_BLESS=1 cargo test --test render golden`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use envbridge::objects::Objects;
use envbridge::plan::{self, ControlMode, RenderRequest};
use envbridge::workflow::Sources;
use envbridge::workflow::expr::{CallSite, Engine, Lookup};
use envbridge::workflow::{load, yaml};

/// The shared corpus: `../shared/corpus` beside the repository (CI), or two levels up when the
/// repository is a worktree under `wt/`.
fn corpus() -> PathBuf {
    for c in ["../shared/corpus", "../../shared/corpus"] {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(c);
        if p.is_dir() {
            return p;
        }
    }
    panic!("corpus not found: expected ../shared/corpus beside the repository");
}

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    v
}

fn ours(hosts: &str, env_id: &str) -> RenderRequest {
    RenderRequest {
        sources: Sources {
            tasks_dir: repo("manifests/control-workflows/tasks"),
            workflows_dir: None,
            defaults_files: vec![repo("manifests/site/local.yaml")],
        },
        workflow: repo("manifests/control-workflows/workflows/readout-dataflow.yaml"),
        sets: vec![("hosts".into(), hosts.into())],
        env_id: Some(env_id.into()),
        ..RenderRequest::default()
    }
}

fn yaml_stream(r: &Objects) -> String {
    let mut s = String::new();
    for ts in &r.task_sets {
        s.push_str("---\n");
        s.push_str(&serde_saphyr::to_string(ts).unwrap());
    }
    s.push_str("---\n");
    s.push_str(&serde_saphyr::to_string(&r.environment).unwrap());
    s
}

#[test]
fn every_corpus_task_class_loads() {
    let c = corpus().join("aliecs");
    let mut n = 0;
    for dir in [
        "controlworkflows/tasks",
        "control-operator/control-workflows",
    ] {
        for f in yaml_files(&c.join(dir)) {
            let id = f.file_stem().unwrap().to_string_lossy().to_string();
            let class = load::load_class(&f, &id).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&*class.id, id);
            n += 1;
        }
    }
    assert_eq!(n, 23, "12 task classes + 11 control-operator classes");
    for f in yaml_files(&c.join("controlworkflows/workflows")) {
        load::load_workflow(&f).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn corpus_resources_cleanup_renders_with_a_site_profile() {
    let c = corpus().join("aliecs/controlworkflows");
    let req = RenderRequest {
        sources: Sources {
            tasks_dir: c.join("tasks"),
            workflows_dir: None,
            defaults_files: vec![repo("manifests/site/local.yaml")],
        },
        workflow: c.join("workflows/resources-cleanup.yaml"),
        sets: vec![("hosts".into(), r#"["flp001","flp002"]"#.into())],
        env_id: Some("2oDvieFrVTi".into()),
        ..RenderRequest::default()
    };
    let r = envbridge::objects::render(&req).unwrap_or_else(|e| panic!("{e}"));
    let tasks: Vec<_> = r.tasks().collect();
    let paths: Vec<&str> = tasks.iter().map(|t| t.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "resources-cleanup.host-flp001.fairmq-shmmonitor",
            "resources-cleanup.host-flp001.o2-roc-cleanup",
            "resources-cleanup.host-flp002.fairmq-shmmonitor",
            "resources-cleanup.host-flp002.o2-roc-cleanup",
        ]
    );
    let roc = tasks[1];
    assert_eq!(roc.node, "flp001");
    assert_eq!(roc.user.as_deref(), Some("root"));
    assert_eq!(
        roc.command, "yes | /opt/o2/bin/o2-roc-cleanup",
        "modulepath empty: the plain command line"
    );
    assert_eq!(roc.timeout_seconds, Some(10));
    assert!(
        !roc.needs_host_namespaces(),
        "no channels: no host namespaces needed"
    );
    let env: Vec<(&str, &str)> = roc.env.iter().map(|e| (&*e.name, &*e.value)).collect();
    assert_eq!(
        env,
        [
            ("O2_DETECTOR", "TST"),
            ("O2_PARTITION", "2oDvieFrVTi"),
            ("O2_ROLE", "flp001"),
            ("O2_SYSTEM", "FLP"),
        ]
    );
    assert_eq!(
        (roc.control_mode, roc.control_port),
        (ControlMode::Basic, 0),
        "a basic task (no trigger here) has no control port, as in the anchor"
    );
    // Neither task speaks the control protocol: neither takes a control port.
    assert_eq!((tasks[0].control_port, tasks[1].control_port), (0, 0));
    // --set disables a role.
    let mut req2 = req.clone();
    req2.sets
        .push(("roc_cleanup_enabled".into(), "false".into()));
    assert_eq!(envbridge::objects::render(&req2).unwrap().tasks().len(), 2);
}

#[test]
fn golden_readout_dataflow_3_hosts() {
    let r = envbridge::objects::render(&ours(r#"["flp001","flp002","flp003"]"#, "demo"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.tasks().len(), 9);
    // The stfb's readout input is the readout's output: the same IPC address on one node.
    let find = |p: &str| r.tasks().find(|t| t.path == p).unwrap();
    let ro = find("readout-dataflow.host-flp002.readout");
    let stfb = find("readout-dataflow.host-flp002.data-distribution.stfb");
    let stfs = find("readout-dataflow.host-flp002.data-distribution.stfs");
    let addr = &ro.channels["chans.readout.0.address"];
    assert!(addr.starts_with("ipc://@eb-"), "{addr}");
    assert_eq!(&stfb.channels["chans.readout.0.address"], addr);
    assert_eq!(&*stfb.channels["chans.readout.0.method"], "connect");
    assert_eq!(
        stfs.channels["chans.buildertosender.0.address"],
        stfb.channels["chans.buildertosender.0.address"]
    );
    assert!(
        stfs.args
            .iter()
            .any(|a| a.starts_with("--discovery-id=stfs-flp002-"))
    );
    assert!(stfb.args.ends_with(&[
        "--control-port".into(),
        stfb.control_port.to_string().into()
    ]));

    let tasks = plan::tasks_json(r.tasks());
    let objects = yaml_stream(&r);
    let bless = std::env::var_os("ENVBRIDGE_BLESS").is_some();
    for (file, got) in [
        ("readout-dataflow-3hosts.tasks.json", &tasks),
        ("readout-dataflow-3hosts.yaml", &objects),
    ] {
        let path = repo("tests/golden").join(file);
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, got).unwrap();
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (regenerate with ENVBRIDGE_BLESS=1)",
                path.display()
            )
        });
        assert_eq!(
            got, &want,
            "{file} differs from the golden file (ENVBRIDGE_BLESS=1 regenerates it)"
        );
    }
}

#[test]
fn deterministic_and_distinct_across_environments() {
    let a = envbridge::objects::render(&ours(r#"["flp001","flp002"]"#, "E1")).unwrap();
    let b = envbridge::objects::render(&ours(r#"["flp001","flp002"]"#, "E1")).unwrap();
    assert_eq!(yaml_stream(&a), yaml_stream(&b));
    assert_eq!(
        serde_json::to_string(&a.to_json_values()).unwrap(),
        serde_json::to_string(&b.to_json_values()).unwrap()
    );
    let c = envbridge::objects::render(&ours(r#"["flp001","flp002"]"#, "E2")).unwrap();
    for (x, y) in a.tasks().zip(c.tasks()) {
        assert_ne!(x.name, y.name);
        assert_eq!(x.path, y.path);
    }
    assert_ne!(a.environment.metadata.name, c.environment.metadata.name);
}

#[test]
fn tasks_come_sorted_by_node_and_path_whatever_the_host_order() {
    let a = envbridge::objects::render(&ours(r#"["flp003","flp001","flp002"]"#, "E1")).unwrap();
    let b = envbridge::objects::render(&ours(r#"["flp001","flp002","flp003"]"#, "E1")).unwrap();
    let keys: Vec<(&str, &str)> = a
        .tasks()
        .map(|t| (t.node.as_str(), t.path.as_str()))
        .collect();
    assert!(keys.is_sorted(), "{keys:?}");
    assert_eq!(keys.first().map(|k| k.0), Some("flp001"));
    // Ports are taken in that order too, so the result is the same.
    assert_eq!(yaml_stream(&a), yaml_stream(&b));
}

#[test]
fn task_sets_are_written_first_and_hashed() {
    let r = envbridge::objects::render(&ours(r#"["flp001","flp002","flp003"]"#, "demo")).unwrap();
    let values = r.to_json_values();
    assert_eq!(values.last().unwrap()["kind"], "Environment");
    let spec = &r.environment.spec;
    assert_eq!(spec.task_sets.len(), r.task_sets.len());
    for (rf, ts) in spec.task_sets.iter().zip(&r.task_sets) {
        assert_eq!(Some(&rf.name), ts.metadata.name.as_ref());
        // The content hash, computed independently of the render's piecewise hashing.
        let digest = blake3::hash(&serde_json::to_vec(&ts.spec.tasks).unwrap())
            .to_hex()
            .to_string();
        assert_eq!(rf.blake3, digest);
        assert!(rf.name.ends_with(&digest[..10]), "{}", rf.name);
    }
    assert_eq!(spec.desired_state, envbridge::state::State::Standby);
    assert!(spec.transition.is_none());
    assert_eq!((spec.nodes, spec.tasks), (3, 9));
}

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

// ---- one test per error class: message and FILE:LINE:COLUMN ----

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new(files: &[(&str, &str)]) -> Case {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("tasks")).unwrap();
        std::fs::create_dir_all(dir.path().join("workflows")).unwrap();
        std::fs::write(
            dir.path().join("tasks/t.yaml"),
            "name: t\ncontrol:\n  mode: fairmq\nbind:\n  - name: out\n    type: push\n    addressing: ipc\ncommand:\n  value: /bin/t\n",
        )
        .unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        Case { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn render(&self, workflow: &str) -> String {
        let req = RenderRequest {
            sources: Sources {
                tasks_dir: self.dir.path().join("tasks"),
                workflows_dir: None,
                defaults_files: vec![],
            },
            workflow: self.dir.path().join(workflow),
            sets: vec![],
            env_id: Some("E".into()),
            ..RenderRequest::default()
        };
        match envbridge::objects::render(&req) {
            Ok(_) => panic!("{workflow} rendered, expected an error"),
            Err(e) => e.to_string(),
        }
    }

    /// Asserts the error names `file:line:col` and contains `what`.
    fn expect(&self, workflow: &str, file: &str, line: u32, col: u32, what: &str) {
        let e = self.render(workflow);
        let place = format!("{}:{line}:{col}: ", self.path(file));
        assert!(e.starts_with(&place), "expected `{place}...`, got `{e}`");
        assert!(e.contains(what), "expected `{what}` in `{e}`");
    }
}

const HOST: &str = "roles:\n  - name: h\n    constraints:\n      - attribute: machine_id\n        value: flp001\n    roles:\n";

#[test]
fn error_yaml_does_not_parse() {
    let c = Case::new(&[("w.yaml", "name: w\nroles: [\n  - a: b\n")]);
    let e = c.render("w.yaml");
    assert!(
        e.starts_with(&format!("{}:", c.path("w.yaml"))) && e.contains("invalid YAML"),
        "{e}"
    );
}

#[test]
fn error_empty_file_and_wrong_shape() {
    let c = Case::new(&[("w.yaml", ""), ("l.yaml", "- a\n- b\n")]);
    c.expect("w.yaml", "w.yaml", 1, 1, "empty file");
    c.expect("l.yaml", "l.yaml", 1, 1, "not a workflow");
}

#[test]
fn error_unknown_field() {
    let c = Case::new(&[("w.yaml", "name: w\nroels:\n  - name: a\n")]);
    c.expect("w.yaml", "w.yaml", 2, 1, "unknown field `roels`");
}

#[test]
fn error_expression_does_not_parse() {
    let c = Case::new(&[(
        "w.yaml",
        &format!(
            "name: w\n{HOST}      - name: \"{{{{ 1 + }}}}\"\n        task:\n          load: t\n"
        ),
    )]);
    c.expect("w.yaml", "w.yaml", 8, 16, "does not parse");
}

/// The anchor drops a role whose `enabled` names an undefined variable (its evaluation error
/// is swallowed); envbridge does the same (with a warning in its log), and reads `enabled` as
/// the anchor does: only `true` or `1` enable.
#[test]
fn enabled_as_the_anchor_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tasks")).unwrap();
    std::fs::write(
        dir.path().join("tasks/t.yaml"),
        "control:\n  mode: basic\ncommand:\n  value: x\n",
    )
    .unwrap();
    let role = |name: &str, en: &str| {
        format!(
            "      - name: {name}\n        enabled: \"{en}\"\n        task:\n          load: t\n"
        )
    };
    let wf = format!(
        "name: w\n{HOST}{}{}{}{}{}",
        role("undefined", "{{ nope == 'x' }}"),
        role("yes", "yes"),
        role("one", "{{ 1 }}"),
        role("upper", " TRUE "),
        role("falsy", "{{ strings.IsFalsy('') && false }}"),
    );
    std::fs::write(dir.path().join("w.yaml"), wf).unwrap();
    let req = RenderRequest {
        sources: Sources {
            tasks_dir: dir.path().join("tasks"),
            ..Default::default()
        },
        workflow: dir.path().join("w.yaml"),
        env_id: Some("E".into()),
        ..RenderRequest::default()
    };
    let r = envbridge::objects::render(&req).unwrap_or_else(|e| panic!("{e}"));
    let paths: Vec<&str> = r.tasks().map(|t| t.path.as_str()).collect();
    assert_eq!(paths, ["w.h.one", "w.h.upper"]);
}

#[test]
fn error_unknown_variable_and_function() {
    let c = Case::new(&[
        (
            "f.yaml",
            &format!(
                "name: w\n{HOST}      - name: a\n        enabled: \"{{{{ inventory.Detector(x) }}}}\"\n        task:\n          load: t\n"
            ),
        ),
        (
            "b.yaml",
            &format!(
                "name: w\n{HOST}      - name: \"a-{{{{ missing }}}}\"\n        task:\n          load: t\n"
            ),
        ),
    ]);
    c.expect(
        "f.yaml",
        "f.yaml",
        9,
        19,
        "unknown function `inventory.Detector`",
    );
    c.expect("b.yaml", "b.yaml", 8, 18, "unknown variable `missing`");
}

#[test]
fn error_task_class_does_not_exist() {
    let c = Case::new(&[(
        "w.yaml",
        &format!("name: w\n{HOST}      - name: a\n        task:\n          load: nosuch\n"),
    )]);
    c.expect(
        "w.yaml",
        "w.yaml",
        10,
        17,
        "task class `nosuch` does not exist",
    );
}

#[test]
fn error_sibling_roles_with_one_name() {
    let c = Case::new(&[(
        "w.yaml",
        &format!(
            "name: w\n{HOST}      - name: a\n        task:\n          load: t\n      - name: a\n        task:\n          load: t\n"
        ),
    )]);
    c.expect("w.yaml", "w.yaml", 11, 9, "two sibling roles named `a`");
}

#[test]
fn error_include_cycle() {
    let c = Case::new(&[
        (
            "w.yaml",
            &format!("name: w\n{HOST}      - name: a\n        include: sub\n"),
        ),
        (
            "sub.yaml",
            "name: sub\nroles:\n  - name: again\n    include: w\n",
        ),
    ]);
    c.expect("w.yaml", "sub.yaml", 4, 14, "include cycle");
}

#[test]
fn error_task_without_node() {
    let c = Case::new(&[(
        "w.yaml",
        "name: w\nroles:\n  - name: a\n    task:\n      load: t\n",
    )]);
    c.expect("w.yaml", "w.yaml", 3, 5, "task `w.a` has no node");
}

#[test]
fn error_unknown_control_mode() {
    let c = Case::new(&[
        (
            "tasks/m.yaml",
            "name: m\ncontrol:\n  mode: mesos\ncommand:\n  value: /bin/m\n",
        ),
        (
            "w.yaml",
            &format!("name: w\n{HOST}      - name: a\n        task:\n          load: m\n"),
        ),
    ]);
    c.expect(
        "w.yaml",
        "tasks/m.yaml",
        3,
        9,
        "unknown control mode `mesos`",
    );
}

#[test]
fn error_unresolved_target() {
    let c = Case::new(&[(
        "w.yaml",
        &format!(
            "name: w\n{HOST}      - name: a\n        connect:\n          - name: in\n            type: pull\n            target: \"{{{{ Parent().Path }}}}.b:out\"\n        task:\n          load: t\n"
        ),
    )]);
    c.expect(
        "w.yaml",
        "w.yaml",
        12,
        21,
        "unresolved target `w.h.b:out` of channel `in` of task `w.h.a`",
    );
}

#[test]
fn error_alias_redefined() {
    let c = Case::new(&[(
        "w.yaml",
        &format!(
            "name: w\n{HOST}      - name: a\n        bind:\n          - name: x\n            type: push\n            addressing: ipc\n            global: shared\n        task:\n          load: t\n      - name: b\n        bind:\n          - name: x\n            type: push\n            addressing: ipc\n            global: shared\n        task:\n          load: t\n"
        ),
    )]);
    let e = c.render("w.yaml");
    assert!(e.contains("alias `::shared` redefined"), "{e}");
    assert!(
        e.contains("w.h.a:x") && e.contains("w.h.b:x"),
        "names both ends: {e}"
    );
    assert!(e.starts_with(&format!("{}:", c.path("w.yaml"))), "{e}");
}

#[test]
fn error_channel_type_mismatch() {
    let c = Case::new(&[(
        "w.yaml",
        &format!(
            "name: w\n{HOST}      - name: a\n        task:\n          load: t\n      - name: b\n        connect:\n          - name: in\n            type: push\n            target: w.h.a:out\n        task:\n          load: t\n"
        ),
    )]);
    let e = c.render("w.yaml");
    assert!(
        e.starts_with(&format!("{}:13:13: ", c.path("w.yaml"))),
        "{e}"
    );
    assert!(
        e.contains("type mismatch") && e.contains("w.h.b:in") && e.contains("w.h.a:out"),
        "{e}"
    );
}

#[test]
fn cli_exit_codes_and_messages() {
    let bin = env!("CARGO_BIN_EXE_envbridge");
    let c = Case::new(&[(
        "w.yaml",
        "name: w\nroles:\n  - name: a\n    task:\n      load: t\n",
    )]);
    let out = Command::new(bin)
        .args([
            "render",
            &c.path("w.yaml"),
            "--tasks",
            &c.path("tasks"),
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!("error: {}:3:5: ", c.path("w.yaml"))),
        "{err}"
    );

    let wf = repo("manifests/control-workflows/workflows/readout-dataflow.yaml");
    let out = Command::new(bin)
        .args([
            "render",
            &wf.display().to_string(),
            "--tasks",
            &repo("manifests/control-workflows/tasks")
                .display()
                .to_string(),
            "--defaults",
            &repo("manifests/site/local.yaml").display().to_string(),
            "--set",
            r#"hosts=["flp001","flp002"]"#,
            "--env-id",
            "cli",
            "-o",
            "tasks",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let first = &v[0];
    for k in [
        "node",
        "path",
        "class",
        "name",
        "env",
        "args",
        "controlPort",
        "channels",
    ] {
        assert!(first.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v.as_array().unwrap().len(), 6);
}

#[test]
fn crd_yaml_is_generated_from_the_types_and_survives_a_closed_pipe() {
    let want = envbridge::crd::all_yaml();
    let got = std::fs::read_to_string(repo("crds/envbridge.yaml")).unwrap();
    assert_eq!(
        got, want,
        "crds/envbridge.yaml is stale: run `envbridge crd > crds/envbridge.yaml`"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .arg("crd")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 4];
    out.read_exact(&mut first).unwrap();
    drop(out);
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert!(status.code().is_some(), "ended by a signal");
}

// ---- fuzzing: random and mutated input never panics ----

/// A small deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, src: &[u8]) -> Vec<u8> {
    const PIECES: &[&[u8]] = &[
        b"{{",
        b"}}",
        b"[",
        b"]",
        b"{",
        b"}",
        b":",
        b"- ",
        b"\n",
        b"  ",
        b"!public ",
        b"&a ",
        b"*a",
        b"'",
        b"\"",
        b"((((",
        b"!!!!",
        b"? ",
        b"\t",
        b"roles:",
        b"task:",
        b"load: ",
        b"\xff",
        b"#",
    ];
    let mut v = src.to_vec();
    for _ in 0..1 + rng.below(8) {
        let at = rng.below(v.len() + 1);
        match rng.below(4) {
            0 => {
                let p = PIECES[rng.below(PIECES.len())];
                v.splice(at..at, p.iter().copied());
            }
            1 if !v.is_empty() => {
                let end = (at + rng.below(16)).min(v.len());
                v.drain(at.min(end)..end);
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = (rng.next() & 0xff) as u8;
            }
            _ => {
                let end = (at + rng.below(32)).min(v.len());
                let chunk = v[at.min(end)..end].to_vec();
                v.splice(at..at, chunk);
            }
        }
    }
    v
}

#[test]
fn fuzz_loader_never_panics() {
    let c = corpus().join("aliecs");
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    for dir in [
        "controlworkflows/tasks",
        "controlworkflows/workflows",
        "control-operator/control-workflows",
    ] {
        for f in yaml_files(&c.join(dir)) {
            seeds.push(std::fs::read(f).unwrap());
        }
    }
    for f in yaml_files(&repo("manifests/control-workflows/workflows")) {
        seeds.push(std::fs::read(f).unwrap());
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let file: std::sync::Arc<str> = std::sync::Arc::from("fuzz.yaml");
    for i in 0..3000 {
        let seed = &seeds[i % seeds.len()];
        let input = if i % 10 == 0 {
            (0..rng.below(300))
                .map(|_| (rng.next() & 0xff) as u8)
                .collect()
        } else {
            mutate(&mut rng, seed)
        };
        let text = String::from_utf8_lossy(&input);
        let r = std::panic::catch_unwind(|| {
            if let Ok(node) = yaml::parse(&file, &text) {
                let _ = load::class_from_node(&node, "fuzz");
            }
        });
        assert!(r.is_ok(), "loader panicked on input #{i}: {text:?}");
    }
}

#[test]
fn fuzz_renderer_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    for f in yaml_files(&repo("manifests/control-workflows/tasks")) {
        std::fs::copy(&f, tasks.join(f.file_name().unwrap())).unwrap();
    }
    let seed = std::fs::read(repo(
        "manifests/control-workflows/workflows/readout-dataflow.yaml",
    ))
    .unwrap();
    let mut rng = Rng(42);
    for i in 0..400 {
        let wf = dir.path().join("w.yaml");
        std::fs::write(&wf, mutate(&mut rng, &seed)).unwrap();
        let req = RenderRequest {
            sources: Sources {
                tasks_dir: tasks.clone(),
                workflows_dir: None,
                defaults_files: vec![repo("manifests/site/local.yaml")],
            },
            workflow: wf,
            sets: vec![("hosts".into(), r#"["flp001","flp002"]"#.into())],
            env_id: Some("F".into()),
            ..RenderRequest::default()
        };
        let r = std::panic::catch_unwind(|| envbridge::objects::render(&req).map(|_| ()));
        assert!(r.is_ok(), "render panicked on mutation #{i}");
        if let Ok(Err(e)) = r {
            let s = e.to_string();
            let mut parts = s.splitn(4, ':');
            let (_, line, col) = (parts.next(), parts.next(), parts.next());
            assert!(
                line.is_some_and(|l| l.parse::<u32>().is_ok()),
                "no FILE:LINE:COLUMN in `{s}`"
            );
            assert!(
                col.is_some_and(|c| c.parse::<u32>().is_ok()),
                "no FILE:LINE:COLUMN in `{s}`"
            );
        }
    }
}

struct NoVars;
impl Lookup for NoVars {
    fn lookup(&self, name: &str) -> envbridge::workflow::Result<Option<std::sync::Arc<str>>> {
        Ok((name.len() < 3).then(|| std::sync::Arc::from("v")))
    }
}

#[test]
fn fuzz_expressions_never_panic() {
    const TOKENS: &[&str] = &[
        "a",
        "bb",
        "'s'",
        "\"t\"",
        "1",
        "2.5",
        "true",
        "null",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        "?",
        ":",
        "==",
        "!=",
        "&&",
        "||",
        "!",
        "+",
        "-",
        "*",
        "/",
        "%",
        "<",
        ">=",
        ".",
        ",",
        "in",
        "len(",
        "strings.IsFalsy(",
        "strings.ToLower(",
        "Up(",
        "Parent()",
        ".Path",
        "uid.New()",
        "size(",
        "has(",
        "x.map(",
        "e",
        "1/0",
        "'\\",
        "\\u",
        "18446744073709551616",
    ];
    let engine = Engine::new();
    let file: std::sync::Arc<str> = std::sync::Arc::from("fuzz.yaml");
    let loc = envbridge::workflow::Loc::new(&file, 1, 1);
    let site = CallSite {
        role_path: std::sync::Arc::from("w.a.b"),
        uid_seed: "s".into(),
    };
    let mut rng = Rng(7);
    for i in 0..20_000 {
        let n = 1 + rng.below(24);
        let src: String = (0..n)
            .map(|_| TOKENS[rng.below(TOKENS.len())])
            .collect::<Vec<_>>()
            .join(" ");
        let src: std::sync::Arc<str> = std::sync::Arc::from(src);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = engine.eval(&src, &loc, &NoVars, &site);
        }));
        assert!(r.is_ok(), "evaluator panicked on #{i}: {src}");
    }
    // Hostile nesting is refused before the parser sees it.
    for deep in [
        "(".repeat(5000),
        "!".repeat(5000),
        "[".repeat(5000),
        format!("{}a", "-".repeat(5000)),
    ] {
        let e = engine
            .eval(&std::sync::Arc::from(deep), &loc, &NoVars, &site)
            .unwrap_err();
        assert!(e.to_string().starts_with("fuzz.yaml:1:1: "), "{e}");
    }
}

/// Renders `workflow` of `dir` (task classes in `dir/tasks`, no site profile), which must succeed.
fn render_in(dir: &Path, workflow: &str) -> envbridge::objects::Objects {
    envbridge::objects::render(&RenderRequest {
        sources: Sources {
            tasks_dir: dir.join("tasks"),
            workflows_dir: None,
            defaults_files: vec![],
        },
        workflow: dir.join(workflow),
        env_id: Some("E".into()),
        ..RenderRequest::default()
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A class value is evaluated once per class and shared, except where a task's own role layers
/// redefine a variable it reads (directly or through another variable), or it reads the task's
/// context. Each task must get exactly what evaluating it alone would give.
#[test]
fn class_values_are_shared_only_where_no_role_redefines_what_they_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tasks")).unwrap();
    std::fs::write(
        dir.path().join("tasks/w.yaml"),
        "name: w\ncontrol:\n  mode: direct\ndefaults:\n  level: info\n  inner: base\n  outer: \"o-{{ inner }}\"\n\
         bind:\n  - name: out\n    type: push\n    addressing: ipc\n    sndBufSize: \"{{ inner }}\"\n\
         command:\n  value: /bin/w\n  arguments:\n    - \"--level={{ level }}\"\n    - \"--outer={{ outer }}\"\n\
         \x20   - \"--host={{ task_hostname }}\"\n    - \"--pick={{ level == 'info' ? 'a' : 'b' }}\"\n",
    )
    .unwrap();
    let role = |name: &str, vars: &str| {
        format!("      - name: {name}\n{vars}        task:\n          load: w\n")
    };
    let wf = format!(
        "name: s\nroles:\n  - name: h-{{{{ it }}}}\n    for:\n      range: '[\"n1\",\"n2\"]'\n      var: it\n    \
         constraints:\n      - attribute: machine_id\n        value: \"{{{{ it }}}}\"\n    roles:\n{}{}{}",
        role("plain", ""),
        role("loud", "        vars:\n          level: debug\n"),
        role(
            "deep",
            "        defaults:\n          inner: \"{{ it }}-x\"\n"
        ),
    );
    std::fs::write(dir.path().join("s.yaml"), wf).unwrap();
    let r = render_in(dir.path(), "s.yaml");
    let got: Vec<(String, Vec<String>, String)> = r
        .tasks()
        .map(|t| {
            (
                t.path.clone(),
                t.args.iter().map(|a| a.to_string()).collect(),
                t.channels["chans.out.0.sndBufSize"].to_string(),
            )
        })
        .collect();
    let want = |node: &str, role: &str, level: &str, inner: &str, pick: &str| {
        (
            format!("s.h-{node}.{role}"),
            vec![
                format!("--level={level}"),
                format!("--outer=o-{inner}"),
                format!("--host={node}"),
                format!("--pick={pick}"),
            ],
            inner.to_string(),
        )
    };
    assert_eq!(
        got,
        vec![
            want("n1", "deep", "info", "n1-x", "a"),
            want("n1", "loud", "debug", "base", "b"),
            want("n1", "plain", "info", "base", "a"),
            want("n2", "deep", "info", "n2-x", "a"),
            want("n2", "loud", "debug", "base", "b"),
            want("n2", "plain", "info", "base", "a"),
        ]
    );
}

/// A target `::alias` reaches the inbound channel that publishes it: both ends get one address.
#[test]
fn a_global_alias_connects_both_ends() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tasks")).unwrap();
    std::fs::write(
        dir.path().join("tasks/t.yaml"),
        "name: t\ncontrol:\n  mode: fairmq\ncommand:\n  value: /bin/t\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("w.yaml"),
        format!(
            "name: w\n{HOST}      - name: a\n        bind:\n          - name: out\n            type: push\n            \
             addressing: ipc\n            global: \"feed-{{{{ task_hostname }}}}\"\n        task:\n          load: t\n\
             \x20     - name: b\n        connect:\n          - name: in\n            type: pull\n            \
             target: \"::feed-flp001\"\n        task:\n          load: t\n"
        ),
    )
    .unwrap();
    let r = render_in(dir.path(), "w.yaml");
    let t: Vec<_> = r.tasks().collect();
    let bound = &t[0].channels["chans.out.0.address"];
    assert!(bound.starts_with("ipc://@eb-"), "{bound}");
    assert_eq!(&t[1].channels["chans.in.0.address"], bound);
    assert_eq!(&*t[1].channels["chans.in.0.method"], "connect");
}

/// Runaway expressions, through `--set` and in a workflow file, in every syntax the engine
/// accepts (calls, methods, pipes, spacing, comments, nesting): each ends with exit 2 and
/// `error:` within seconds, never a hang or an out-of-memory.
#[test]
fn hostile_expressions_end_in_an_error_within_seconds() {
    let bin = env!("CARGO_BIN_EXE_envbridge");
    let big = "[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19]";
    let nested = format!(
        "{{{{ {big}.existsOne(a, {big}.existsOne(b, {big}.existsOne(c, {big}.existsOne(d, a+b+c+d == 1)))) }}}}"
    );
    let hostile: Vec<String> = vec![
        nested,
        format!("{{{{ map({big}, map({big}, map({big}, #))) }}}}"),
        format!("{{{{ {big}.map (# * 2) }}}}"),
        format!("{{{{ {big} | map(#) | filter(# > 1) }}}}"),
        format!("{{{{ all({big}, {{ any({big}, {{ # > 0 }}) }}) }}}}"),
        format!("{{{{ {big}./* c */map(#) }}}}"),
        "{{ 1..1000000000 }}".to_string(),
        "{{ len(1 .. 1000000000) }}".to_string(),
        "{{ repeat('x', 1000000000) }}".to_string(),
        "{{ $env }}".to_string(),
        "{{ none([1,2], # > 1) }}".to_string(),
        "{{ sortBy([1,2], #) }}".to_string(),
        "{{ reduce([1,2], #acc + #) }}".to_string(),
        "{{ groupBy([1,2], #) }}".to_string(),
        "{{ count([1,2], # > 0) }}".to_string(),
        "{{ findIndex([1,2], # > 0) }}".to_string(),
    ];
    let wf = repo("manifests/control-workflows/workflows/readout-dataflow.yaml");
    for h in &hostile {
        let started = std::time::Instant::now();
        let out = Command::new(bin)
            .args([
                "render",
                &wf.display().to_string(),
                "--tasks",
                &repo("manifests/control-workflows/tasks")
                    .display()
                    .to_string(),
                "--set",
                &format!("hosts={h}"),
                "--deadline",
                "20",
                "-o",
                "tasks",
            ])
            .output()
            .unwrap();
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{h}: {err}");
        assert!(err.starts_with("error:"), "{h}: {err}");
        assert!(
            took < std::time::Duration::from_secs(15),
            "{h} took {took:?}"
        );
    }
    // The same in a workflow file: the error names the file, line and column.
    let c = Case::new(&[(
        "w.yaml",
        "name: w\nroles:\n  - name: h\n    constraints:\n      - attribute: machine_id\n        value: \"{{ [1,2].map(# * 2) }}\"\n    task:\n      load: t\n",
    )]);
    let out = Command::new(bin)
        .args(["render", &c.path("w.yaml"), "--tasks", &c.path("tasks")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(&format!("error: {}:6:", c.path("w.yaml"))),
        "{err}"
    );
}

/// The anchor's JIT fallback: `dpl.GenerateFromUriOrFallbackToTemplate(name)` without
/// `jit/<name>` includes `workflows/<name>.yaml` (its roles under the include role, its
/// top-level `defaults` at the include role's place); with `jit/<name>` and no generator,
/// an error at the include naming the entry and the variable that chose it.
#[test]
fn the_jit_fallback_includes_the_workflow_template() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["tasks", "workflows", "jit"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(
        d.join("tasks/t.yaml"),
        "name: t\ncontrol:\n  mode: fairmq\ncommand:\n  value: /bin/t\n  arguments:\n    - \"--port={{ port }}\"\n",
    )
    .unwrap();
    std::fs::write(
        d.join("workflows/w.yaml"),
        format!(
            "name: w\ndefaults:\n  port: \"1\"\n{HOST}      - name: dpl\n        include: \"{{{{ dpl.GenerateFromUriOrFallbackToTemplate(dpl_workflow) }}}}\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("workflows/chain.yaml"),
        "name: chain\ndefaults:\n  port: \"29950\"\nroles:\n  - name: proxy\n    task:\n      load: t\n",
    )
    .unwrap();
    std::fs::write(d.join("jit/minimal"), "o2-dpl-raw-proxy -b").unwrap();
    let req = |wf: &str| RenderRequest {
        sources: Sources {
            tasks_dir: d.join("tasks"),
            workflows_dir: Some(d.join("workflows")),
            defaults_files: vec![],
        },
        workflow: d.join("workflows/w.yaml"),
        sets: vec![("dpl_workflow".into(), wf.into())],
        env_id: Some("E".into()),
        ..RenderRequest::default()
    };
    let r = envbridge::objects::render(&req("chain")).unwrap_or_else(|e| panic!("{e}"));
    let t: Vec<_> = r.tasks().collect();
    assert_eq!(t.len(), 1);
    assert_eq!(&*t[0].path, "w.h.dpl.proxy");
    assert_eq!(&*t[0].args[0], "--port=29950");

    let e = envbridge::objects::render(&req("minimal"))
        .map(|_| ())
        .expect_err("needs generation")
        .to_string();
    let place = format!("{}:11:19: ", d.join("workflows/w.yaml").display());
    assert!(e.starts_with(&place), "{e}");
    for want in [
        "the JIT entry `jit/minimal`",
        "no JIT generator is configured",
        "chosen by the variable `dpl_workflow` = `minimal`",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
}

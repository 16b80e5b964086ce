//! The render core end to end (pure: no cluster): corpus loading, a golden 3-host
//! readout-dataflow, one test per error class, determinism, sizes, CRDs, fuzzing.
//!
//! Here the corpus, golden and ordering tests and the helpers; the rest one topic a module.
//!
//! Regenerate the golden files with `ENVBRIDGE_BLESS=1 cargo test --test render golden`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use envbridge::objects::Objects;
use envbridge::plan::{self, ControlMode, RenderRequest};
use envbridge::workflow::Sources;
use envbridge::workflow::expr::{CallSite, Engine, Lookup};
use envbridge::workflow::{load, yaml};

mod crd;
mod errors;
mod fuzz;
mod hostile;
mod jit;
mod sharing;
mod size;

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

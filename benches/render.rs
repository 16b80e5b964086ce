//! Render benchmark (printed figures, not a timed test).
//!
//! Renders an environment of 2,000 and of 10,000 tasks (8 per node: two readout -> StfBuilder
//! -> StfSender chains and two more readouts, from manifests/control-workflows/) and, in the same
//! run, serializes the unfactored task list (the `-o tasks` view) to JSON. Prints the best and
//! median of several runs and the ratio render / serialize.
//!
//! The baseline list is unfactored: every task owns its strings, as a plain list of tasks does.
//! (The render's own task references share the strings of a class; serializing those reads far
//! less distinct memory, so it is printed too, but it is not the baseline.)
//!
//! Then the anchor's own readout-dataflow (../shared/corpus, unmodified) for 250 hosts, with a
//! configuration store listing them, measured the same way.
//!
//! The render runs as `envbridge render` does, on this machine's cores (a large render resolves
//! and serializes its tasks on several threads); a single-thread render is measured and printed
//! beside it.
//!
//! Run: `cargo bench --bench render`

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use envbridge::plan::{RenderRequest, TaskView};
use envbridge::workflow::Sources;
use serde::Serialize;

// The allocator of the envbridge binary, so that render is measured as `envbridge render` runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RUNS: usize = 15;

fn workflow(dir: &Path) {
    let chain = |i: usize| {
        format!(
            "      - name: chain{i}\n        roles:\n          - name: readout\n            task:\n              load: readout\n\
             \x20         - name: stfb\n            vars:\n              dd_discovery_stfb_id: stfb-{{{{ it }}}}-{{{{ uid.New() }}}}\n\
             \x20           connect:\n              - name: readout\n                type: pull\n                target: \"{{{{ Parent().Path }}}}.readout:readout\"\n\
             \x20           task:\n              load: stfbuilder-senderoutput\n\
             \x20         - name: stfs\n            vars:\n              dd_discovery_stfs_id: stfs-{{{{ it }}}}-{{{{ uid.New() }}}}\n\
             \x20           connect:\n              - name: buildertosender\n                type: pull\n                target: \"{{{{ Parent().Path }}}}.stfb:buildertosender\"\n\
             \x20           task:\n              load: stfsender\n"
        )
    };
    let text = format!(
        "name: bench\nroles:\n  - name: host-{{{{ it }}}}\n    for:\n      range: \"{{{{ hosts }}}}\"\n      var: it\n    constraints:\n      - attribute: machine_id\n        value: \"{{{{ it }}}}\"\n    roles:\n{}{}      - name: extra0\n        task:\n          load: readout\n      - name: extra1\n        task:\n          load: readout\n",
        chain(0),
        chain(1)
    );
    std::fs::write(dir.join("bench.yaml"), text).expect("write workflow");
}

/// One task of the `-o tasks` view with strings of its own (same JSON as [`TaskView`]).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Unfactored {
    node: String,
    path: String,
    class: String,
    name: String,
    env: Vec<OwnedEnv>,
    args: Vec<String>,
    control_port: u16,
    channels: BTreeMap<String, String>,
    command: String,
    shell: bool,
    user: String,
    control_mode: envbridge::plan::ControlMode,
    critical: bool,
    properties: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct OwnedEnv {
    name: String,
    value: String,
}

impl From<TaskView<'_>> for Unfactored {
    fn from(v: TaskView) -> Self {
        Unfactored {
            node: v.node.to_owned(),
            path: v.path.to_owned(),
            class: v.class.to_owned(),
            name: v.name.to_owned(),
            env: v
                .env
                .iter()
                .map(|e| OwnedEnv {
                    name: String::from(&*e.name),
                    value: String::from(&*e.value),
                })
                .collect(),
            args: v.args.iter().map(|a| String::from(&**a)).collect(),
            control_port: v.control_port,
            channels: v
                .channels
                .iter()
                .map(|(k, v)| (String::from(&**k), String::from(&**v)))
                .collect(),
            command: v.command.to_owned(),
            shell: v.shell,
            user: v.user.to_owned(),
            control_mode: v.control_mode,
            critical: v.critical,
            properties: v.properties.clone(),
        }
    }
}

fn stats(mut d: Vec<Duration>) -> (f64, f64) {
    d.sort();
    (d[0].as_secs_f64() * 1e3, d[d.len() / 2].as_secs_f64() * 1e3)
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tempdir");
    workflow(dir.path());
    println!("render benchmark: {} runs each, best / median (ms)", RUNS);
    for tasks in [2_000usize, 10_000] {
        let nodes = tasks / 8;
        let hosts: Vec<String> = (1..=nodes).map(|i| format!("flp{i:04}")).collect();
        let req = RenderRequest {
            sources: Sources {
                tasks_dir: root.join("manifests/control-workflows/tasks"),
                workflows_dir: None,
                defaults_files: vec![root.join("manifests/site/local.yaml")],
            },
            workflow: dir.path().join("bench.yaml"),
            sets: vec![("hosts".into(), serde_json::to_string(&hosts).expect("json"))],
            env_id: Some("bench".into()),
            ..RenderRequest::default()
        };
        measure(
            &format!("{tasks:>6} tasks on {nodes:>4} nodes"),
            &req,
            tasks,
        );
    }
    // The anchor's own main workflow, unmodified, for 250 hosts with a store of 250 hosts.
    match anchor(250) {
        Some((req, store)) => {
            measure("anchor readout-dataflow, 250 hosts", &req, 250 * 5);
            process(&req, &store, dir.path());
        }
        None => println!("anchor readout-dataflow: ../shared/corpus not found, skipped"),
    }
}

/// The anchor's readout-dataflow for 250 hosts as a user runs it: `envbridge render ... -o
/// tasks` as a whole process (this build's binary, its output read through a pipe), and
/// where its time goes: the same steps timed in this process (the store file read and
/// parsed, the render, the `-o tasks` text built, the text written to a pipe); what is left
/// of the process's wall time is its start and end (exec, dynamic loading, argument parsing,
/// freeing, exit), against the wall time of `envbridge --version`, a process that does
/// nothing.
fn process(req: &RenderRequest, store_text: &str, dir: &Path) {
    let store = dir.join("anchor-store.yaml");
    std::fs::write(&store, store_text).expect("write the store");
    let sets = req.sets.iter().map(|(k, v)| format!("{k}={v}"));
    let mut args: Vec<String> = vec![
        "render".into(),
        req.workflow.display().to_string(),
        "--tasks".into(),
        req.sources.tasks_dir.display().to_string(),
        "--workflows".into(),
        req.sources
            .workflows_dir
            .as_ref()
            .expect("workflows")
            .display()
            .to_string(),
        "--config".into(),
        store.display().to_string(),
        "--env-id".into(),
        "bench".into(),
        "-o".into(),
        "tasks".into(),
    ];
    for s in sets {
        args.push("--set".into());
        args.push(s);
    }
    let exe = env!("CARGO_BIN_EXE_envbridge");
    let run = |args: &[String]| {
        let t0 = Instant::now();
        let out = std::process::Command::new(exe)
            .args(args)
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run envbridge");
        let took = t0.elapsed();
        assert!(out.status.success(), "envbridge {args:?}: {}", out.status);
        (took, out.stdout.len())
    };
    let mut wall = Vec::new();
    let mut nothing = Vec::new();
    let mut bytes = 0;
    for _ in 0..RUNS {
        let (t, b) = run(&args);
        wall.push(t);
        bytes = b;
        nothing.push(run(&["--version".to_string()]).0);
    }
    // The same steps in this process.
    let (mut load_t, mut render_t, mut text_t, mut write_t) = (vec![], vec![], vec![], vec![]);
    for _ in 0..RUNS {
        let t0 = Instant::now();
        let parsed = envbridge::workflow::store::ConfigStore::load(&store).expect("the store");
        load_t.push(t0.elapsed());
        let one = RenderRequest {
            store: std::sync::Arc::new(parsed),
            ..req.clone()
        };
        let t1 = Instant::now();
        let r = envbridge::objects::render(&one).expect("render");
        render_t.push(t1.elapsed());
        let t2 = Instant::now();
        let text = envbridge::plan::tasks_json(r.tasks());
        text_t.push(t2.elapsed());
        assert_eq!(
            text.len(),
            bytes,
            "the process wrote what this process builds"
        );
        let t3 = Instant::now();
        let mut sink = std::process::Command::new("cat")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("cat");
        {
            use std::io::Write;
            let mut pipe = sink.stdin.take().expect("stdin");
            pipe.write_all(text.as_bytes()).expect("write");
        }
        write_t.push(t3.elapsed());
        let _ = sink.wait();
    }
    let (wb, wm) = stats(wall);
    let (_, nm) = stats(nothing);
    let (_, lm) = stats(load_t);
    let (_, rm) = stats(render_t);
    let (_, tm) = stats(text_t);
    let (_, xm) = stats(write_t);
    let rest = wm - lm - rm - tm - xm;
    println!(
        "envbridge render (anchor readout-dataflow, 250 hosts, -o tasks, {:.1} MiB) as a process: \
         wall {wb:.1} / {wm:.1} ms (best / median); of the median: store {lm:.1}, render {rm:.1}, \
         -o tasks text {tm:.1}, write {xm:.1}, the rest (start, exit) {rest:.1} \
         (a process doing nothing, envbridge --version: {nm:.1})",
        bytes as f64 / (1024.0 * 1024.0)
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "render-process",
            "tasks": 1250,
            "wall_best_ms": round1(wb),
            "wall_p50_ms": round1(wm),
            "store_ms": round1(lm),
            "render_ms": round1(rm),
            "text_ms": round1(tm),
            "write_ms": round1(xm),
            "rest_ms": round1(rest),
            "empty_process_ms": round1(nm),
        })
    );
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The anchor's readout-dataflow for `hosts` hosts, with a configuration store that lists
/// them (and that store's text).
fn anchor(hosts: usize) -> Option<(RenderRequest, String)> {
    let cw = ["../shared", "../../shared"]
        .iter()
        .map(|c| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(c)
                .join("corpus/aliecs/controlworkflows")
        })
        .find(|p| p.is_dir())?;
    let names: Vec<String> = (1..=hosts).map(|i| format!("flp{i:03}")).collect();
    let mut store = String::from("o2:\n  components:\n    readout:\n      ANY:\n        any:\n");
    for h in &names {
        store.push_str(&format!("          readout-stfb-{h}: x\n"));
    }
    store.push_str("  hardware:\n    detectors:\n      TST:\n        flps:\n");
    for h in &names {
        store.push_str(&format!("          {h}: {{}}\n"));
    }
    store.push_str(
        "  runtime:\n    aliecs:\n      defaults:\n        consul_endpoint: 127.0.0.1:8500\n        \
         o2_install_path: /opt/o2\n        modulepath: ''\n        infologger_mode: stdout\n        \
         infologger_severity: info\n        monitoring_dd_url: no-op://\n        \
         dd_discovery_endpoint: no-op://\n        fmq_rate_logging: '0'\n        detector: TST\n        \
         ddsched_enabled: 'false'\n",
    );
    let text = store;
    let store = envbridge::workflow::store::ConfigStore::parse("bench-store.yaml", &text)
        .unwrap_or_else(|e| panic!("{e}"));
    let req = RenderRequest {
        sources: Sources {
            tasks_dir: cw.join("tasks"),
            workflows_dir: Some(cw.join("workflows")),
            defaults_files: vec![],
        },
        workflow: cw.join("workflows/readout-dataflow.yaml"),
        sets: vec![("hosts".into(), serde_json::to_string(&names).expect("json"))],
        store: std::sync::Arc::new(store),
        env_id: Some("bench".into()),
        ..RenderRequest::default()
    };
    Some((req, text))
}

/// Renders `req` [`RUNS`] times (and once more on one thread), serializes the unfactored view
/// after each, and prints best / median of each and their ratio.
fn measure(label: &str, req: &RenderRequest, tasks: usize) {
    let mut render_t = Vec::new();
    let mut one_t = Vec::new();
    let mut ser_t = Vec::new();
    let mut shared_t = Vec::new();
    let mut bytes = 0;
    let mut objects = 0;
    for _ in 0..RUNS {
        let t0 = Instant::now();
        let r = match envbridge::objects::render(req) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(2);
            }
        };
        render_t.push(t0.elapsed());
        assert_eq!(r.tasks().len(), tasks);
        objects = r.task_sets.len() + 1;
        // Built untimed, as one list after the other (a plain list's memory order).
        let list: Vec<Unfactored> = r.tasks().map(|t| TaskView::from(t).into()).collect();
        let t1 = Instant::now();
        let json = serde_json::to_vec(&list).expect("serialize");
        ser_t.push(t1.elapsed());
        bytes = json.len();
        let t2 = Instant::now();
        let view: Vec<TaskView> = r.tasks().map(TaskView::from).collect();
        let shared = serde_json::to_vec(&view).expect("serialize");
        shared_t.push(t2.elapsed());
        assert!(shared == json, "the baseline serializes the same view");
        // Last, so that the baselines run right after the render, as they always did.
        let sets = r.task_sets.len();
        drop((view, shared, json, list));
        drop(r);
        let one = RenderRequest {
            threads: 1,
            ..req.clone()
        };
        let t3 = Instant::now();
        let single = envbridge::objects::render(&one).map(|r| r.task_sets.len());
        one_t.push(t3.elapsed());
        assert_eq!(single.ok(), Some(sets));
    }
    let (rb, rm) = stats(render_t);
    let (sb, sm) = stats(ser_t);
    let (_, shm) = stats(shared_t);
    let (_, om) = stats(one_t);
    println!(
        "{label} ({tasks} tasks, {objects} objects): render {rb:8.1} / {rm:8.1}   \
         serialize -o tasks JSON ({:.1} MiB) {sb:6.1} / {sm:6.1}   ratio median {:.2}x, best {:.2}x   \
         (one thread: render {om:.1}, ratio {:.2}x; view over the shared task refs: {shm:.1}, ratio {:.2}x)",
        bytes as f64 / (1024.0 * 1024.0),
        rm / sm,
        rb / sb,
        om / sm,
        rm / shm
    );
}

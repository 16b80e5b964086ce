//! Render benchmark (printed figures, not a timed test).
//!
//! Renders an environment of 2,000 and of 10,000 tasks (8 per node: two readout -> StfBuilder
//! -> StfSender chains and two more readouts, from manifests/control-workflows/) and, in the same
//! run, serializes the unfactored task list (the `-o tasks` view) to JSON. Prints the best and
//! median of several runs and the ratio render / serialize, for a render on one thread and on
//! as many as it uses on this machine (resolution and serialization are split over threads).
//!
//! Run: `cargo bench --bench render`

use std::path::Path;
use std::time::{Duration, Instant};

use envbridge::plan::{self, RenderRequest, TaskView};
use envbridge::workflow::Sources;

// The allocator of the envbridge binary, so that render is measured as `envbridge render` runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RUNS: usize = 9;

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

fn stats(mut d: Vec<Duration>) -> (f64, f64) {
    d.sort();
    (d[0].as_secs_f64() * 1e3, d[d.len() / 2].as_secs_f64() * 1e3)
}

/// Renders `req` once: the time, the number of objects, and the tasks' `-o tasks` JSON
/// serialization time and size (the baseline).
fn run(req: &RenderRequest, tasks: usize) -> (Duration, usize, Duration, usize) {
    let t0 = Instant::now();
    let r = match plan::render(req) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let render = t0.elapsed();
    assert_eq!(r.tasks().len(), tasks);
    let t1 = Instant::now();
    let view: Vec<TaskView> = r.tasks().map(TaskView::from).collect();
    let json = serde_json::to_vec(&view).expect("serialize");
    let serialize = t1.elapsed();
    (render, r.task_sets.len() + 1, serialize, json.len())
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tempdir");
    workflow(dir.path());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "render benchmark: {RUNS} runs each, best / median (ms); this machine has {cores} cores \
         (a render uses at most {} threads)",
        plan::MAX_THREADS
    );
    for tasks in [2_000usize, 10_000] {
        let nodes = tasks / 8;
        let hosts: Vec<String> = (1..=nodes).map(|i| format!("flp{i:04}")).collect();
        let req = |threads: usize| RenderRequest {
            sources: Sources {
                tasks_dir: root.join("manifests/control-workflows/tasks"),
                workflows_dir: None,
                defaults_files: vec![root.join("manifests/site/local.yaml")],
            },
            workflow: dir.path().join("bench.yaml"),
            sets: vec![("hosts".into(), serde_json::to_string(&hosts).expect("json"))],
            env_id: Some("bench".into()),
            threads,
            ..RenderRequest::default()
        };
        let (one, all) = (req(1), req(0));
        let (mut r1, mut rn, mut ser) = (Vec::new(), Vec::new(), Vec::new());
        let (mut objects, mut bytes) = (0, 0);
        // Interleaved, so that a slower moment of a shared machine hits both alike.
        for _ in 0..RUNS {
            let (t, o, s, b) = run(&one, tasks);
            r1.push(t);
            ser.push(s);
            (objects, bytes) = (o, b);
            let (t, _, s, _) = run(&all, tasks);
            rn.push(t);
            ser.push(s);
        }
        let (sb, sm) = stats(ser);
        println!(
            "{tasks:>6} tasks on {nodes:>4} nodes ({objects} objects): serialize -o tasks JSON ({:.1} MiB) {sb:6.1} / {sm:6.1}",
            bytes as f64 / (1024.0 * 1024.0),
        );
        let threads = plan::threads_for(0, tasks);
        for (label, d) in [
            ("1 thread ".to_string(), r1),
            (format!("{threads} threads"), rn),
        ] {
            let (b, m) = stats(d);
            println!(
                "    render, {label}: {b:8.1} / {m:8.1}   ratio to serialize: median {:.2}x, best {:.2}x",
                m / sm,
                b / sb
            );
        }
    }
}

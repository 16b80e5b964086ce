//! Operator benchmark (printed figures, not a timed test): an Environment of N tasks on M
//! simulated nodes (default 2,000 on 250) -> all Tasks and Pods created and STANDBY, then
//! CONFIGURE, START, STOP, RESET, then destroyed.
//!
//! In the same run, the raw floor: a bare client creating the same objects (Task, Pod,
//! Service per task, the same bodies), waiting for the pods to run, and writing each Task's
//! status once; then each transition with the same writes and calls per task
//! (`support::floor`). Figures: wall time, apiserver requests, operator peak RSS (VmHWM of the
//! `envbridge operator` child process over the whole run, read after the teardown), and the
//! ratio to the floor.
//!
//! The peak RSS is printed against an empty operator's (the same process once ready, its
//! watches listed, before the environment is written): what each task adds. The last line is one JSON object:
//! `{"bench":"operator","tasks":N,"floor_s":F,"operator_s":O,"ratio":R,"peak_rss_mib":M,
//! "baseline_rss_mib":B,"kb_per_task":K,"requests":Q,"floor_requests":FQ}`.
//!
//! The operator's task processes are simulators in `envbridge dev sim-runner --in-process`
//! child processes, one per task class (one process cannot hold 10,000 listeners and the
//! operator's 10,000 connections to them within this container's 20,000 open files).
//!
//! Run: `cargo bench --bench operator` (starts or reuses the local control plane; grows it to
//! BENCH_NODES nodes). BENCH_NODES, BENCH_TASKS_PER_NODE, BENCH_CONCURRENCY adjust it;
//! BENCH_CYCLES repeats the operator's transitions (its memory over many);
//! BENCH_OPERATOR_WRAPPER runs the operator under a profiler (`heaptrack -o FILE`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envbridge::crd::{Environment, EnvironmentSpec, Task, TaskStatus, TaskTemplate};
use envbridge::launch::client::observed;
use envbridge::operator::names::{task_annotations, task_labels};
use envbridge::operator::pod::{PodSettings, build_pod};
use envbridge::operator::requests::RequestCount;
use envbridge::operator::service::build_service;
use envbridge::operator::task_sets::build_task;
use envbridge::plan::TaskRef;
use envbridge::state::State;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Config, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

mod support;

use support::drive::transition_succeeded;
use support::floor::CYCLE;
use support::sims::SimRunners;
use support::tasks::{CLASSES, task_refs};
use support::{Res, create_ns, delete_ns, env_num, install, peak_rss_kib, purge_namespace};

const DISCOVERY_PORT: u16 = 47000;
const TIMEOUT: Duration = Duration::from_secs(900);

fn main() -> Res {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> Res {
    let nodes = env_num("BENCH_NODES", 250);
    let per_node = env_num("BENCH_TASKS_PER_NODE", 8);
    let concurrency = env_num("BENCH_CONCURRENCY", 64);
    println!(
        "operator benchmark: {} tasks on {nodes} nodes",
        nodes * per_node
    );
    let info = envbridge::dev::ensure_up(nodes as u32).await?;
    let admin = envbridge::dev::client_for(&info.kubeconfig).await?;
    install(&admin, &CLASSES.map(|(c, _)| c)).await?;
    let suffix = std::process::id();

    // The raw floor.
    let floor_ns = format!("bench-floor-{suffix}");
    create_ns(&admin, &floor_ns).await?;
    let refs = task_refs("bf", nodes, per_node);
    let count = Arc::new(RequestCount::default());
    let kc = kube::config::Kubeconfig::read_from(&info.kubeconfig)?;
    let counted = observed(
        Config::from_custom_kubeconfig(kc, &Default::default()).await?,
        count.clone(),
    )?;
    let log = std::env::temp_dir().join(format!("envbridge-bench-operator-{suffix}.log"));
    let floor_sims = SimRunners::start(
        &info.kubeconfig,
        &floor_ns,
        &CLASSES.map(|(c, _)| c),
        &log.with_extension("floor-sims"),
    )?;
    let t0 = Instant::now();
    floor(&counted, &floor_ns, &refs, concurrency).await?;
    let floor_time = t0.elapsed();
    let floor_requests = count.total();
    println!(
        "floor: {:.2?} wall, {floor_requests} apiserver requests",
        floor_time
    );
    // The floor's transitions: the same writes and calls as the operator's, per task.
    let floor_tasks = Api::<Task>::namespaced(admin.clone(), &floor_ns)
        .list(&ListParams::default())
        .await?
        .items;
    let control = envbridge::control::ControlClient::new(false);
    let mut floor_steps = Vec::new();
    for (i, step) in CYCLE.into_iter().enumerate() {
        let before = count.total();
        let took = support::floor::transition(
            &counted,
            &control,
            &floor_tasks,
            step,
            &format!("f{i}"),
            concurrency,
        )
        .await?;
        let requests = count.total() - before;
        println!("floor: {} {took:.2?}, {requests} requests", step.0);
        floor_steps.push((took, requests));
    }
    drop(control);
    floor_sims.stop().await;
    // Gone before the operator starts: kwok and the apiserver deleting the floor's pods
    // would otherwise compete with the operator's run.
    let t_del = Instant::now();
    purge_namespace(&admin, &floor_ns, TIMEOUT).await?;
    println!("floor: its namespace deleted in {:.2?}", t_del.elapsed());

    // The operator (a child process, as deployed), with task simulators for its pods.
    let op_ns = format!("bench-op-{suffix}");
    create_ns(&admin, &op_ns).await?;
    let marks = SharedMarks::default();
    let on_pod = marks.clone();
    let stop_watches = CancellationToken::new();
    watch_pods(admin.clone(), op_ns.clone(), on_pod, stop_watches.clone());
    let sims = SimRunners::start(
        &info.kubeconfig,
        &op_ns,
        &CLASSES.map(|(c, _)| c),
        &log.with_extension("sims"),
    )?;
    let log_file = std::fs::File::create(&log)?;
    // BENCH_OPERATOR_WRAPPER (a profiler's command line, e.g. `heaptrack -o /tmp/op`) runs
    // the operator under it; its RSS figures are then the wrapper's.
    let wrapper: Vec<String> = std::env::var("BENCH_OPERATOR_WRAPPER")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut command = match wrapper.split_first() {
        Some((prog, rest)) => {
            let mut c = tokio::process::Command::new(prog);
            c.args(rest).arg(env!("CARGO_BIN_EXE_envbridge"));
            c
        }
        None => tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge")),
    };
    let metrics = support::free_loopback()?;
    let mut child = command
        .args([
            "operator",
            "--metrics-listen",
            &metrics,
            "--no-leader-election",
            "--namespace",
            &op_ns,
        ])
        .args(["--headless-discovery-port", &DISCOVERY_PORT.to_string()])
        // kwok marks 10,000 pods Running in about 190 s on this machine (the floor's
        // figure): more than the 120 s a site's kubelets get by default.
        .args(["--startup-timeout-seconds", "600"])
        // And deletes them as slowly at that size: the default 60 s (after which a pod whose
        // node does not confirm is removed by force, meant for dead nodes) forced every one.
        .args(["--pod-deletion-timeout-seconds", "600"])
        .env("KUBECONFIG", &info.kubeconfig)
        .env("RUST_LOG", "info")
        .stderr(log_file.try_clone()?)
        .stdout(log_file)
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or("operator exited at once")?;
    // An empty operator (its watches listed, no environment): what the tasks add is measured
    // against this, read once it is ready and has settled (a reading 3 s after its start,
    // some lists not done, moved by 16 MiB between runs).
    let t_ready = Instant::now();
    while support::http_get(&metrics, "/readyz")
        .await
        .split_whitespace()
        .nth(1)
        != Some("200")
    {
        if t_ready.elapsed() > Duration::from_secs(120) {
            return Err("the operator was not ready within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline_kib = peak_rss_kib(pid).unwrap_or(0);
    let refs = task_refs("bo", nodes, per_node);
    let total = refs.len();
    let t0 = Instant::now();
    record(&marks, |m| {
        m.t0 = Some(t0);
        m.total = total;
    });
    watch_tasks(
        admin.clone(),
        op_ns.clone(),
        marks.clone(),
        stop_watches.clone(),
    );
    // 10 TaskSets of 200 tasks (25 nodes each), then the Environment.
    envbridge::dev::fixtures::deploy(
        &admin,
        &op_ns,
        "bo",
        &refs,
        envbridge::plan::DEFAULT_TASK_SET_BUDGET,
        "envbridge-bench",
    )
    .await?;
    let env_written = t0.elapsed();
    wait_standby(&admin, &op_ns, "bo", total).await?;
    let op_time = t0.elapsed();
    // The operator logs the requests it has sent so far (read from its log below).
    let _ = std::process::Command::new("kill")
        .args(["-USR1", &pid.to_string()])
        .status();
    let marks = marks.lock().map(|m| m.marks.clone()).unwrap_or_default();
    let pods = Api::<Pod>::namespaced(admin.clone(), &op_ns)
        .list(&ListParams::default())
        .await?
        .items
        .len();
    let memory = |at: &str| {
        let mib = |k: Option<u64>| k.unwrap_or(0) as f64 / 1024.0;
        println!(
            "operator: at {at}: RSS {:.1} MiB, peak so far {:.1} MiB",
            mib(support::rss_kib(pid)),
            mib(peak_rss_kib(pid))
        );
    };
    memory("STANDBY");
    // The same transitions through the operator: asked on the Environment, timed until its
    // status says the transition succeeded.
    let mut op_steps = Vec::new();
    // BENCH_CYCLES > 1 runs the cycle again (each figure is the first cycle's): whether the
    // operator's memory settles or grows with the transitions.
    for cycle in 0..env_num("BENCH_CYCLES", 1).max(1) {
        for (i, (event, _)) in CYCLE.into_iter().enumerate() {
            let t = Instant::now();
            let id = format!("o{cycle}-{i}");
            transition_succeeded(&admin, &op_ns, "bo", &id, event).await?;
            let took = t.elapsed();
            println!("operator: {event} {took:.2?}");
            if cycle == 0 {
                op_steps.push(took);
            }
            memory(&format!("{event} (cycle {})", cycle + 1));
        }
    }
    let _ = std::process::Command::new("kill")
        .args(["-USR1", &pid.to_string()])
        .status();
    let t1 = Instant::now();
    Api::<Environment>::namespaced(admin.clone(), &op_ns)
        .delete("bo", &DeleteParams::default())
        .await?;
    support::wait_gone(&admin, &op_ns, TIMEOUT).await?;
    let teardown = t1.elapsed();
    memory("the teardown's end");
    // The peak over the whole run: create, transitions, teardown.
    let rss_kib = peak_rss_kib(pid).unwrap_or(0);
    // Requests so far again (the teardown's are the difference).
    let _ = std::process::Command::new("kill")
        .args(["-USR1", &pid.to_string()])
        .status();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // SIGTERM (graceful): the operator logs its request count on the way out.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    stop_watches.cancel();
    sims.stop().await;
    delete_ns(&admin, &op_ns).await;
    let text = strip_ansi(&std::fs::read_to_string(&log)?);
    // At STANDBY, after the transitions, after the teardown (SIGUSR1 each time).
    let counts: Vec<&str> = text
        .match_indices("requests so far")
        .filter_map(|(i, _)| text[i..].lines().next())
        .collect();
    let at = |i: usize| counts.get(i).copied().unwrap_or("");
    let (at_standby, after_teardown) = (at(0), at(2));
    let op_requests = field(at_standby, "apiserver_requests=").unwrap_or(0);
    let op_by_verb = word(at_standby, "by_verb=").unwrap_or_default();
    let transition_requests =
        field(at(1), "apiserver_requests=").map_or(0, |n| n.saturating_sub(op_requests));
    let all_requests = field(after_teardown, "apiserver_requests=").unwrap_or(0);
    let all_by_verb = word(after_teardown, "by_verb=").unwrap_or_default();

    let round2 = |x: f64| (x * 100.0).round() / 100.0;
    let ratio = op_time.as_secs_f64() / floor_time.as_secs_f64();
    println!(
        "operator: {:.2?} wall to {total}/{total} STANDBY ({pods} pods), ratio to floor {ratio:.2}",
        op_time
    );
    println!(
        "operator: TaskSets and Environment written at {:.2?}; from there to STANDBY {:.2?}, ratio to floor {:.2}",
        env_written,
        op_time - env_written,
        (op_time - env_written).as_secs_f64() / floor_time.as_secs_f64()
    );
    for (what, at) in &marks {
        println!("operator: {what} at {:.2?}", at);
    }
    println!(
        "operator: {op_requests} apiserver requests to STANDBY (floor {floor_requests}): {op_by_verb}"
    );
    let floor_transition_requests: u64 = floor_steps.iter().map(|(_, q)| q).sum();
    let mut transitions = serde_json::Map::new();
    for (((event, _), (floor_t, _)), op_t) in CYCLE.iter().zip(&floor_steps).zip(&op_steps) {
        let r = op_t.as_secs_f64() / floor_t.as_secs_f64();
        println!(
            "operator: {event} {:.2} s against the floor's {:.2} s, ratio {r:.2}",
            op_t.as_secs_f64(),
            floor_t.as_secs_f64()
        );
        transitions.insert(
            event.to_string(),
            json!({"floor_s": round2(floor_t.as_secs_f64()), "operator_s": round2(op_t.as_secs_f64()), "ratio": round2(r)}),
        );
    }
    println!(
        "operator: {transition_requests} requests for the 4 transitions (floor {floor_transition_requests})"
    );
    println!(
        "operator: {} more requests for the teardown ({all_requests} in all: {all_by_verb})",
        all_requests.saturating_sub(op_requests + transition_requests)
    );
    let kb_per_task =
        (rss_kib.saturating_sub(baseline_kib)) as f64 * 1024.0 / 1000.0 / total as f64;
    println!(
        "operator: peak RSS {:.1} MiB, empty operator {:.1} MiB: {kb_per_task:.1} KB a task",
        rss_kib as f64 / 1024.0,
        baseline_kib as f64 / 1024.0
    );
    println!(
        "operator: teardown (Environment deleted -> no Task/Pod/Service left) {:.2?}",
        teardown
    );
    println!(
        "{}",
        json!({"tasks": total, "nodes": nodes, "floor_ms": floor_time.as_millis() as u64, "floor_requests": floor_requests,
               "operator_ms": op_time.as_millis() as u64, "environment_written_ms": env_written.as_millis() as u64, "operator_requests": op_requests, "operator_requests_by_verb": op_by_verb,
               "operator_requests_with_teardown": all_requests, "ratio": (ratio * 100.0).round() / 100.0,
               "operator_peak_rss_mib": (rss_kib as f64 / 1024.0).round(), "teardown_ms": teardown.as_millis() as u64,
               "transitions": transitions, "transition_requests": transition_requests, "floor_transition_requests": floor_transition_requests})
    );
    // The contract's last line (issue 23).
    println!(
        "{}",
        json!({"bench": "operator", "tasks": total, "floor_s": round2(floor_time.as_secs_f64()),
               "operator_s": round2(op_time.as_secs_f64()), "ratio": round2(ratio),
               "peak_rss_mib": round2(rss_kib as f64 / 1024.0), "baseline_rss_mib": round2(baseline_kib as f64 / 1024.0),
               "kb_per_task": round2(kb_per_task), "requests": op_requests, "floor_requests": floor_requests})
    );
    Ok(())
}

/// The number after the last `key` in `text`.
fn field(text: &str, key: &str) -> Option<u64> {
    let at = text.rfind(key)? + key.len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The word after the first `key` in `text`.
fn word(text: &str, key: &str) -> Option<String> {
    let at = text.find(key)? + key.len();
    text[at..].split_whitespace().next().map(str::to_string)
}

/// When the operator's objects reached their milestones, from the watches of this process:
/// the simulators' pod watch, and a metadata-only Task watch (cheap for the apiserver).
#[derive(Default)]
struct Marks {
    t0: Option<Instant>,
    total: usize,
    marks: Vec<(&'static str, Duration)>,
    tasks: HashSet<String>,
    pods: HashSet<String>,
    running: HashSet<String>,
}

type SharedMarks = Arc<std::sync::Mutex<Marks>>;

impl Marks {
    fn mark(&mut self, what: &'static str) {
        if let Some(t0) = self.t0
            && !self.marks.iter().any(|(w, _)| *w == what)
        {
            self.marks.push((what, t0.elapsed()));
        }
    }

    fn task(&mut self, name: String) {
        self.tasks.insert(name);
        self.mark("first Task created");
        if self.tasks.len() >= self.total {
            self.mark("all Tasks created");
        }
    }

    fn pod(&mut self, name: String, running: bool) {
        self.pods.insert(name.clone());
        self.mark("first Pod created");
        if self.pods.len() >= self.total {
            self.mark("all Pods created");
        }
        if running {
            self.running.insert(name);
            self.mark("first pod Running");
            if self.running.len() >= self.total {
                self.mark("all pods Running");
            }
        }
    }
}

fn record(marks: &SharedMarks, f: impl FnOnce(&mut Marks)) {
    if let Ok(mut m) = marks.lock() {
        f(&mut m);
    }
}

/// Feeds `marks` with the Tasks of `ns` as they appear, until cancelled.
fn watch_tasks(client: Client, ns: String, marks: SharedMarks, stop: CancellationToken) {
    let api = Api::<kube::core::PartialObjectMeta<Task>>::namespaced(client, &ns);
    watch_until(api, stop, move |t| {
        record(&marks, |m| m.task(t.metadata.name.unwrap_or_default()))
    });
}

/// Feeds `marks` with the Pods of `ns` (created, Running) as they change, until cancelled.
fn watch_pods(client: Client, ns: String, marks: SharedMarks, stop: CancellationToken) {
    watch_until(Api::<Pod>::namespaced(client, &ns), stop, move |pod| {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        record(&marks, |m| m.pod(pod.name_any(), running))
    });
}

/// Calls `on` with every object `api` reports applied, until `stop` is cancelled.
fn watch_until<K>(api: Api<K>, stop: CancellationToken, on: impl Fn(K) + Send + 'static)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        let mut w = watcher(api, Default::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                n = w.next() => n,
            };
            if let Some(Ok(obj)) = next {
                on(obj);
            }
        }
    });
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut esc = false;
    for c in s.chars() {
        match (esc, c) {
            (false, '\u{1b}') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

/// The bare client: the same Task, Pod and Service bodies, created directly, then one status
/// write per Task once its pod runs.
async fn floor(client: &Client, ns: &str, refs: &[TaskRef], concurrency: usize) -> Res {
    let templates: Api<TaskTemplate> = Api::all(client.clone());
    let mut tmpl = BTreeMap::new();
    for (class, _) in CLASSES {
        tmpl.insert(class, templates.get(class).await?);
    }
    let owner = Environment::new("bf", EnvironmentSpec::default());
    let settings = PodSettings {
        home_base: "/home".into(),
        default_user: "flp".into(),
        fairmq_plugin_dir: "/opt/occ".into(),
    };
    let tasks: Api<Task> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    let t0 = Instant::now();
    let created: Vec<Task> = stream::iter(refs.iter().cloned())
        .map(|r| {
            let (tasks, pods, svcs, pp, tmpl, settings) =
                (&tasks, &pods, &svcs, &pp, &tmpl, &settings);
            let mut owner = owner.clone();
            owner.metadata.namespace = Some(ns.into());
            async move {
                let mut t = build_task(&owner, &r);
                t.metadata.finalizers = None;
                t.metadata.owner_references = None;
                let t = tasks.create(pp, &t).await?;
                let labels = task_labels("bf", &r, None);
                let tt = &tmpl[r.class.as_str()];
                let node = format!("{}.cluster.local", r.node);
                let pod = build_pod(
                    &t,
                    &r.template,
                    &tt.spec,
                    &node,
                    &labels,
                    &task_annotations(&r),
                    settings,
                )?;
                pods.create(pp, &pod).await?;
                svcs.create(pp, &build_service(&t, &labels, DISCOVERY_PORT))
                    .await?;
                Ok::<Task, Box<dyn std::error::Error + Send + Sync>>(t)
            }
        })
        .buffer_unordered(concurrency)
        .try_collect()
        .await?;
    println!(
        "floor: all Tasks, Pods, Services created at {:.2?}",
        t0.elapsed()
    );
    // Wait (watch) until every pod runs with an IP, then write each Task's status once.
    let mut ips: BTreeMap<String, String> = BTreeMap::new();
    let mut w = watcher(pods.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    while ips.len() < refs.len() {
        let pod = tokio::time::timeout(TIMEOUT, w.try_next())
            .await??
            .ok_or("pod watch ended")?;
        let st = pod.status.as_ref();
        if st.and_then(|s| s.phase.as_deref()) == Some("Running")
            && let Some(ip) = st.and_then(|s| s.pod_ip.clone())
        {
            ips.insert(pod.name_any(), ip);
        }
    }
    drop(w);
    println!("floor: all pods Running at {:.2?}", t0.elapsed());
    let ppa = PatchParams::apply("envbridge-bench-floor").force();
    stream::iter(created)
        .map(|t| {
            let tasks = &tasks;
            let ppa = &ppa;
            let ip = ips.get(&t.name_any()).cloned();
            async move {
                let status = TaskStatus {
                    state: Some(State::Standby),
                    pod_phase: Some("Running".into()),
                    pod_ip: ip,
                    node_name: Some(format!("{}.cluster.local", t.spec.task.node)),
                    ..Default::default()
                };
                let patch = json!({"apiVersion": "envbridge.dev/v1alpha1", "kind": "Task", "status": status});
                tasks.patch_status(&t.name_any(), ppa, &Patch::Apply(&patch)).await?;
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn wait_standby(admin: &Client, ns: &str, name: &str, total: usize) -> Res {
    let api: Api<Environment> = Api::namespaced(admin.clone(), ns);
    let want = format!("{total}/{total}");
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut w = watcher(api, cfg).applied_objects().boxed();
    let mut last = String::new();
    loop {
        let env = tokio::time::timeout(TIMEOUT, w.try_next())
            .await??
            .ok_or("environment watch ended")?;
        let st = env.status.unwrap_or_default();
        let ready = st.ready.clone().unwrap_or_default();
        if ready != last {
            last = ready.clone();
        }
        if st.state == Some(State::Standby) && ready == want {
            return Ok(());
        }
    }
}

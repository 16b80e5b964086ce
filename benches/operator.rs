//! Operator benchmark (printed figures, not a timed test): an Environment of N tasks on M
//! simulated nodes (default 2,000 on 250) -> all Tasks and Pods created and STANDBY, then
//! CONFIGURE, START, STOP, RESET, then destroyed.
//!
//! In the same run, the raw floor: a bare client creating the same objects (Task, Pod,
//! Service per task, the same bodies), waiting for the pods to run, and writing each Task's
//! status once; then each transition with the same writes and calls per task
//! (`support::floor`). The floor creates first, then the operator, then the floor once more
//! in a namespace of its own, deleted again at once: the floor's create time F is the mean
//! of the two (the plane's pace drifts between them). Each floor transition
//! runs just before the operator's (both environments exist, the idle one waiting); the
//! floor's namespace is deleted after the operator's teardown. Before all of it, one create
//! not measured warms a fresh plane (BENCH_WARMUP=0 skips it). Each step prints what it cost the
//! machine (`support::costs`: CPU by process, the apiserver's request time and watch events),
//! and a table of both sides ends the run.
//! Figures: wall time, apiserver requests, operator peak RSS (VmHWM of the
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
//! BENCH_SHARDS=2 splits the tasks by node between two environments, each reconciled by its
//! own shard operator (`--shard s0`, `--shard s1`), both run at once (their RSS and requests
//! summed in the last line, each one's figures printed before it);
//! BENCH_OPERATOR_WRAPPER runs the operator under a profiler (`heaptrack -o FILE`);
//! BENCH_POD_WATCH_CACHE=0 starts the plane with Pod watches served from etcd
//! (`dev up --no-pod-watch-cache`); BENCH_KWOK_RELAY=0 without the watch relay in front of
//! kwok (`dev up --kwok-relay`, on by default here); a running plane is reused as it is.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use envbridge::crd::{Environment, Task};
use envbridge::launch::client::observed;
use envbridge::operator::requests::RequestCount;
use envbridge::plan::TaskRef;
use envbridge::state::State;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Config};
use serde_json::json;

mod support;

use support::costs::{Cost, Probe, Snapshot};
use support::drive::transition_succeeded;
use support::floor::CYCLE;
use support::marks::creation_marks;
use support::operator_proc::{OperatorProc, Requests};
use support::sims::SimRunners;
use support::tasks::{CLASSES, task_refs};
use support::{Res, create_ns, delete_ns, env_num, install, purge_namespace};

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
    let concurrency = concurrency();
    println!(
        "operator benchmark: {} tasks on {nodes} nodes",
        nodes * per_node
    );
    // BENCH_POD_WATCH_CACHE=0: Pod watches from etcd. With the watch cache, kwok (one reader
    // of every pod event) is cut off in a burst of pods and re-sent what it had; from etcd it
    // is not, but a watcher behind the compaction lists again (docs/benchmarks.md, "The pod
    // watch cache off"). BENCH_KWOK_RELAY=0: kwok straight to the apiserver, not through
    // the watch relay that holds what kwok has not read (docs/benchmarks.md, "kwok behind a
    // watch relay"). A running plane is reused as it is; what it has is printed.
    let spec = envbridge::dev::UpSpec {
        nodes: nodes as u32,
        no_pod_watch_cache: env_num("BENCH_POD_WATCH_CACHE", 1) == 0,
        kwok_relay: env_num("BENCH_KWOK_RELAY", 1) != 0,
        exe: Some(env!("CARGO_BIN_EXE_envbridge").into()),
        ..Default::default()
    };
    let info = envbridge::dev::ensure_up_with(&spec).await?;
    println!(
        "plane: Pod watches served from {}; kwok {}",
        if info.pod_watch_cache {
            "kube-apiserver's watch cache"
        } else {
            "etcd (no watch cache)"
        },
        if info.kwok_relay {
            "through the watch relay"
        } else {
            "straight to the apiserver"
        }
    );
    let admin = envbridge::dev::client_for(&info.kubeconfig).await?;
    let probe = Probe::of(&admin, &info);
    install(&admin, &CLASSES.map(|(c, _)| c)).await?;
    let suffix = std::process::id();

    // A first burst, not measured (BENCH_WARMUP=0 skips it): on a fresh plane the first
    // burst of pods cuts off the watchers that started on an empty watch cache (kwok's among
    // them: the apiserver sizes a watcher's buffer from the cache's recent history, 10
    // events at first), and kwok takes the events again and writes pods' status twice: the
    // floor's create, first on the plane, took 25-50% longer then.
    if env_num("BENCH_WARMUP", 1) != 0 {
        let warm_nodes = nodes.min(2000 / per_node.max(1)).max(1);
        let took = floor_aside(
            &admin,
            &probe,
            &info.kubeconfig,
            "warm-up: create",
            warm_nodes,
            per_node,
            3,
        )
        .await?;
        println!(
            "warm-up: {} tasks created and deleted again, the create {took:.2?} (not measured)",
            warm_nodes * per_node
        );
    }

    // The raw floor.
    let floor_ns = format!("bench-floor-{suffix}");
    create_ns(&admin, &floor_ns).await?;
    let mut refs = task_refs("bf", nodes, per_node);
    // Other control ports than the operator's tasks on the same nodes: both environments
    // live at once, and readout's pods share their node's address (host network).
    refs.iter_mut().for_each(|r| r.control_port += 100);
    let count = Arc::new(RequestCount::default());
    let kc = kube::config::Kubeconfig::read_from(&info.kubeconfig)?;
    // The floor is bounded by its own concurrency only, as before the operator's bound.
    let counted = observed(
        Config::from_custom_kubeconfig(kc, &Default::default()).await?,
        count.clone(),
        tokio::sync::Semaphore::MAX_PERMITS,
    )?;
    let log = std::env::temp_dir().join(format!("envbridge-bench-operator-{suffix}.log"));
    let floor_sims = SimRunners::start(
        &info.kubeconfig,
        &floor_ns,
        &CLASSES.map(|(c, _)| c),
        &log.with_extension("floor-sims"),
    )?;
    let mut floor_costs = Vec::new();
    settle("floor: create").await;
    let before = Snapshot::take(&probe).await;
    let t0 = Instant::now();
    support::floor::create(&counted, &floor_ns, &refs, concurrency, DISCOVERY_PORT).await?;
    let floor_time = t0.elapsed();
    floor_costs.push(cost_since(&probe, &before, "floor: create").await);
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
    // Its objects stay, idle, until the operator's teardown: each of its transitions runs
    // just before the operator's, so that both see the machine alike (this machine's pace
    // drifts by 20% over minutes, the whole run takes 45 at 10,000 tasks).
    let control = envbridge::control::ControlClient::new(false);
    let mut floor_steps = Vec::new();

    // The operator (a child process, as deployed), with task simulators for its pods;
    // BENCH_SHARDS > 1: as many shard operators, each with its own environment (the tasks
    // split between them by node).
    let op_ns = format!("bench-op-{suffix}");
    create_ns(&admin, &op_ns).await?;
    let sims = SimRunners::start(
        &info.kubeconfig,
        &op_ns,
        &CLASSES.map(|(c, _)| c),
        &log.with_extension("sims"),
    )?;
    let refs = task_refs("bo", nodes, per_node);
    let total = refs.len();
    let parts = shard_parts(refs, env_num("BENCH_SHARDS", 1), per_node);
    let mut operators = Vec::new();
    for p in &parts {
        let log = log.with_extension(p.shard.as_deref().unwrap_or("log"));
        operators.push(
            OperatorProc::start(
                &info.kubeconfig,
                &op_ns,
                p.shard.as_deref(),
                DISCOVERY_PORT,
                &log,
            )
            .await?,
        );
    }
    let operators_baseline: Vec<u64> = operators.iter().map(|o| o.baseline_kib).collect();
    let mut op_costs = Vec::new();
    settle("operator: create").await;
    let snap = Snapshot::take(&probe).await;
    let t0 = Instant::now();
    let t0_wall = SystemTime::now();
    // Each environment's TaskSets (200 tasks, 25 nodes each), then the Environment; all
    // environments at once.
    all_timed(&parts, |p| async {
        envbridge::dev::fixtures::deploy_in_shard(
            &admin,
            &op_ns,
            &p.env,
            &p.refs,
            envbridge::plan::DEFAULT_TASK_SET_BUDGET,
            "envbridge-bench",
            p.shard.as_deref(),
        )
        .await
        .map_err(Into::into)
    })
    .await?;
    let env_written = t0.elapsed();
    let standby_at = all_timed(&parts, |p| {
        wait_standby(&admin, &op_ns, &p.env, p.refs.len())
    })
    .await?;
    let op_time = t0.elapsed();
    op_costs.push(cost_since(&probe, &snap, "operator: create").await);
    // The operators log the requests they have sent so far (read from their logs below).
    operators.iter().for_each(OperatorProc::log_requests);
    let marks = creation_marks(&admin, &op_ns, t0_wall).await?;
    let pods = Api::<Pod>::namespaced(admin.clone(), &op_ns)
        .list(&ListParams::default())
        .await?
        .items
        .len();
    let memory = |at: &str| {
        for (p, o) in parts.iter().zip(&operators) {
            println!(
                "operator{}: at {at}: RSS {:.1} MiB, peak so far {:.1} MiB",
                p.label(),
                mib(o.rss_kib()),
                mib(o.peak_kib())
            );
        }
    };
    memory("STANDBY");
    // The floor's create again, now that the operator's objects exist as the floor's did
    // when the operator created: the other side of the bracket (its mean below).
    let floor_after = {
        let label = "floor (after the operator's): create";
        let before = count.total();
        let took = floor_aside(
            &counted,
            &probe,
            &info.kubeconfig,
            label,
            nodes,
            per_node,
            2,
        )
        .await?;
        println!(
            "floor (after the operator's): {took:.2?} wall, {} apiserver requests",
            count.total() - before
        );
        took
    };
    // The same transitions through the operator: asked on the Environment(s), timed until
    // each one's status says the transition succeeded.
    let mut op_steps = Vec::new();
    let mut shard_steps: Vec<Vec<Duration>> = vec![Vec::new(); parts.len()];
    // BENCH_CYCLES > 1 runs the cycle again (each figure is the first cycle's): whether the
    // operator's memory settles or grows with the transitions.
    for cycle in 0..env_num("BENCH_CYCLES", 1).max(1) {
        for (i, step) in CYCLE.into_iter().enumerate() {
            let event = step.0;
            if cycle == 0 {
                settle(&format!("floor: {event}")).await;
                let before = count.total();
                let snap = Snapshot::take(&probe).await;
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
                println!("floor: {event} {took:.2?}, {requests} requests");
                floor_costs.push(cost_since(&probe, &snap, &format!("floor: {event}")).await);
                floor_steps.push((took, requests));
            }
            settle(&format!("operator: {event}")).await;
            let snap = Snapshot::take(&probe).await;
            let t = Instant::now();
            let id = format!("o{cycle}-{i}");
            let each = all_timed(&parts, |p| {
                transition_succeeded(&admin, &op_ns, &p.env, &id, event)
            })
            .await?;
            let took = t.elapsed();
            println!("operator: {event} {took:.2?}");
            if cycle == 0 {
                op_costs.push(cost_since(&probe, &snap, &format!("operator: {event}")).await);
                op_steps.push(took);
                for (s, d) in shard_steps.iter_mut().zip(each) {
                    s.push(d);
                }
            }
            memory(&format!("{event} (cycle {})", cycle + 1));
        }
    }
    operators.iter().for_each(OperatorProc::log_requests);
    settle("operator: teardown").await;
    let snap = Snapshot::take(&probe).await;
    let t1 = Instant::now();
    for p in &parts {
        Api::<Environment>::namespaced(admin.clone(), &op_ns)
            .delete(&p.env, &DeleteParams::default())
            .await?;
    }
    support::wait_gone(&admin, &op_ns, TIMEOUT).await?;
    let teardown = t1.elapsed();
    op_costs.push(cost_since(&probe, &snap, "operator: teardown").await);
    // The floor's destroy: the same calls (each process taken out from where the cycle left
    // it) and deletes from the bare client (its simulators still following its pods, as the
    // operator's did), then its namespace, empty by then.
    settle("floor: destroy").await;
    let before = count.total();
    let snap = Snapshot::take(&probe).await;
    let left_in = CYCLE[CYCLE.len() - 1].0.target();
    let floor_destroy =
        support::floor::destroy(&counted, &control, &floor_tasks, left_in, concurrency).await?;
    drop(control);
    let floor_destroy_requests = count.total() - before;
    println!("floor: destroy {floor_destroy:.2?}, {floor_destroy_requests} requests");
    floor_costs.push(cost_since(&probe, &snap, "floor: destroy").await);
    floor_sims.stop().await;
    purge_namespace(&admin, &floor_ns, TIMEOUT).await?;
    memory("the teardown's end");
    // The peak over the whole run: create, transitions, teardown.
    let peaks: Vec<u64> = operators.iter().map(OperatorProc::peak_kib).collect();
    // Requests so far again (the teardown's are the difference).
    operators.iter().for_each(OperatorProc::log_requests);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut requests = Vec::new();
    for o in operators.drain(..) {
        requests.push(o.stop().await?);
    }
    sims.stop().await;
    delete_ns(&admin, &op_ns).await;
    let mut all = Requests::default();
    requests.iter().for_each(|r| all += r);
    let baseline_kib: u64 = operators_baseline.iter().sum();
    let rss_kib: u64 = peaks.iter().sum();

    // The floor's create measured before the operator's and again after it: their mean
    // cancels the plane's drift, as interleaving does for the transitions (the two differed
    // by up to 17%, either way).
    let floor_create = (floor_time + floor_after) / 2;
    let ratio = op_time.as_secs_f64() / floor_create.as_secs_f64();
    let before_ratio = op_time.as_secs_f64() / floor_time.as_secs_f64();
    let after_ratio = op_time.as_secs_f64() / floor_after.as_secs_f64();
    println!(
        "operator: {op_time:.2?} wall to {total}/{total} STANDBY ({pods} pods), ratio to floor {ratio:.2} (the floor's create before it {floor_time:.2?}, after it {floor_after:.2?}: mean {floor_create:.2?}; ratio to the one before {before_ratio:.2}, to the one after {after_ratio:.2})",
    );
    println!(
        "operator: TaskSets and Environment written at {:.2?}; from there to STANDBY {:.2?}, ratio to floor {:.2}",
        env_written,
        op_time - env_written,
        (op_time - env_written).as_secs_f64() / floor_create.as_secs_f64()
    );
    for (what, at) in &marks {
        println!("operator: {what} at {} s", at.as_secs());
    }
    println!(
        "operator: {} apiserver requests to STANDBY (floor {floor_requests}): {}",
        all.standby, all.standby_by_verb
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
        "operator: {} requests for the 4 transitions (floor {floor_transition_requests})",
        all.transitions
    );
    println!(
        "operator: {} more requests for the teardown ({} in all: {})",
        all.all.saturating_sub(all.standby + all.transitions),
        all.all,
        all.all_by_verb
    );
    print_costs(&floor_costs, &op_costs);
    let kb_a_task = kb_per_task(rss_kib, baseline_kib, total);
    println!(
        "operator: peak RSS {:.1} MiB, empty operator {:.1} MiB: {kb_a_task:.1} KB a task",
        mib(rss_kib),
        mib(baseline_kib)
    );
    println!(
        "operator: teardown (Environment deleted -> no Task/Pod/Service left) {:.2?} against the floor's destroy {:.2?}, ratio {:.2}; {} requests (floor {floor_destroy_requests})",
        teardown,
        floor_destroy,
        teardown.as_secs_f64() / floor_destroy.as_secs_f64(),
        all.all.saturating_sub(all.standby + all.transitions)
    );
    let mut shards = Vec::new();
    if parts.len() > 1 {
        for (i, p) in parts.iter().enumerate() {
            let steps: Vec<String> = CYCLE
                .iter()
                .zip(&shard_steps[i])
                .map(|((e, _), d)| format!("{e} {:.2} s", d.as_secs_f64()))
                .collect();
            let k = kb_per_task(peaks[i], operators_baseline[i], p.refs.len());
            println!(
                "operator{}: environment {} of {} tasks STANDBY at {:.2?}; {}; peak RSS {:.1} MiB, empty {:.1} MiB: {k:.1} KB a task; {} requests to STANDBY, {} for the transitions, {} in all",
                p.label(),
                p.env,
                p.refs.len(),
                standby_at[i],
                steps.join(", "),
                mib(peaks[i]),
                mib(operators_baseline[i]),
                requests[i].standby,
                requests[i].transitions,
                requests[i].all
            );
            shards.push(json!({"shard": p.shard, "environment": p.env, "tasks": p.refs.len(),
                "standby_s": round2(standby_at[i].as_secs_f64()),
                "transitions_s": shard_steps[i].iter().map(|d| round2(d.as_secs_f64())).collect::<Vec<_>>(),
                "peak_rss_mib": round2(mib(peaks[i])), "baseline_rss_mib": round2(mib(operators_baseline[i])),
                "kb_per_task": round2(k), "requests": requests[i].standby}));
        }
    }
    println!(
        "{}",
        json!({"tasks": total, "nodes": nodes, "floor_ms": floor_create.as_millis() as u64, "floor_requests": floor_requests,
               "floor_before_ms": floor_time.as_millis() as u64, "floor_after_ms": floor_after.as_millis() as u64,
               "ratio_to_floor_before": round2(before_ratio), "ratio_to_floor_after": round2(after_ratio),
               "operator_ms": op_time.as_millis() as u64, "environment_written_ms": env_written.as_millis() as u64, "operator_requests": all.standby, "operator_requests_by_verb": all.standby_by_verb,
               "operator_requests_with_teardown": all.all, "ratio": round2(ratio),
               "operator_peak_rss_mib": mib(rss_kib).round(), "teardown_ms": teardown.as_millis() as u64,
               "floor_destroy_ms": floor_destroy.as_millis() as u64, "floor_destroy_requests": floor_destroy_requests,
               "transitions": transitions, "transition_requests": all.transitions, "floor_transition_requests": floor_transition_requests,
               "shards": shards})
    );
    // The contract's last line (issue 23); with shards, their sums (RSS, requests) and the
    // last environment's STANDBY.
    println!(
        "{}",
        json!({"bench": "operator", "tasks": total, "floor_s": round2(floor_create.as_secs_f64()),
               "operator_s": round2(op_time.as_secs_f64()), "ratio": round2(ratio),
               "peak_rss_mib": round2(mib(rss_kib)), "baseline_rss_mib": round2(mib(baseline_kib)),
               "kb_per_task": round2(kb_a_task), "requests": all.standby, "floor_requests": floor_requests})
    );
    Ok(())
}

/// Waits, before a timed step, until the controller-manager has worked through the step
/// before it and half the machine is idle (at most two minutes): otherwise the step after a
/// create pays for the create's garbage and node work, and which side that is depends on the
/// order.
async fn settle(what: &str) {
    let s = support::costs::settle(0.15, 1.0, Duration::from_secs(120)).await;
    println!("{what}: plane {}", s.line());
}

/// The cost of a step from `before` until now, printed as it ends.
async fn cost_since(probe: &Probe, before: &Snapshot, what: &str) -> Cost {
    let cost = before.cost_until(&Snapshot::take(probe).await);
    println!("{what}: {}", cost.line());
    cost
}

/// Writes (and the floor's calls) in flight at once: BENCH_CONCURRENCY, 64 by default.
fn concurrency() -> usize {
    env_num("BENCH_CONCURRENCY", 64)
}

/// The floor's create in a namespace of its own (`bench-floor{slot}-PID`, control ports
/// `100 * slot` above the operator's), with its simulators, then everything deleted again:
/// the create's wall time.
async fn floor_aside(
    client: &Client,
    probe: &Probe,
    kubeconfig: &std::path::Path,
    label: &str,
    nodes: usize,
    per_node: usize,
    slot: u16,
) -> Res<Duration> {
    let ns = format!("bench-floor{slot}-{}", std::process::id());
    create_ns(&probe.admin, &ns).await?;
    let mut refs = task_refs(&format!("b{slot}"), nodes, per_node);
    refs.iter_mut().for_each(|r| r.control_port += 100 * slot);
    let sims = SimRunners::start(
        kubeconfig,
        &ns,
        &CLASSES.map(|(c, _)| c),
        &std::env::temp_dir().join(format!(
            "envbridge-bench-operator-{}.floor{slot}-sims",
            std::process::id()
        )),
    )?;
    settle(label).await;
    let snap = Snapshot::take(probe).await;
    let t = Instant::now();
    support::floor::create(client, &ns, &refs, concurrency(), DISCOVERY_PORT).await?;
    let took = t.elapsed();
    cost_since(probe, &snap, label).await;
    sims.stop().await;
    purge_namespace(&probe.admin, &ns, TIMEOUT).await?;
    Ok(took)
}

/// Each step's cost, the floor's beside the operator's: where a step's ratio comes from
/// (a busier apiserver, the operator's own CPU, or cores left idle).
fn print_costs(floor: &[Cost], op: &[Cost]) {
    let steps = ["create", "CONFIGURE", "START", "STOP", "RESET", "destroy"];
    println!(
        "step: wall s, CPU busy s, idle s, apiserver CPU s, its request s, watch events (floor | operator); the operator's and the simulators' CPU s"
    );
    for (i, step) in steps.iter().enumerate() {
        let (Some(f), Some(o)) = (floor.get(i), op.get(i)) else {
            continue;
        };
        let cols = |c: &Cost| {
            format!(
                "{:.1}, {:.1}, {:.1}, {:.1}, {:.0}, {:.0}",
                c.wall_s,
                c.busy_s,
                c.idle_s,
                c.cpu_of("apiserver"),
                c.request_s(),
                c.watch_events()
            )
        };
        println!(
            "{step}: {} | {}; operator {:.1}, simulators {:.1} (floor's {:.1})",
            cols(f),
            cols(o),
            o.cpu_of("operator"),
            o.cpu_of("simulators"),
            f.cpu_of("simulators")
        );
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// What each task adds to the operator(s): (peak - empty) over the tasks, KB (1,000 bytes).
fn kb_per_task(peak_kib: u64, baseline_kib: u64, tasks: usize) -> f64 {
    peak_kib.saturating_sub(baseline_kib) as f64 * 1024.0 / 1000.0 / tasks.max(1) as f64
}

/// One operator's share: its environment, its shard (none with one operator), its tasks.
struct Part {
    env: String,
    shard: Option<String>,
    refs: Vec<TaskRef>,
}

impl Part {
    /// How its lines are told apart: nothing with one operator, ` (shard s0)` otherwise.
    fn label(&self) -> String {
        self.shard
            .as_deref()
            .map(|s| format!(" (shard {s})"))
            .unwrap_or_default()
    }
}

/// `refs` split into `shards` environments by node (whole nodes each); one: the
/// environment `bo`, no shard.
fn shard_parts(refs: Vec<TaskRef>, shards: usize, per_node: usize) -> Vec<Part> {
    if shards <= 1 {
        return vec![Part {
            env: "bo".into(),
            shard: None,
            refs,
        }];
    }
    let nodes = refs.len().div_ceil(per_node.max(1));
    let chunk = nodes.div_ceil(shards) * per_node.max(1);
    refs.chunks(chunk.max(1))
        .enumerate()
        .map(|(i, c)| Part {
            env: format!("bo{i}"),
            shard: Some(format!("s{i}")),
            refs: c.to_vec(),
        })
        .collect()
}

/// Runs `f` on every part at once; each one's time to done, once all are.
async fn all_timed<'a, F, Fut>(parts: &'a [Part], f: F) -> Res<Vec<Duration>>
where
    F: Fn(&'a Part) -> Fut,
    Fut: std::future::Future<Output = Res>,
{
    let t = Instant::now();
    futures::future::try_join_all(parts.iter().map(|p| {
        let fut = f(p);
        async move {
            fut.await?;
            Ok::<Duration, support::Error>(t.elapsed())
        }
    }))
    .await
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

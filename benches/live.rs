//! Live task state benchmark (printed figures, not a timed test): an Environment of N tasks
//! on M simulated nodes (default 2,000 on 250) driven to RUNNING, then held there.
//!
//! Run twice in one go, the operator (a child process, as deployed) once without live state
//! (`--no-live-state`, the baseline) and once with it. Figures: the operator's CPU while
//! idle in RUNNING (share of one core over BENCH_IDLE_SECONDS), its resident memory in
//! RUNNING and peak (VmHWM), the difference per task; with live state, the detection
//! latency over BENCH_FAILURES failures injected one at a time into simulators in RUNNING
//! (from the simulator's own change to the Task's status showing ERROR, and for the first
//! one to the Environment's ERROR), p50/p99/max.
//!
//! Run: `cargo bench --bench live` (starts or reuses the local control plane; grows it to
//! BENCH_NODES nodes). BENCH_NODES, BENCH_TASKS_PER_NODE, BENCH_IDLE_SECONDS, BENCH_FAILURES.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envbridge::crd::{Environment, Task};
use envbridge::state::{Event, State};
use futures::StreamExt;
use kube::api::DeleteParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

mod support;

use support::costs::{cpu_ticks, ticks_per_second};
use support::drive::{TIMEOUT, deploy_standby, transition_succeeded};
use support::sims::Sims;
use support::tasks::{CLASSES, task_refs};
use support::{Res, create_ns, delete_ns, env_num, install, peak_rss_kib, rss_kib};

const DISCOVERY_PORT: u16 = 47000;

fn main() -> Res {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run())
}

/// What one operator run measured.
struct Figures {
    to_running: Duration,
    idle_cpu_pct: f64,
    rss_kib: u64,
    peak_kib: u64,
    latencies: Vec<Duration>,
    env_latency: Option<Duration>,
}

async fn run() -> Res {
    let nodes = env_num("BENCH_NODES", 250);
    let per_node = env_num("BENCH_TASKS_PER_NODE", 8);
    let idle = Duration::from_secs(env_num("BENCH_IDLE_SECONDS", 30) as u64);
    let failures = env_num("BENCH_FAILURES", 100);
    let total = nodes * per_node;
    println!("live state benchmark: {total} tasks on {nodes} nodes, held in RUNNING");
    let info = envbridge::dev::ensure_up(nodes as u32).await?;
    let admin = envbridge::dev::client_for(&info.kubeconfig).await?;
    install(&admin, &CLASSES.map(|(c, _)| c)).await?;

    let base = one(&admin, &info.kubeconfig, nodes, per_node, idle, 0, false).await?;
    let live = one(
        &admin,
        &info.kubeconfig,
        nodes,
        per_node,
        idle,
        failures,
        true,
    )
    .await?;

    let per_task = |f: &Figures| f.rss_kib as f64 * 1024.0 / total as f64;
    let added = (live.rss_kib as f64 - base.rss_kib as f64) * 1024.0 / total as f64;
    for (name, f) in [("without live state", &base), ("with live state", &live)] {
        println!(
            "operator {name}: RUNNING after {:.2?}; idle CPU {:.2}% of one core; RSS in RUNNING {:.1} MiB ({:.1} KB a task), peak {:.1} MiB",
            f.to_running,
            f.idle_cpu_pct,
            f.rss_kib as f64 / 1024.0,
            per_task(f) / 1000.0,
            f.peak_kib as f64 / 1024.0,
        );
    }
    println!(
        "live state adds {:.1} KB of operator memory a task (RSS in RUNNING)",
        added / 1000.0
    );
    let mut l = live.latencies.clone();
    l.sort();
    let pct = |p: f64| -> Duration {
        if l.is_empty() {
            return Duration::ZERO;
        }
        l[((l.len() as f64 * p).ceil() as usize).clamp(1, l.len()) - 1]
    };
    println!(
        "detection latency over {} failures in RUNNING (simulator's change -> Task status ERROR): p50 {:.0?}, p99 {:.0?}, max {:.0?}",
        l.len(),
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
    if let Some(e) = live.env_latency {
        println!("first failure -> Environment ERROR: {e:.0?}");
    }
    println!(
        "{}",
        json!({
            "tasks": total, "nodes": nodes,
            "idle_cpu_pct": (live.idle_cpu_pct * 100.0).round() / 100.0,
            "idle_cpu_pct_without_live": (base.idle_cpu_pct * 100.0).round() / 100.0,
            "rss_mib": (live.rss_kib as f64 / 1024.0 * 10.0).round() / 10.0,
            "rss_mib_without_live": (base.rss_kib as f64 / 1024.0 * 10.0).round() / 10.0,
            "peak_rss_mib": (live.peak_kib as f64 / 1024.0 * 10.0).round() / 10.0,
            "live_kb_per_task": (added / 100.0).round() / 10.0,
            "failures": l.len(),
            "latency_p50_ms": pct(0.50).as_millis() as u64,
            "latency_p99_ms": pct(0.99).as_millis() as u64,
            "latency_max_ms": pct(1.0).as_millis() as u64,
            "env_error_ms": live.env_latency.map(|d| d.as_millis() as u64),
        })
    );
    Ok(())
}

/// One operator run: deploy, CONFIGURE, START, idle, inject failures, tear down.
async fn one(
    admin: &Client,
    kubeconfig: &std::path::Path,
    nodes: usize,
    per_node: usize,
    idle: Duration,
    failures: usize,
    live: bool,
) -> Res<Figures> {
    let suffix = format!(
        "{}-{}",
        std::process::id(),
        if live { "live" } else { "base" }
    );
    let ns = format!("bench-live-{suffix}");
    create_ns(admin, &ns).await?;
    let sims = Sims::start(admin.clone(), ns.clone(), |_, _| {});
    let log = std::env::temp_dir().join(format!("envbridge-bench-live-{suffix}.log"));
    let log_file = std::fs::File::create(&log)?;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge"));
    cmd.args([
        "operator",
        "--metrics-listen=127.0.0.1:0",
        "--no-leader-election",
        "--namespace",
        &ns,
    ])
    .args(["--headless-discovery-port", &DISCOVERY_PORT.to_string()])
    .env("KUBECONFIG", kubeconfig)
    // The filter it runs with when deployed (no RUST_LOG: info, kube and HTTP at warn).
    .env_remove("RUST_LOG")
    .stderr(log_file.try_clone()?)
    .stdout(log_file)
    .kill_on_drop(true);
    if !live {
        cmd.arg("--no-live-state");
    }
    let mut child = cmd.spawn()?;
    let pid = child.id().ok_or("operator exited at once")?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let refs = task_refs("bl", nodes, per_node);
    let t0 = Instant::now();
    deploy_standby(admin, &ns, "bl", &refs).await?;
    for (id, event) in [("c", Event::Configure), ("s", Event::Start)] {
        transition_succeeded(admin, &ns, "bl", id, event).await?;
    }
    let to_running = t0.elapsed();
    // Settle, then idle: nothing asked of the operator.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cpu0 = cpu_ticks(pid).ok_or("operator CPU")?;
    let w0 = Instant::now();
    tokio::time::sleep(idle).await;
    let cpu1 = cpu_ticks(pid).ok_or("operator CPU")?;
    let idle_cpu_pct =
        (cpu1 - cpu0) as f64 / ticks_per_second() / w0.elapsed().as_secs_f64() * 100.0;
    let rss_kib = rss_kib(pid).unwrap_or(0);

    let (latencies, env_latency) = if failures > 0 {
        inject(admin, &ns, &sims, failures).await?
    } else {
        (Vec::new(), None)
    };
    let peak_kib = peak_rss_kib(pid).unwrap_or(0);

    Api::<Environment>::namespaced(admin.clone(), &ns)
        .delete("bl", &DeleteParams::default())
        .await?;
    let _ = tokio::time::timeout(TIMEOUT, async {
        while !Api::<Task>::namespaced(admin.clone(), &ns)
            .list(&Default::default())
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(true)
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    sims.stop().await;
    delete_ns(admin, &ns).await;
    Ok(Figures {
        to_running,
        idle_cpu_pct,
        rss_kib,
        peak_kib,
        latencies,
        env_latency,
    })
}

/// Fails `n` simulators in RUNNING one at a time (spread over the nodes and the classes);
/// each latency runs from the injection to the Task's status showing ERROR.
async fn inject(
    admin: &Client,
    ns: &str,
    sims: &Sims,
    n: usize,
) -> Res<(Vec<Duration>, Option<Duration>)> {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let env_seen: Arc<Mutex<Option<Instant>>> = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    {
        let tasks: Api<Task> = Api::namespaced(admin.clone(), ns);
        let seen = seen.clone();
        let task_stop = stop.clone();
        tokio::spawn(async move {
            let mut w = watcher(tasks, watcher::Config::default())
                .applied_objects()
                .boxed();
            loop {
                let next =
                    tokio::select! { _ = task_stop.cancelled() => return, n = w.next() => n };
                if let Some(Ok(t)) = next
                    && t.status.as_ref().and_then(|s| s.state) == Some(State::Error)
                {
                    seen.lock()
                        .unwrap()
                        .entry(t.name_any())
                        .or_insert_with(Instant::now);
                }
            }
        });
        let envs: Api<Environment> = Api::namespaced(admin.clone(), ns);
        let env_seen = env_seen.clone();
        let env_stop = stop.clone();
        tokio::spawn(async move {
            let mut w = watcher(envs, watcher::Config::default())
                .applied_objects()
                .boxed();
            loop {
                let next = tokio::select! { _ = env_stop.cancelled() => return, n = w.next() => n };
                if let Some(Ok(e)) = next
                    && e.status.as_ref().and_then(|s| s.state) == Some(State::Error)
                {
                    env_seen.lock().unwrap().get_or_insert_with(Instant::now);
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut names: Vec<String> = sims.by_pod.iter().map(|e| e.key().clone()).collect();
    names.sort();
    let step = (names.len() / n.max(1)).max(1);
    let victims: Vec<String> = names.into_iter().step_by(step).take(n).collect();
    let mut injected: BTreeMap<String, Instant> = BTreeMap::new();
    let mut first = None;
    for v in &victims {
        let Some(sim) = sims.by_pod.get(v).map(|s| s.clone()) else {
            continue;
        };
        let at = Instant::now();
        first.get_or_insert(at);
        sim.fail_now();
        injected.insert(v.clone(), at);
        // One at a time: wait for it (bounded), then a pause. After the first, also for the
        // Environment's ERROR (its status is debounced: a storm of changes would delay it).
        let deadline = at + Duration::from_secs(30);
        while !seen.lock().unwrap().contains_key(v) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if injected.len() == 1 {
            while env_seen.lock().unwrap().is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let seen = seen.lock().unwrap().clone();
    let mut latencies = Vec::new();
    for (v, at) in &injected {
        match seen.get(v) {
            Some(s) => latencies.push(s.saturating_duration_since(*at)),
            None => println!("failure of {v} not seen within 30 s"),
        }
    }
    let env_latency = match (first, *env_seen.lock().unwrap()) {
        (Some(f), Some(e)) => Some(e.saturating_duration_since(f)),
        _ => None,
    };
    Ok((latencies, env_latency))
}

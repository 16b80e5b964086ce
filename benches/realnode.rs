//! Real-node benchmark (issue 22; printed figures, not a timed test): one Environment of 60
//! direct-mode readout tasks on 2 REAL nodes of the local plane (a kubelet and a containerd
//! each; every task a container of `localhost/envbridge:dev`, whose task simulator answers
//! on the node's address), and in the same run the same 60 tasks on 2 kwok nodes, with
//! `envbridge dev sim-runner --in-process` standing in for the containers. Per side, with an
//! operator of its own (a child process, as deployed): create -> all STANDBY, CONFIGURE,
//! START, STOP, RESET (each until the Environment's transition Succeeded), destroy (until no
//! Task, Pod or Service is left), and the ratio real/kwok per step. Memory of each real
//! node's kubelet and containerd (VmRSS before, peak, end), and of its containerd shims and
//! pod processes with all 60 tasks RUNNING.
//!
//! Run: `cargo bench --bench realnode`. It reuses the running plane as it is when it has 2
//! real and 2 kwok nodes Ready (no image re-import, nothing written but its namespaces);
//! otherwise it starts what is missing (`dev::ensure_up_with`), and stops a plane it started
//! from nothing. BENCH_TASKS_PER_NODE adjusts the size (default 30); BENCH_CHILD_LOG sets the
//! operator's and sim-runner's RUST_LOG (default info; their logs go to /tmp).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use envbridge::crd::{Environment, EnvironmentStatus, TransitionPhase, TransitionRequest};
use envbridge::dev::ClusterInfo;
use envbridge::dev::realnode::RealNodeState;
use envbridge::state::{Event, State};
use futures::{StreamExt, TryStreamExt};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;

mod support;

use support::costs::ticks_per_second;
use support::nodemem::{Kib, Mem, NodeProcs, Sampler, Seen};
use support::plane::reuse_or_start;
use support::pods::{PodMarks, watch_pods};
use support::tasks::readout_refs;
use support::{
    Res, create_ns, delete_environments, env_num, install, purge_namespace, spawn_envbridge,
    stop_child, wait_gone,
};

const ENV: &str = "rn";
const KWOK_HOSTS: [&str; 2] = ["flp001", "flp002"];
const REAL_NODES: usize = 2;
/// Control ports of the tasks on each node (hostNetwork: one address per node), away from
/// the integration tests' 47100 + n.
const BASE_PORT: u16 = 47600;
const DISCOVERY_PORT: u16 = 47000;
const TIMEOUT: Duration = Duration::from_secs(600);
const STEPS: [&str; 6] = [
    "create -> STANDBY",
    "CONFIGURE",
    "START",
    "STOP",
    "RESET",
    "destroy",
];

fn main() -> Res {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> Res {
    let per_node = env_num("BENCH_TASKS_PER_NODE", 30);
    let (info, started_plane) = reuse_or_start(REAL_NODES, &KWOK_HOSTS).await?;
    let load0 = loadavg();
    let result = measure(&info, per_node).await;
    println!(
        "\nload average (1, 5, 15 min) at the start {load0}, at the end {}",
        loadavg()
    );
    if started_plane {
        println!("stopping the control plane this benchmark started");
        envbridge::dev::down()?;
    }
    let (real, kwok, mem, in_running) = result?;
    let tasks = REAL_NODES * per_node;
    println!("\n{tasks} tasks on {REAL_NODES} nodes, real vs kwok:");
    println!(
        "{:<18} {:>10} {:>10} {:>10}",
        "step", "real", "kwok", "real/kwok"
    );
    for (i, step) in STEPS.iter().enumerate() {
        println!(
            "{step:<18} {:>10} {:>10} {:>9.2}x",
            fmt(real[i]),
            fmt(kwok[i]),
            real[i].as_secs_f64() / kwok[i].as_secs_f64().max(1e-6)
        );
    }
    println!("\nreal nodes' memory, MiB (VmRSS; anon = RssAnon, without shared file pages):");
    for ((host, seen), running) in mem.iter().zip(&in_running) {
        seen.print_daemons(host, ticks_per_second());
        running.print_pods(&format!("{host} in RUNNING"));
    }
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let steps = |d: &[Duration; 6]| {
        let s = |d: Duration| (d.as_secs_f64() * 100.0).round() / 100.0;
        let ms = |d: Duration| d.as_millis() as u64;
        json!({"standby_s": s(d[0]), "configure_ms": ms(d[1]), "start_ms": ms(d[2]),
               "stop_ms": ms(d[3]), "reset_ms": ms(d[4]), "destroy_s": s(d[5])})
    };
    let sum = |f: Pick| r1(in_running.iter().map(|m| f(m).rss_mib()).sum());
    println!(
        "{}",
        json!({
            "bench": "realnode", "tasks": tasks, "real_nodes": REAL_NODES,
            "real": steps(&real), "kwok": steps(&kwok),
            "kubelet_rss_mib": mem.iter().map(|(_, s)| r1(s.peak.kubelet.rss_mib())).collect::<Vec<_>>(),
            "containerd_rss_mib": mem.iter().map(|(_, s)| r1(s.peak.containerd.rss_mib())).collect::<Vec<_>>(),
            "shim_rss_mib_total": sum(|m| m.shims),
            "containers_rss_mib_total": sum(Mem::containers),
        })
    );
    Ok(())
}

/// One process's memory out of a sample.
type Pick = fn(&Mem) -> Kib;

type Figures = ([Duration; 6], [Duration; 6], Vec<(String, Seen)>, Vec<Mem>);

/// Both sides, real first, with the real nodes' memory sampled throughout.
async fn measure(info: &ClusterInfo, per_node: usize) -> Res<Figures> {
    let admin = envbridge::dev::client_for(&info.kubeconfig).await?;
    install(&admin, &["readout"]).await?;
    let real: Vec<RealNodeState> = envbridge::dev::real_nodes()?
        .into_iter()
        .filter(RealNodeState::alive)
        .take(REAL_NODES)
        .collect();
    let real_hosts: Vec<String> = real.iter().map(|n| n.host.clone()).collect();
    let sampler = Sampler::start(
        real.iter().map(NodeProcs::of).collect(),
        Duration::from_millis(500),
    );
    let sides = async {
        let (real, in_running) =
            side(&admin, info, "real", &real_hosts, per_node, &sampler).await?;
        let kwok_hosts = KWOK_HOSTS.map(String::from);
        let (kwok, _) = side(&admin, info, "kwok", &kwok_hosts, per_node, &sampler).await?;
        Ok::<_, support::Error>((real, kwok, in_running))
    }
    .await;
    let mem = sampler.finish().await;
    let (real, kwok, in_running) = sides?;
    Ok((real, kwok, mem, in_running))
}

/// One side in a namespace of its own: its operator (and on kwok the sim-runner) as child
/// processes; whatever happens, the namespace is emptied and deleted and the children stop.
async fn side(
    admin: &Client,
    info: &ClusterInfo,
    kind: &str,
    hosts: &[String],
    per_node: usize,
    sampler: &Sampler,
) -> Res<([Duration; 6], Vec<Mem>)> {
    let ns = format!("bench-realnode-{}-{kind}", std::process::id());
    println!(
        "\n{kind}: {} tasks on {}",
        hosts.len() * per_node,
        hosts.join(", ")
    );
    create_ns(admin, &ns).await?;
    let mut children = Vec::new();
    let spawned = spawn_children(info, kind, &ns, &mut children);
    let result = match spawned {
        Ok(()) => tokio::select! {
            r = steps(admin, &ns, hosts, per_node, (kind == "real").then_some(sampler)) => r,
            _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
        },
        Err(e) => Err(e),
    };
    if let Err(e) = &result {
        println!(
            "{kind}: failed ({e}); cleaning up; logs: {}",
            log(&ns, "*").display()
        );
    }
    delete_environments(admin, &ns, Duration::from_secs(120)).await;
    for c in children.iter_mut().rev() {
        stop_child(c, Duration::from_secs(30)).await;
    }
    let purged = purge_namespace(admin, &ns, Duration::from_secs(300)).await;
    let r = result?;
    purged?;
    Ok(r)
}

/// The side's operator, and on kwok the sim-runner, into `children` (stopped by the caller).
fn spawn_children(
    info: &ClusterInfo,
    kind: &str,
    ns: &str,
    children: &mut Vec<tokio::process::Child>,
) -> Res {
    let port = DISCOVERY_PORT.to_string();
    let op = [
        "operator",
        "--metrics-listen=127.0.0.1:0",
        "--no-leader-election",
        "--namespace",
        ns,
        "--headless-discovery-port",
        &port,
    ];
    children.push(spawn_envbridge(
        &op,
        &info.kubeconfig,
        &log(ns, "operator"),
    )?);
    if kind == "kwok" {
        let kc = info.kubeconfig.to_string_lossy();
        let sr = [
            "dev",
            "sim-runner",
            "--kubeconfig",
            &kc,
            "--namespace",
            ns,
            "--in-process",
        ];
        children.push(spawn_envbridge(
            &sr,
            &info.kubeconfig,
            &log(ns, "sim-runner"),
        )?);
    }
    Ok(())
}

fn log(ns: &str, what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("envbridge-{ns}-{what}.log"))
}

/// Deploy, the four transitions, destroy; with the real nodes' memory sampled in RUNNING.
async fn steps(
    admin: &Client,
    ns: &str,
    hosts: &[String],
    per_node: usize,
    sampler: Option<&Sampler>,
) -> Res<([Duration; 6], Vec<Mem>)> {
    // The operator (and sim-runner) starting: not on the clock.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let refs = readout_refs(ENV, hosts, per_node, BASE_PORT);
    let want = format!("{0}/{0}", refs.len());
    let mut d = [Duration::ZERO; 6];
    let stop = CancellationToken::new();
    let _stop_watch = stop.clone().drop_guard();
    let pods = watch_pods(admin, ns, refs.len(), stop);
    let at = |t0: Instant, f: fn(&PodMarks) -> Option<Instant>| {
        let t = pods.lock().ok().as_deref().and_then(f);
        t.map_or("-".into(), |t| fmt(t.saturating_duration_since(t0)))
    };
    let t0 = Instant::now();
    envbridge::dev::fixtures::deploy(
        admin,
        ns,
        ENV,
        &refs,
        envbridge::plan::DEFAULT_TASK_SET_BUDGET,
        "envbridge-bench",
    )
    .await?;
    wait_env(admin, ns, |s| {
        s.state == Some(State::Standby) && s.ready.as_deref() == Some(want.as_str())
    })
    .await?;
    d[0] = t0.elapsed();
    println!(
        "  {}: {} (all pods created at {}, all Running at {})",
        STEPS[0],
        fmt(d[0]),
        at(t0, |m| m.created),
        at(t0, |m| m.all_running)
    );
    let mut in_running = Vec::new();
    let events = [Event::Configure, Event::Start, Event::Stop, Event::Reset];
    for (i, event) in events.into_iter().enumerate() {
        let id = format!("t{i}");
        let t = Instant::now();
        transition(admin, ns, &id, event).await?;
        let st = wait_env(admin, ns, |s| {
            s.transition
                .as_ref()
                .is_some_and(|t| t.id == id && t.phase != TransitionPhase::Running)
        })
        .await?;
        d[i + 1] = t.elapsed();
        let tr = st.transition.ok_or("no transition status")?;
        if tr.phase != TransitionPhase::Succeeded {
            return Err(format!("{event} failed: {}", tr.message).into());
        }
        println!("  {}: {}", STEPS[i + 1], fmt(d[i + 1]));
        if event == Event::Start
            && let Some(s) = sampler
        {
            in_running = s.now();
            image_build(s);
        }
    }
    let t = Instant::now();
    Api::<Environment>::namespaced(admin.clone(), ns)
        .delete(ENV, &DeleteParams::default())
        .await?;
    wait_gone(admin, ns, TIMEOUT).await?;
    d[5] = t.elapsed();
    println!(
        "  {}: {} (first pod deleting at {}, last pod gone at {})",
        STEPS[5],
        fmt(d[5]),
        at(t, |m| m.deleting),
        at(t, |m| m.gone)
    );
    Ok((d, in_running))
}

/// Says whether the task containers run this benchmark's envbridge build (the plane's
/// image is reused as it is) and its size.
fn image_build(s: &Sampler) {
    let Some(exe) = s.nodes().first().and_then(|n| n.task_exe()) else {
        return;
    };
    let hash = |p: &std::path::Path| std::fs::read(p).map(|b| blake3::hash(&b)).ok();
    let ours = hash(Path::new(env!("CARGO_BIN_EXE_envbridge")));
    let size = std::fs::metadata(&exe).map_or(0, |m| m.len());
    println!(
        "  the containers' envbridge: {:.1} MiB, {}",
        size as f64 / 1048576.0,
        if hash(&exe) == ours && ours.is_some() {
            "this benchmark's build"
        } else {
            "another build than this benchmark's (the plane's image as found)"
        }
    );
}

/// Asks the Environment for `event`, as the daemon does (spec.transition + desiredState).
async fn transition(admin: &Client, ns: &str, id: &str, event: Event) -> Res {
    let req = TransitionRequest {
        id: id.into(),
        event,
        arguments: BTreeMap::from([("run_number".into(), "1".into())]),
    };
    let patch = json!({"spec": {"transition": req, "desiredState": event.target()}});
    Api::<Environment>::namespaced(admin.clone(), ns)
        .patch(ENV, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The Environment's status once `cond` holds (a watch; at most TIMEOUT).
async fn wait_env(
    admin: &Client,
    ns: &str,
    cond: impl Fn(&EnvironmentStatus) -> bool,
) -> Res<EnvironmentStatus> {
    let api: Api<Environment> = Api::namespaced(admin.clone(), ns);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={ENV}"));
    let mut w = watcher(api, cfg).applied_objects().boxed();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let env = tokio::time::timeout_at(deadline, w.try_next())
            .await
            .map_err(|_| format!("environment {ns}/{ENV}: not there after {TIMEOUT:?}"))??
            .ok_or("environment watch ended")?;
        let st = env.status.unwrap_or_default();
        if cond(&st) {
            return Ok(st);
        }
    }
}

fn loadavg() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn fmt(d: Duration) -> String {
    if d >= Duration::from_secs(10) {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

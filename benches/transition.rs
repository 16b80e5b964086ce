//! Transition latency benchmark (printed figures, not a timed test): the demo's environment,
//! readout-dataflow on 4 simulated hosts (12 tasks), driven CONFIGURE -> START -> STOP ->
//! RESET for BENCH_CYCLES cycles (default 20) through the daemon's API, each call timed from
//! the client's request to its reply. The daemon, the operator and the task simulators run
//! as child processes, as in `envbridge demo`.
//!
//! In the same run, the floor: the same transitions with the same arguments sent straight to
//! the 12 simulators at once (the operator stopped), each timed until the last one answers.
//!
//! Where the time goes, hop by hop, from the timestamps the daemon and the operator log
//! anyway (target `envbridge::hops`, debug; JSON lines): the daemon's write, the operator
//! seeing the transition, its Task writes, the first and last task call, the last answer,
//! the last Task status written, the Environment's outcome written, the daemon seeing it;
//! then the reply. Each hop as the median, over the cycles, of its offset from the client's
//! request.
//!
//! The last line is one JSON object: `{"bench":"transition","tasks":12,"cycles":N,
//! "start_p50_ms":..,"start_p99_ms":..,"floor_p50_ms":..,"floor_p99_ms":..,...}`.
//!
//! Run: `cargo bench --bench transition` (starts or reuses the local control plane).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use envbridge::control::TaskEndpoint;
use envbridge::crd::Task;
use envbridge::server::pb;
use envbridge::state::{Event, State};
use kube::{Api, Client};

mod support;

use support::stack::{Extra, Stack};
use support::{Res, create_ns, delete_ns, env_num, ms, pct, stop_child};

/// The children's log filter: info, and the hops at debug.
const LOG: &str = "info,kube=warn,tower=warn,h2=warn,hyper=warn,envbridge::hops=debug";

const HOSTS: [&str; 4] = ["flp001", "flp002", "flp003", "flp004"];
const EVENTS: [&str; 4] = ["CONFIGURE", "START", "STOP", "RESET"];
/// The hops in the order a transition passes them (the daemon's and the operator's logs).
const HOPS: [&str; 8] = [
    "daemon_written",
    "operator_seen",
    "tasks_written",
    "task_call",
    "task_answered",
    "task_status_written",
    "outcome_written",
    "daemon_seen",
];

fn main() -> Res {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run())
}

/// One timed call: the transition's id, when it was asked (wall clock) and how long to the
/// reply.
struct Call {
    id: String,
    event: &'static str,
    asked: SystemTime,
    took: Duration,
}

async fn run() -> Res {
    let cycles = env_num("BENCH_CYCLES", 20);
    let (info, started) = support::plane::reuse_or_start(0, &HOSTS).await?;
    let admin = envbridge::dev::client_for(&info.kubeconfig).await?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    envbridge::install::crds(&admin).await?;
    envbridge::install::task_templates(&admin, &root.join("task-templates")).await?;
    let ns = format!("bench-transition-{}", std::process::id());
    create_ns(&admin, &ns).await?;
    let dir = std::env::temp_dir().join(&ns);
    std::fs::create_dir_all(&dir)?;
    let result = measure(&admin, &info.kubeconfig, &ns, &dir, cycles).await;
    delete_ns(&admin, &ns).await;
    if started {
        println!(
            "(the control plane was started by this benchmark; `envbridge dev down` stops it)"
        );
    }
    result
}

async fn measure(admin: &Client, kubeconfig: &Path, ns: &str, dir: &Path, cycles: usize) -> Res {
    let mut stack = Stack::start(kubeconfig, ns, dir, LOG, Extra::default())?;
    let mut api = stack.client().await?;
    let hosts = serde_json::to_string(&HOSTS)?;
    let created = api
        .create_environment(pb::CreateEnvironmentRequest {
            workflow: "readout-dataflow".into(),
            variables: [("hosts".to_string(), hosts)].into(),
            env_id: "bench".into(),
            wait: true,
            timeout_seconds: 300,
            ..Default::default()
        })
        .await?
        .into_inner();
    if created.outcome != "reached" {
        return Err(format!("create: {} {}", created.outcome, created.message).into());
    }
    println!(
        "transition benchmark: readout-dataflow, {} tasks on {} hosts, {cycles} cycles of CONFIGURE -> START -> STOP -> RESET",
        created.tasks,
        HOSTS.len()
    );
    let mut calls = Vec::new();
    for c in 0..cycles {
        for event in EVENTS {
            let mut arguments = HashMap::new();
            if event == "START" {
                arguments.insert("run_number".to_string(), (1000 + c).to_string());
            }
            let asked = SystemTime::now();
            let t0 = Instant::now();
            let r = api
                .transition(pb::TransitionRequest {
                    id: created.id.clone(),
                    event: event.into(),
                    arguments,
                    wait: true,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let took = t0.elapsed();
            if !r.ok {
                return Err(format!("{event}: {} {}", r.outcome, r.message).into());
            }
            calls.push(Call {
                id: r.transition_id,
                event,
                asked,
                took,
            });
        }
    }
    // The floor: the same transitions straight to the simulators, the operator stopped so
    // that it neither follows nor answers them.
    let tasks: Vec<Task> = Api::<Task>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await?
        .items;
    stop_child(&mut stack.operator, Duration::from_secs(10)).await;
    let floor = floor(&tasks, cycles).await?;
    let _ = api
        .destroy_environment(pb::DestroyEnvironmentRequest {
            id: created.id.clone(),
            wait: false,
            ..Default::default()
        })
        .await;
    let hops = hop_times(&[&stack.daemon_log, &stack.operator_log])?;
    stack.stop().await;
    report(created.tasks, cycles, &calls, &floor, &hops);
    Ok(())
}

/// The floor's figures: per event, how long each round of 12 concurrent calls took.
async fn floor(tasks: &[Task], cycles: usize) -> Res<BTreeMap<&'static str, Vec<Duration>>> {
    // Loopback only, as the operator's own client on the local plane.
    let control = envbridge::control::ControlClient::new(false);
    let mut eps = Vec::new();
    for t in tasks {
        let Some(ip) = t.status.as_ref().and_then(|s| s.pod_ip.as_deref()) else {
            continue;
        };
        if !t.spec.task.control_mode.has_protocol() {
            continue;
        }
        let addr = std::net::SocketAddr::new(ip.parse()?, t.spec.task.control_port);
        eps.push((
            TaskEndpoint::new(addr, t.spec.task.control_mode),
            &t.spec.task,
        ));
    }
    let mut out: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    let deadline = Duration::from_secs(30);
    for c in 0..cycles {
        for (event, from) in [
            (Event::Configure, State::Standby),
            (Event::Start, State::Configured),
            (Event::Stop, State::Running),
            (Event::Reset, State::Configured),
        ] {
            let mut given = BTreeMap::new();
            if event == Event::Start {
                given.insert("run_number".to_string(), (2000 + c).to_string());
            }
            let t0 = Instant::now();
            let answers = futures::future::join_all(eps.iter().map(|(ep, r)| {
                let args = envbridge::operator::transition_args::arguments(event, r, &given);
                let control = control.clone();
                async move { control.transition(ep, from, event, &args, deadline).await }
            }))
            .await;
            let took = t0.elapsed();
            for a in answers {
                let reached = a?;
                if reached != event.target() {
                    return Err(format!("floor {event}: a task reached {reached}").into());
                }
            }
            let name = EVENTS[[Event::Configure, Event::Start, Event::Stop, Event::Reset]
                .iter()
                .position(|e| *e == event)
                .unwrap_or(0)];
            out.entry(name).or_default().push(took);
        }
    }
    Ok(out)
}

/// Per transition id, per hop: the first and the last time it was logged.
type Hops = HashMap<String, HashMap<String, (SystemTime, SystemTime)>>;

fn hop_times(logs: &[&PathBuf]) -> Res<Hops> {
    let mut out: Hops = HashMap::new();
    for log in logs {
        for line in std::fs::read_to_string(log)?.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v["target"] != "envbridge::hops" {
                continue;
            }
            let (Some(hop), Some(id), Some(ts)) = (
                v["fields"]["hop"].as_str(),
                v["fields"]["transition"].as_str(),
                v["timestamp"].as_str(),
            ) else {
                continue;
            };
            let Ok(t) = ts.parse::<jiff::Timestamp>() else {
                continue;
            };
            let t = SystemTime::from(t);
            let e = out
                .entry(id.to_string())
                .or_default()
                .entry(hop.to_string())
                .or_insert((t, t));
            e.0 = e.0.min(t);
            e.1 = e.1.max(t);
        }
    }
    Ok(out)
}

fn report(
    tasks: u32,
    cycles: usize,
    calls: &[Call],
    floor: &BTreeMap<&'static str, Vec<Duration>>,
    hops: &Hops,
) {
    let mut json = serde_json::Map::new();
    json.insert("bench".into(), "transition".into());
    json.insert("tasks".into(), tasks.into());
    json.insert("cycles".into(), cycles.into());
    println!("\nclient call to reply, ms (p50 / p99 / max), envbridge against the floor:");
    for event in EVENTS {
        let took: Vec<Duration> = calls
            .iter()
            .filter(|c| c.event == event)
            .map(|c| c.took)
            .collect();
        let f = floor.get(event).cloned().unwrap_or_default();
        let (p50, p99) = (pct(&took, 50.0), pct(&took, 99.0));
        let (f50, f99) = (pct(&f, 50.0), pct(&f, 99.0));
        println!(
            "  {event:<9} envbridge {:7.1} / {:7.1} / {:7.1}   floor {:6.1} / {:6.1}   ratio p50 {:.1}x",
            ms(p50),
            ms(p99),
            ms(pct(&took, 100.0)),
            ms(f50),
            ms(f99),
            ms(p50) / ms(f50).max(0.001),
        );
        let key = event.to_lowercase();
        json.insert(format!("{key}_p50_ms"), round(ms(p50)).into());
        json.insert(format!("{key}_p99_ms"), round(ms(p99)).into());
        if event == "START" {
            json.insert("floor_p50_ms".into(), round(ms(f50)).into());
            json.insert("floor_p99_ms".into(), round(ms(f99)).into());
        }
    }
    println!(
        "\nwhere a transition's time goes, ms from the client's request (median over the cycles; first / last where several tasks log it):"
    );
    print!("  {:<9}", "");
    for h in HOPS {
        print!(" {h:>19}");
    }
    println!(" {:>8}", "reply");
    for event in EVENTS {
        print!("  {event:<9}");
        let mine: Vec<&Call> = calls.iter().filter(|c| c.event == event).collect();
        for h in HOPS {
            let offsets = |last: bool| -> Vec<Duration> {
                mine.iter()
                    .filter_map(|c| {
                        let (first, end) = hops.get(&c.id)?.get(h)?;
                        let t = if last { end } else { first };
                        t.duration_since(c.asked).ok()
                    })
                    .collect()
            };
            let (first, last) = (offsets(false), offsets(true));
            if first.is_empty() {
                print!(" {:>19}", "-");
            } else if h.starts_with("task_") {
                print!(
                    " {:>19}",
                    format!("{:.1}/{:.1}", ms(pct(&first, 50.0)), ms(pct(&last, 50.0)))
                );
            } else {
                print!(" {:>19.1}", ms(pct(&first, 50.0)));
            }
        }
        let took: Vec<Duration> = mine.iter().map(|c| c.took).collect();
        println!(" {:>8.1}", ms(pct(&took, 50.0)));
    }
    println!("{}", serde_json::Value::Object(json));
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

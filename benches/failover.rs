//! Operator failover at size (printed figures, not a timed test): an Environment of N tasks
//! on M simulated nodes (default 2,000 on 250) RUNNING under a leading operator "a", with a
//! standby "b" (both child processes, as deployed, electing on one Lease of BENCH_LEASE_S
//! seconds, default 15, the operator's own default). "a" is SIGKILLed (its Lease not
//! released); printed: the time from its death to "b" leading and to "b" following every
//! task again (its metrics: `envbridge_operator_leader`, `envbridge_operator_live_followers`),
//! what "b" wrote meanwhile, and whether any task was disturbed (a pod re-created, a Task's
//! transition, state or last outcome changed). Then "b" drives STOP and the teardown.
//!
//! The functional side (a failover disturbs no task) is the integration test
//! `operator::failover`; this measures it at size. The last line is one JSON object:
//! `{"bench":"failover","tasks":N,"lease_s":L,"leading_s":..,"following_s":..,"disturbed":D,
//! "standby_writes":W}`.
//!
//! Run: `cargo bench --bench failover` (starts or reuses the local control plane; grows it to
//! BENCH_NODES nodes). BENCH_NODES, BENCH_TASKS_PER_NODE, BENCH_LEASE_S adjust it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use envbridge::crd::Environment;
use envbridge::state::Event;
use kube::api::DeleteParams;
use kube::{Api, Client};
use serde_json::json;
use tokio::process::Child;

mod support;

use envbridge::dev::fixtures::failover_view;
use support::drive::{TIMEOUT, deploy_standby, transition_succeeded};
use support::sims::Sims;
use support::tasks::{CLASSES, task_refs};
use support::{Res, create_ns, delete_ns, env_num, install, stop_child};

const DISCOVERY_PORT: u16 = 47000;
const ENV: &str = "bfo";

fn main() -> Res {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> Res {
    let nodes = env_num("BENCH_NODES", 250);
    let per_node = env_num("BENCH_TASKS_PER_NODE", 8);
    let lease_s = env_num("BENCH_LEASE_S", 15);
    let info = envbridge::dev::ensure_up(nodes as u32).await?;
    let admin = envbridge::dev::client_for(&info.kubeconfig).await?;
    install(&admin, &CLASSES.map(|(c, _)| c)).await?;
    let ns = format!("bench-failover-{}", std::process::id());
    create_ns(&admin, &ns).await?;
    let sims = Sims::start(admin.clone(), ns.clone(), |_, _| {});
    let result = measure(&admin, &info.kubeconfig, &ns, nodes, per_node, lease_s).await;
    sims.stop().await;
    delete_ns(&admin, &ns).await;
    result
}

/// An operator replica: its process and its metrics address.
struct Replica {
    child: Child,
    metrics: String,
}

impl Replica {
    fn start(kubeconfig: &Path, ns: &str, identity: &str, lease_s: usize) -> Res<Replica> {
        let metrics = support::free_loopback()?;
        let log = std::env::temp_dir().join(format!("{ns}-{identity}.log"));
        let log = std::fs::File::create(log)?;
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
            .args(["operator", "--namespace", ns, "--identity", identity])
            .args(["--lease-name", ns, "--lease-namespace", ns])
            .args(["--lease-duration", &lease_s.to_string()])
            .args(["--metrics-listen", &metrics])
            .args(["--headless-discovery-port", &DISCOVERY_PORT.to_string()])
            .env("KUBECONFIG", kubeconfig)
            // The filter it runs with when deployed (no RUST_LOG: info, kube and HTTP at warn).
            .env_remove("RUST_LOG")
            .stderr(log.try_clone()?)
            .stdout(log)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Replica { child, metrics })
    }

    /// Its metrics' text (empty while its listener is not up).
    async fn scrape(&self) -> String {
        support::http_get(&self.metrics, "/metrics").await
    }

    async fn gauge(&self, name: &str) -> u64 {
        value(&self.scrape().await, name).unwrap_or(0)
    }
}

/// The value of the unlabelled sample `name` in a metrics text.
fn value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// The write requests (not get, list, watch) in a metrics text, by `verb kind`.
fn writes(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("envbridge_operator_apiserver_requests_total{") else {
            continue;
        };
        let Some((labels, n)) = rest.split_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix("=\""))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        let (Some(verb), Some(kind)) = (label("verb"), label("kind")) else {
            continue;
        };
        if ["get", "list", "watch"].contains(&verb.as_str()) {
            continue;
        }
        let n = n.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *out.entry(format!("{verb} {kind}")).or_default() += n;
    }
    out
}

/// Polls `cond` every 50 ms for at most [`TIMEOUT`]; the time it took.
async fn until<F: std::future::Future<Output = bool>>(
    from: Instant,
    what: &str,
    mut cond: impl FnMut() -> F,
) -> Res<Duration> {
    loop {
        if cond().await {
            return Ok(from.elapsed());
        }
        if from.elapsed() > TIMEOUT {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn measure(
    admin: &Client,
    kubeconfig: &Path,
    ns: &str,
    nodes: usize,
    per_node: usize,
    lease_s: usize,
) -> Res {
    let mut a = Replica::start(kubeconfig, ns, "a", lease_s)?;
    let t0 = Instant::now();
    until(t0, "a to lead", || async {
        a.gauge("envbridge_operator_leader").await == 1
    })
    .await?;
    let mut b = Replica::start(kubeconfig, ns, "b", lease_s)?;
    until(t0, "b's metrics", || async { !b.scrape().await.is_empty() }).await?;

    let refs = task_refs(ENV, nodes, per_node);
    let total = refs.len();
    println!("failover benchmark: {total} tasks on {nodes} nodes, Lease {lease_s} s");
    let t0 = Instant::now();
    deploy_standby(admin, ns, ENV, &refs).await?;
    transition_succeeded(admin, ns, ENV, "c1", Event::Configure).await?;
    transition_succeeded(admin, ns, ENV, "s1", Event::Start).await?;
    until(t0, "a to follow every task", || async {
        a.gauge("envbridge_operator_live_followers").await == total as u64
    })
    .await?;
    println!(
        "RUNNING under a, followed live: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    if b.gauge("envbridge_operator_leader").await != 0 {
        return Err("the standby leads already".into());
    }
    let before = failover_view(admin, ns).await?;
    let writes_before = writes(&b.scrape().await);

    a.child.start_kill()?;
    let died = Instant::now();
    a.child.wait().await?;
    let leading = until(died, "b to lead", || async {
        b.gauge("envbridge_operator_leader").await == 1
    })
    .await?;
    let following = until(died, "b to follow every task", || async {
        b.gauge("envbridge_operator_live_followers").await == total as u64
    })
    .await?;
    println!(
        "a SIGKILLed: b leading after {:.2} s, following every task after {:.2} s",
        leading.as_secs_f64(),
        following.as_secs_f64()
    );
    // Time for anything the new leader would do of its own accord.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = failover_view(admin, ns).await?;
    let disturbed: Vec<&String> = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(v))
        .map(|(k, _)| k)
        .chain(after.keys().filter(|k| !before.contains_key(*k)))
        .collect();
    let mut standby_writes = writes(&b.scrape().await);
    for (k, n) in &writes_before {
        if let Some(m) = standby_writes.get_mut(k) {
            *m = m.saturating_sub(*n);
        }
    }
    standby_writes.retain(|_, n| *n > 0);
    println!(
        "disturbed by the failover: {} of {} pods and Tasks{}; b's writes since it started leading: {standby_writes:?}",
        disturbed.len(),
        before.len(),
        if disturbed.is_empty() {
            String::new()
        } else {
            format!(" (first: {:?})", &disturbed[..disturbed.len().min(5)])
        }
    );

    // b leads for real: the run goes on under it.
    let t1 = Instant::now();
    transition_succeeded(admin, ns, ENV, "t1", Event::Stop).await?;
    println!("STOP under b: {:.2} s", t1.elapsed().as_secs_f64());
    Api::<Environment>::namespaced(admin.clone(), ns)
        .delete(ENV, &DeleteParams::default())
        .await?;
    support::wait_gone(admin, ns, TIMEOUT).await?;
    stop_child(&mut b.child, Duration::from_secs(15)).await;

    println!(
        "{}",
        json!({
            "bench": "failover", "tasks": total, "nodes": nodes, "lease_s": lease_s,
            "leading_s": (leading.as_secs_f64() * 100.0).round() / 100.0,
            "following_s": (following.as_secs_f64() * 100.0).round() / 100.0,
            "disturbed": disturbed.len(),
            "standby_writes": standby_writes.values().sum::<u64>(),
        })
    );
    Ok(())
}

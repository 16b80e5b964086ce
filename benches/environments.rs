//! Many environments at once (printed figures, not a timed test): BENCH_ENVS environments
//! (default 20) of readout-dataflow on the same BENCH_HOSTS simulated hosts (default 34:
//! 102 tasks each), one daemon, one operator, the task simulators, as in `envbridge demo`.
//!
//! 1. Alone: one environment driven CONFIGURE -> START -> STOP -> RESET for
//!    BENCH_ALONE_CYCLES cycles (default 20) while the others stand by.
//! 2. Together: every environment sends the same event at the same moment, and the next once
//!    all have answered, for BENCH_CYCLES cycles (default 5).
//! 3. One hangs: one task of the first environment hangs its START call (the simulators'
//!    fault file, `hang-on=START`) until the operator's control deadline (BENCH_HANG_S,
//!    default 10 s); every environment STARTs together once more. The others' STARTs are timed
//!    against the same event in 2; the hung one's outcome and time are printed.
//!
//! Each call is timed from the client's request to its reply (`wait: true`). Per event and
//! phase: p50 / p99 (nearest rank) / max. The last line is one JSON object:
//! `{"bench":"environments","envs":N,"tasks_per_env":T,...}`.
//!
//! Run: `cargo bench --bench environments` (starts or reuses the local control plane).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use envbridge::crd::labels;
use envbridge::server::pb;
use envbridge::server::pb::env_bridge_client::EnvBridgeClient;
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, ResourceExt};
use tonic::transport::Channel;

mod support;

use support::stack::{Extra, Stack};
use support::{Res, create_ns, env_num, ms, pct, purge_namespace};

const LOG: &str = "info,kube=warn,tower=warn,h2=warn,hyper=warn";
const EVENTS: [&str; 4] = ["CONFIGURE", "START", "STOP", "RESET"];

fn main() -> Res {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run())
}

struct Params {
    envs: usize,
    hosts: Vec<String>,
    alone_cycles: usize,
    cycles: usize,
    hang_s: usize,
}

/// One environment as the daemon created it.
struct Env {
    id: String,
    namespace: String,
    name: String,
}

/// Per event, the call times.
type Times = BTreeMap<&'static str, Vec<Duration>>;

async fn run() -> Res {
    let p = Params {
        envs: env_num("BENCH_ENVS", 20).max(2),
        hosts: (1..=env_num("BENCH_HOSTS", 34))
            .map(|i| format!("flp{i:03}"))
            .collect(),
        alone_cycles: env_num("BENCH_ALONE_CYCLES", 20),
        cycles: env_num("BENCH_CYCLES", 5),
        hang_s: env_num("BENCH_HANG_S", 10),
    };
    let host_refs: Vec<&str> = p.hosts.iter().map(String::as_str).collect();
    let (info, started) = support::plane::reuse_or_start(0, &host_refs).await?;
    let admin = envbridge::dev::client_for(&info.kubeconfig).await?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    envbridge::install::crds(&admin).await?;
    envbridge::install::task_templates(&admin, &root.join("task-templates")).await?;
    let ns = format!("bench-environments-{}", std::process::id());
    create_ns(&admin, &ns).await?;
    let dir = std::env::temp_dir().join(&ns);
    let faults = dir.join("faults");
    std::fs::create_dir_all(&faults)?;
    let faults_arg = faults.display().to_string();
    let hang = p.hang_s.to_string();
    let stack = Stack::start(
        &info.kubeconfig,
        &ns,
        &dir,
        LOG,
        Extra {
            sims: &["--fault-dir", &faults_arg],
            operator: &["--control-timeout-seconds", &hang],
        },
    )?;
    let result = measure(&admin, &stack, &p, &faults).await;
    stack.stop().await;
    if let Err(e) = purge_namespace(&admin, &ns, Duration::from_secs(300)).await {
        println!("(namespace {ns} not purged: {e})");
    }
    if started {
        println!(
            "(the control plane was started by this benchmark; `envbridge dev down` stops it)"
        );
    }
    result
}

async fn measure(admin: &Client, stack: &Stack, p: &Params, faults: &Path) -> Res {
    let api = stack.client().await?;
    let hosts = serde_json::to_string(&p.hosts)?;
    let t0 = Instant::now();
    let created = join_all((0..p.envs).map(|i| create(api.clone(), &hosts, i))).await;
    let envs: Vec<Env> = created.into_iter().collect::<Res<_>>()?;
    let tasks_per_env = p.hosts.len() * 3;
    println!(
        "environments benchmark: {} environments of readout-dataflow on the same {} hosts ({} tasks each, {} in all), created and STANDBY in {:.1} s",
        envs.len(),
        p.hosts.len(),
        tasks_per_env,
        envs.len() * tasks_per_env,
        t0.elapsed().as_secs_f64()
    );

    let mut alone = Times::new();
    for c in 0..p.alone_cycles {
        for event in EVENTS {
            let took = transition(api.clone(), &envs[0], event, c).await?;
            alone.entry(event).or_default().push(took.1);
        }
    }
    print_phase("alone (1 environment)", &alone);

    let mut together = Times::new();
    for c in 0..p.cycles {
        for event in EVENTS {
            for r in all(&api, &envs, event, c).await {
                let (outcome, took) = r?;
                if outcome != "reached" {
                    return Err(format!("{event} together: {outcome}").into());
                }
                together.entry(event).or_default().push(took);
            }
        }
    }
    print_phase(
        &format!("together ({} environments)", envs.len()),
        &together,
    );

    // One task of the first environment hangs its START call.
    let pod = first_pod(admin, &envs[0]).await?;
    let file = faults.join(format!("{}_{pod}.faults", envs[0].namespace));
    std::fs::write(&file, "hang-on=START\n")?;
    let configured = all(&api, &envs, "CONFIGURE", p.cycles).await;
    for r in configured {
        let (outcome, _) = r?;
        if outcome != "reached" {
            return Err(format!("CONFIGURE before the hang: {outcome}").into());
        }
    }
    let mut started = all(&api, &envs, "START", p.cycles).await.into_iter();
    let (hung_outcome, hung_took) = started.next().ok_or("no environment")??;
    let mut others = Vec::new();
    for r in started {
        let (outcome, took) = r?;
        if outcome != "reached" {
            return Err(format!("START beside the hung environment: {outcome}").into());
        }
        others.push(took);
    }
    std::fs::remove_file(&file)?;
    println!(
        "one task of {} hangs START (control deadline {} s): that environment {hung_outcome} after {:.0} ms; the other {}: START p50 {:.1} / p99 {:.1} / max {:.1} ms (together without a hang: p50 {:.1} / p99 {:.1} ms)",
        envs[0].name,
        p.hang_s,
        ms(hung_took),
        others.len(),
        ms(pct(&others, 50.0)),
        ms(pct(&others, 99.0)),
        ms(pct(&others, 100.0)),
        ms(pct(&together["START"], 50.0)),
        ms(pct(&together["START"], 99.0)),
    );

    let t0 = Instant::now();
    for r in join_all(envs.iter().map(|e| destroy(api.clone(), e))).await {
        r?;
    }
    println!("all destroyed in {:.1} s", t0.elapsed().as_secs_f64());

    let start = |t: &Times, q| ms(pct(&t["START"], q));
    println!(
        "{}",
        serde_json::json!({
            "bench": "environments",
            "envs": envs.len(),
            "tasks_per_env": tasks_per_env,
            "alone_cycles": p.alone_cycles,
            "cycles": p.cycles,
            "alone_start_p50_ms": round(start(&alone, 50.0)),
            "alone_start_p99_ms": round(start(&alone, 99.0)),
            "together_start_p50_ms": round(start(&together, 50.0)),
            "together_start_p99_ms": round(start(&together, 99.0)),
            "beside_hung_start_p50_ms": round(ms(pct(&others, 50.0))),
            "beside_hung_start_p99_ms": round(ms(pct(&others, 99.0))),
            "hung_env_outcome": hung_outcome,
            "hung_env_ms": round(ms(hung_took)),
            "hang_s": p.hang_s,
        })
    );
    Ok(())
}

fn round(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn print_phase(name: &str, t: &Times) {
    println!("{name}: per event p50 / p99 / max, ms (n calls)");
    for event in EVENTS {
        let v = &t[event];
        println!(
            "  {event:<9} {:>8.1} / {:>8.1} / {:>8.1}  (n {})",
            ms(pct(v, 50.0)),
            ms(pct(v, 99.0)),
            ms(pct(v, 100.0)),
            v.len()
        );
    }
}

async fn create(mut api: EnvBridgeClient<Channel>, hosts: &str, i: usize) -> Res<Env> {
    let r = api
        .create_environment(pb::CreateEnvironmentRequest {
            workflow: "readout-dataflow".into(),
            variables: [("hosts".to_string(), hosts.to_string())].into(),
            env_id: format!("bench{i:02}"),
            wait: true,
            timeout_seconds: 900,
            ..Default::default()
        })
        .await?
        .into_inner();
    if r.outcome != "reached" {
        return Err(format!("create bench{i:02}: {} {}", r.outcome, r.message).into());
    }
    Ok(Env {
        id: r.id,
        namespace: r.namespace,
        name: r.name,
    })
}

/// Every environment sends `event` at once; each one's outcome and time, in `envs`' order.
async fn all(
    api: &EnvBridgeClient<Channel>,
    envs: &[Env],
    event: &'static str,
    cycle: usize,
) -> Vec<Res<(String, Duration)>> {
    join_all(
        envs.iter()
            .map(|e| transition(api.clone(), e, event, cycle)),
    )
    .await
}

/// One transition, waited for: its outcome and the time from request to reply.
async fn transition(
    mut api: EnvBridgeClient<Channel>,
    env: &Env,
    event: &'static str,
    cycle: usize,
) -> Res<(String, Duration)> {
    let mut arguments = HashMap::new();
    if event == "START" {
        arguments.insert("run_number".to_string(), (1000 + cycle).to_string());
    }
    let t0 = Instant::now();
    let r = api
        .transition(pb::TransitionRequest {
            id: env.id.clone(),
            event: event.into(),
            arguments,
            wait: true,
            timeout_seconds: 300,
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok((r.outcome, t0.elapsed()))
}

async fn destroy(mut api: EnvBridgeClient<Channel>, env: &Env) -> Res {
    let r = api
        .destroy_environment(pb::DestroyEnvironmentRequest {
            id: env.id.clone(),
            wait: true,
            timeout_seconds: 600,
        })
        .await?
        .into_inner();
    if !r.gone {
        return Err(format!("destroy {}: {}", env.name, r.message).into());
    }
    Ok(())
}

/// The name of one of `env`'s pods (a readout, in direct control mode, if there is one).
async fn first_pod(admin: &Client, env: &Env) -> Res<String> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &env.namespace);
    let mut mine: Vec<String> = pods
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|p| p.labels().get(labels::ENVIRONMENT) == Some(&env.name))
        .map(|p| p.name_any())
        .collect();
    mine.sort();
    mine.iter()
        .find(|n| n.contains("readout"))
        .or(mine.first())
        .cloned()
        .ok_or_else(|| format!("no pod of {}", env.name).into())
}

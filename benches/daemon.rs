//! Daemon benchmark (printed figures, not a timed test): N tasks on M simulated nodes (default
//! 2,000 on 250), create -> all STANDBY, then CONFIGURE -> all CONFIGURED, through the daemon.
//!
//! The daemon runs as a child process (this binary re-executed with BENCH_ROLE=daemon: the real
//! Bridge, watches, roster and gRPC API, with a renderer that generates the N task references
//! so that no workflow file is needed). The cluster side is a fast simulator in this process:
//! it creates the Task objects of the Environment and writes their status, concurrently.
//!
//! In the same run, the raw floor: a bare client applying the same TaskSets and Environment,
//! creating the same Tasks, writing STANDBY, then the transition and CONFIGURED, with the same
//! concurrency. Figures: wall time per phase, apiserver requests (daemon's own, counted by its
//! client), daemon peak RSS (VmHWM of the child), roster bytes per task, ratio to the floor.
//!
//! Run: `cargo bench --bench daemon` (starts or reuses the local control plane).
//! BENCH_NODES, BENCH_TASKS_PER_NODE, BENCH_CONCURRENCY adjust it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envbridge::bridge::{Bridge, BridgeConfig, CreateSpec, Metrics, NamespaceMode, TakenPorts};
use envbridge::crd::{
    Environment, Task, TaskSet, TaskSpec, TaskTemplate, TaskTemplateSpec, labels,
};
use envbridge::objects::{Objects, pack};
use envbridge::plan::{ControlMode, EnvVar, TaskRef};
use envbridge::server::pb;
use envbridge::state::State;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use serde_json::json;

mod support;

use support::{Res, create_ns, env_num, peak_rss_kib};

const TEMPLATE: &str = "bench-daemon-task";

fn main() -> Res {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if std::env::var("BENCH_ROLE").as_deref() == Ok("daemon") {
        return rt.block_on(daemon_role());
    }
    rt.block_on(run())
}

/// N task references on M nodes (ports unique per node).
fn task_refs(env: &str, nodes: usize, per_node: usize) -> Vec<TaskRef> {
    let mut v = Vec::with_capacity(nodes * per_node);
    for n in 1..=nodes {
        let node = format!("flp{n:03}");
        for i in 0..per_node {
            let port = 47100 + i as u16;
            v.push(TaskRef {
                name: format!("{env}-{node}-t{i}"),
                id: format!("{node}-t{i}"),
                path: format!("bench.host-{node}.t{i}"),
                class: format!("class{}", i % 3),
                node: node.clone(),
                template: TEMPLATE.into(),
                control_mode: ControlMode::Direct,
                control_port: port,
                critical: true,
                command: "/opt/o2/bin/task".into(),
                env: vec![
                    EnvVar {
                        name: "O2_ROLE".into(),
                        value: node.as_str().into(),
                    },
                    EnvVar {
                        name: "OCC_CONTROL_PORT".into(),
                        value: port.to_string().into(),
                    },
                ],
                args: vec![
                    "--id".into(),
                    format!("{node}-t{i}").into(),
                    "--severity".into(),
                    "info".into(),
                ],
                ..TaskRef::default()
            });
        }
    }
    v
}

fn objects(env: &str, nodes: usize, per_node: usize) -> Objects {
    pack(env, env, "bench", task_refs(env, nodes, per_node))
}

/// The child: a daemon with the generating renderer, printing its gRPC and HTTP addresses.
async fn daemon_role() -> Res {
    let ns = std::env::var("BENCH_NS")?;
    let (nodes, per_node) = (
        env_num("BENCH_NODES", 250),
        env_num("BENCH_TASKS_PER_NODE", 8),
    );
    let metrics = Metrics::new();
    let client = envbridge::launch::client::counted(
        kube::Config::infer().await?,
        metrics.apiserver_requests.clone(),
        metrics.apiserver_throttled.clone(),
    )?;
    let cfg = BridgeConfig {
        namespaces: NamespaceMode::Fixed {
            namespace: ns.clone(),
        },
        watch_namespace: Some(ns),
        ..BridgeConfig::default()
    };
    let renderer =
        Arc::new(move |_: &CreateSpec, id: &str, _: &TakenPorts| Ok(objects(id, nodes, per_node)));
    let bridge = Bridge::new(client, cfg, metrics, renderer);
    let stop = tokio_util::sync::CancellationToken::new();
    {
        let (b, s) = (bridge.clone(), stop.clone());
        tokio::spawn(async move { b.run_watches(s).await });
    }
    bridge.wait_synced(Duration::from_secs(60)).await;
    let scfg = envbridge::server::ServerConfig {
        grpc_addr: "127.0.0.1:0".parse()?,
        http_addr: "127.0.0.1:0".parse()?,
        insecure: true,
        ..Default::default()
    };
    let (bound, handle) = envbridge::server::serve(bridge, scfg, stop).await?;
    println!("{} {}", bound.grpc, bound.http);
    handle.await?;
    Ok(())
}

async fn run() -> Res {
    let nodes = env_num("BENCH_NODES", 250);
    let per_node = env_num("BENCH_TASKS_PER_NODE", 8);
    let conc = env_num("BENCH_CONCURRENCY", 64);
    let total = nodes * per_node;
    println!("daemon benchmark: {total} tasks on {nodes} nodes, concurrency {conc}");
    let info = envbridge::dev::ensure_up(nodes as u32).await?;
    let admin = envbridge::dev::client_for(&info.kubeconfig).await?;
    install(&admin).await?;
    let suffix = std::process::id();

    // ---- raw floor ----
    let floor_ns = format!("bench-dfloor-{suffix}");
    create_ns(&admin, &floor_ns).await?;
    let floor_count = Counter::default();
    let kcfg = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&info.kubeconfig)?,
        &Default::default(),
    )
    .await?;
    let floor = envbridge::launch::client::counted(kcfg, floor_count.clone(), Default::default())?;
    let mut objs = objects("bf", nodes, per_node);
    objs.place(&floor_ns, None);
    let t = Instant::now();
    let pp = PatchParams::apply("bench-floor").force();
    let sets: Api<TaskSet> = Api::namespaced(floor.clone(), &floor_ns);
    for ts in &objs.task_sets {
        sets.patch(&ts.name_any(), &pp, &Patch::Apply(ts)).await?;
    }
    let envs: Api<Environment> = Api::namespaced(floor.clone(), &floor_ns);
    let env = envs
        .patch("bf", &pp, &Patch::Apply(&objs.environment))
        .await?;
    cluster_side_create(&floor, &floor_ns, &env, &objs, conc).await?;
    let floor_create = t.elapsed();
    let t = Instant::now();
    let tr = json!({"spec": {"desiredState": State::Configured, "transition": {"id": "floor-1", "event": "CONFIGURE"}}});
    envs.patch("bf", &PatchParams::default(), &Patch::Merge(&tr))
        .await?;
    cluster_side_status(&floor, &floor_ns, &objs, "floor-1", conc).await?;
    let floor_configure = t.elapsed();
    let floor_requests = floor_count.get();

    // ---- through the daemon ----
    let ns = format!("bench-daemon-{suffix}");
    create_ns(&admin, &ns).await?;
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .env("BENCH_ROLE", "daemon")
        .env("BENCH_NS", &ns)
        .env("KUBECONFIG", &info.kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or("no child pid")?;
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
        child.stdout.take().ok_or("stdout")?,
    ));
    let addrs = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await??
        .ok_or("daemon said nothing")?;
    let (grpc, http) = addrs.split_once(' ').ok_or("bad address line")?;
    let mut api = pb::env_bridge_client::EnvBridgeClient::connect(format!("http://{grpc}")).await?;
    let before = scrape(http).await?;

    let sim_client = admin.clone();
    let t = Instant::now();
    let sim_ns = ns.clone();
    let sim = tokio::spawn(async move {
        // The cluster side starts when the Environment appears.
        let envs: Api<Environment> = Api::namespaced(sim_client.clone(), &sim_ns);
        let env = loop {
            if let Ok(Some(e)) = envs.get_opt("bd").await {
                break e;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let mut objs = objects("bd", nodes, per_node);
        objs.place(&sim_ns, None);
        cluster_side_create(&sim_client, &sim_ns, &env, &objs, conc).await
    });
    let created = api
        .create_environment(pb::CreateEnvironmentRequest {
            workflow: "bench".into(),
            env_id: "bd".into(),
            wait: true,
            timeout_seconds: 600,
            ..Default::default()
        })
        .await?
        .into_inner();
    let daemon_create = t.elapsed();
    sim.await??;
    if created.outcome != "reached" {
        return Err(format!("create: {} {}", created.outcome, created.message).into());
    }

    let t = Instant::now();
    let sim_client = admin.clone();
    let sim_ns = ns.clone();
    let sim = tokio::spawn(async move {
        let envs: Api<Environment> = Api::namespaced(sim_client.clone(), &sim_ns);
        let id = loop {
            if let Ok(Some(e)) = envs.get_opt("bd").await
                && let Some(tr) = e.spec.transition
            {
                break tr.id;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let objs = objects("bd", nodes, per_node);
        cluster_side_status(&sim_client, &sim_ns, &objs, &id, conc).await
    });
    let r = api
        .transition(pb::TransitionRequest {
            id: "bd".into(),
            event: "CONFIGURE".into(),
            wait: true,
            timeout_seconds: 600,
            ..Default::default()
        })
        .await?
        .into_inner();
    let daemon_configure = t.elapsed();
    sim.await??;
    if !r.ok {
        return Err(format!("configure: {} {}", r.outcome, r.message).into());
    }
    let after = scrape(http).await?;
    let delta = |name: &str| {
        after.get(name).copied().unwrap_or(0.0) - before.get(name).copied().unwrap_or(0.0)
    };
    let daemon_requests = delta("envbridge_apiserver_requests_total");
    let daemon_throttled = delta("envbridge_apiserver_throttled_total");
    let roster_bytes = after
        .get("envbridge_roster_task_bytes")
        .copied()
        .unwrap_or(0.0);
    let rss_kib = peak_rss_kib(pid).unwrap_or(0);
    let _ = child.kill().await;

    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    println!();
    println!("phase                         daemon      raw floor   ratio");
    println!(
        "create -> all STANDBY         {:>8.2} s  {:>8.2} s  {:.2}x",
        daemon_create.as_secs_f64(),
        floor_create.as_secs_f64(),
        ratio(daemon_create, floor_create)
    );
    println!(
        "CONFIGURE -> all CONFIGURED   {:>8.2} s  {:>8.2} s  {:.2}x",
        daemon_configure.as_secs_f64(),
        floor_configure.as_secs_f64(),
        ratio(daemon_configure, floor_configure)
    );
    let (dt, ft) = (
        daemon_create + daemon_configure,
        floor_create + floor_configure,
    );
    println!(
        "total                         {:>8.2} s  {:>8.2} s  {:.2}x",
        dt.as_secs_f64(),
        ft.as_secs_f64(),
        ratio(dt, ft)
    );
    println!(
        "daemon apiserver requests     {daemon_requests:.0} (the floor's bare client: {floor_requests}; the simulated cluster side's are not the daemon's)"
    );
    println!("daemon 429s (retried)         {daemon_throttled:.0}");
    println!(
        "daemon peak RSS               {:.1} MiB",
        rss_kib as f64 / 1024.0
    );
    println!(
        "roster bytes per task         {:.0}",
        roster_bytes / total as f64
    );

    for n in [&floor_ns, &ns] {
        let _ = Api::<Namespace>::all(admin.clone())
            .delete(n, &DeleteParams::background())
            .await;
    }
    Ok(())
}

/// What the operator does for each task, minimally: create the Task, write STANDBY.
async fn cluster_side_create(
    client: &Client,
    ns: &str,
    env: &Environment,
    objs: &Objects,
    conc: usize,
) -> Res {
    let tasks: Api<Task> = Api::namespaced(client.clone(), ns);
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "envbridge.dev/v1alpha1".into(),
        kind: "Environment".into(),
        name: env.name_any(),
        uid: env.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let env_name = env.name_any();
    let refs: Vec<TaskRef> = objs.tasks().cloned().collect();
    let results: Vec<Res> = stream::iter(refs)
        .map(move |t| {
            let tasks = tasks.clone();
            let owner = owner.clone();
            let env_name = env_name.clone();
            async move {
                let mut task = Task::new(&t.name, TaskSpec { environment: env_name.clone(), task: t.clone(), transition: None });
                task.metadata.labels = Some(BTreeMap::from([
                    (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
                    (labels::ENVIRONMENT.to_string(), env_name),
                ]));
                task.metadata.owner_references = Some(vec![owner]);
                tasks.create(&PostParams::default(), &task).await?;
                let st = json!({"status": {"state": State::Standby, "podPhase": "Running", "nodeName": t.node}});
                tasks.patch_status(&t.name, &PatchParams::default(), &Patch::Merge(&st)).await?;
                Ok(())
            }
        })
        .buffer_unordered(conc)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Every task reaches CONFIGURED for transition `id`.
async fn cluster_side_status(
    client: &Client,
    ns: &str,
    objs: &Objects,
    id: &str,
    conc: usize,
) -> Res {
    let tasks: Api<Task> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = objs.tasks().map(|t| t.name.clone()).collect();
    let id = id.to_string();
    let results: Vec<Res> = stream::iter(names)
        .map(move |name| {
            let tasks = tasks.clone();
            let id = id.clone();
            async move {
                let st = json!({"status": {"state": State::Configured,
                    "transition": {"id": id, "event": "CONFIGURE", "phase": "Succeeded"}}});
                tasks
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&st))
                    .await?;
                Ok(())
            }
        })
        .buffer_unordered(conc)
        .collect()
        .await;
    results.into_iter().collect()
}

async fn install(admin: &Client) -> Res {
    support::install(admin, &[]).await?;
    let tt = TaskTemplate::new(
        TEMPLATE,
        TaskTemplateSpec {
            control_mode: ControlMode::Direct,
            required_env: vec!["O2_ROLE".into(), "OCC_CONTROL_PORT".into()],
            log_file: None,
            pod: PodSpec {
                containers: vec![Container {
                    name: "task".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        },
    );
    support::apply_template(admin, &tt).await
}

/// Metric name (with labels stripped) -> value, from the daemon's /metrics.
async fn scrape(http: &str) -> Res<BTreeMap<String, f64>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(http).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let mut m = BTreeMap::new();
    for l in out.lines().filter(|l| !l.starts_with('#')) {
        if let Some((k, v)) = l.rsplit_once(' ')
            && let Ok(v) = v.parse::<f64>()
        {
            let k = k.split('{').next().unwrap_or(k).to_string();
            *m.entry(k).or_insert(0.0) += v;
        }
    }
    Ok(m)
}

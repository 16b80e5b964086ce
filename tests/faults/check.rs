//! The invariants, read from the cluster, both daemons' rosters and the simulators
//! themselves (their real state over the control protocol, their logs of every call).
//! Each check returns the violations it found, as sentences.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envbridge::control::{ControlClient, TaskEndpoint};
use envbridge::crd::{Environment, Task, TaskSet, labels};
use envbridge::plan::ControlMode;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::Api;
use kube::api::ListParams;

use super::drive::{self, Outcome};
use super::inject::TaskInfo;
use super::site::Site;

/// An environment under test.
#[derive(Debug, Clone)]
pub struct Env {
    pub id: String,
    pub namespace: String,
    pub name: String,
}

/// How long the cluster may take to tell the truth after a step (live state noticing a dead
/// process, watches catching up).
pub const SETTLE: Duration = Duration::from_secs(45);
/// How long everything may take to be gone after a destroy.
pub const GONE: Duration = Duration::from_secs(120);

fn selector(env: &Env) -> ListParams {
    ListParams::default().labels(&format!("{}={}", labels::ENVIRONMENT, env.name))
}

/// The env's tasks as the cluster placed them (retried while the apiserver is away).
pub async fn tasks(site: &Site, env: &Env) -> Vec<TaskInfo> {
    let until = Instant::now() + SETTLE;
    loop {
        if let Some(t) = try_tasks(site, env).await {
            return t;
        }
        if Instant::now() > until {
            panic!("the tasks of {} cannot be listed", env.id);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn try_tasks(site: &Site, env: &Env) -> Option<Vec<TaskInfo>> {
    let tasks: Api<Task> = Api::namespaced(site.client.clone(), &env.namespace);
    let pods: Api<Pod> = Api::namespaced(site.client.clone(), &env.namespace);
    let tl = tasks.list(&selector(env)).await.ok()?;
    let pl = pods.list(&selector(env)).await.ok()?;
    let mut out = Vec::new();
    for t in tl {
        let name = t.metadata.name.clone()?;
        let label = t.metadata.labels.as_ref()?.get(labels::TASK)?.clone();
        let pod = pl.items.iter().find(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.metadata.labels.as_ref().and_then(|l| l.get(labels::TASK)) == Some(&label)
        })?;
        let ip = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
        out.push(TaskInfo {
            name,
            namespace: env.namespace.clone(),
            pod: pod.metadata.name.clone()?,
            node: pod.spec.as_ref()?.node_name.clone()?,
            fairmq: t.spec.task.control_mode == ControlMode::Fairmq,
            addr: SocketAddr::new(ip, t.spec.task.control_port),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Some(out)
}

/// What a simulator itself says its state is (run-control name), or why it cannot say.
async fn real_state(control: &ControlClient, t: &TaskInfo) -> Result<String, String> {
    let mode = if t.fairmq {
        ControlMode::Fairmq
    } else {
        ControlMode::Direct
    };
    let ep = TaskEndpoint::new(t.addr, mode);
    match control.get_state(&ep, Duration::from_secs(2)).await {
        Ok((s, _)) => Ok(s.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Task name -> state in the Task objects; and the Environment's state and failing tasks.
async fn cluster_view(
    site: &Site,
    env: &Env,
) -> Option<(BTreeMap<String, String>, String, BTreeSet<String>)> {
    let tasks: Api<Task> = Api::namespaced(site.client.clone(), &env.namespace);
    let envs: Api<Environment> = Api::namespaced(site.client.clone(), &env.namespace);
    let states = tasks
        .list(&selector(env))
        .await
        .ok()?
        .into_iter()
        .map(|t| {
            let s = t
                .status
                .and_then(|s| s.state)
                .map(|s| s.to_string())
                .unwrap_or_default();
            (t.metadata.name.unwrap_or_default(), s)
        })
        .collect();
    let e = envs.get_opt(&env.name).await.ok()??;
    let st = e.status.unwrap_or_default();
    let failing = st.failing_tasks.iter().map(|f| f.name.clone()).collect();
    Some((
        states,
        st.state.map(|s| s.to_string()).unwrap_or_default(),
        failing,
    ))
}

/// After a step: its answer names no task no fault touched, and (once settled) no task is
/// misreported: every untouched task is where the cluster says, in the target if the step
/// succeeded; every touched task that is not in the target is named as failing and the
/// environment does not claim the target. Returns (violations, time to settle).
pub async fn truth(
    site: &Site,
    env: &Env,
    target: &str,
    outcome: &Outcome,
    touched: &BTreeSet<String>,
    infos: &[TaskInfo],
) -> (Vec<String>, Duration) {
    let mut v = Vec::new();
    if !outcome.ok {
        if touched.is_empty() {
            v.push(format!(
                "{}: failed though no fault touched a task: {}",
                env.id,
                drive::describe(outcome)
            ));
        }
        for (task, msg) in &outcome.failures {
            if !touched.contains(task) {
                v.push(format!(
                    "{}: names {task:?} failing ({msg}), a task no fault touched",
                    env.id
                ));
            }
        }
    }
    let control = ControlClient::new(false);
    let start = Instant::now();
    let mut problems = Vec::new();
    while start.elapsed() < SETTLE {
        problems.clear();
        let Some((states, env_state, failing)) = cluster_view(site, env).await else {
            problems.push("the cluster cannot be read".to_string());
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        // A touched critical task that failed after the step succeeded takes the environment
        // out by the automatic GO_ERROR (the anchor's way): the tasks still RUNNING are
        // stopped. Then the step's target no longer holds; the truth is every task where the
        // cluster says and the environment in ERROR (seed 500, rounds 17 and 59).
        let go_error = !touched.is_empty()
            && drive::requested(site, &env.id)
                .await
                .is_some_and(|t| t.event == "GO_ERROR");
        if go_error && env_state != "ERROR" {
            problems.push(format!(
                "after the automatic GO_ERROR the environment says {env_state}"
            ));
        }
        let ok = outcome.ok && !go_error;
        for t in infos {
            let real = real_state(&control, t).await;
            let said = states.get(&t.name).cloned().unwrap_or_default();
            if go_error && touched.contains(&t.name) && real.as_deref() == Ok(said.as_str()) {
                continue;
            }
            if touched.contains(&t.name) {
                if real.as_deref() != Ok(target) {
                    if env_state == target {
                        problems.push(format!(
                            "environment says {env_state} while {} is {real:?}",
                            t.name
                        ));
                    }
                    if !failing.contains(&t.name) && said != "ERROR" {
                        problems.push(format!(
                            "{} is {real:?} but the cluster says {said:?} and does not name it failing",
                            t.name
                        ));
                    }
                }
            } else {
                match &real {
                    Ok(r) if *r == said && (!ok || r == target) => {}
                    _ => problems.push(format!(
                        "untouched {} is {real:?}, the cluster says {said:?} (target {target}, step ok={}{})",
                        t.name,
                        outcome.ok,
                        if go_error { ", after the automatic GO_ERROR" } else { "" }
                    )),
                }
            }
        }
        if problems.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let took = start.elapsed();
    v.extend(
        problems
            .into_iter()
            .map(|p| format!("{}: after {SETTLE:?}: {p}", env.id)),
    );
    (v, took)
}

/// One Pod and at most one Service per Task (exactly one Pod while the task lives), the
/// rosters of both daemons equal to the cluster, control ports disjoint across every task.
pub async fn structure(site: &Site, env: &Env) -> Vec<String> {
    let mut v = Vec::new();
    let tasks: Api<Task> = Api::namespaced(site.client.clone(), &env.namespace);
    let pods: Api<Pod> = Api::namespaced(site.client.clone(), &env.namespace);
    let svcs: Api<Service> = Api::namespaced(site.client.clone(), &env.namespace);
    let (Ok(tl), Ok(pl), Ok(sl)) = (
        tasks.list(&selector(env)).await,
        pods.list(&selector(env)).await,
        svcs.list(&selector(env)).await,
    ) else {
        return vec![format!("{}: the cluster cannot be read", env.id)];
    };
    let count = |items: Vec<Option<&String>>| {
        let mut m: BTreeMap<String, usize> = BTreeMap::new();
        for l in items.into_iter().flatten() {
            *m.entry(l.clone()).or_default() += 1;
        }
        m
    };
    fn label(m: &kube::api::ObjectMeta) -> Option<&String> {
        m.labels.as_ref().and_then(|l| l.get(labels::TASK))
    }
    let live_pods = count(
        pl.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| label(&p.metadata))
            .collect(),
    );
    let services = count(sl.iter().map(|s| label(&s.metadata)).collect());
    for t in &tl {
        let Some(l) = label(&t.metadata) else {
            continue;
        };
        let name = t.metadata.name.as_deref().unwrap_or_default();
        let pods = live_pods.get(l).copied().unwrap_or(0);
        let ended = matches!(
            t.status
                .as_ref()
                .and_then(|s| s.state)
                .map(|s| s.to_string())
                .as_deref(),
            Some("ERROR") | Some("DONE")
        );
        if pods > 1 || (pods == 0 && !ended) {
            v.push(format!("{}: task {name} has {pods} live pods", env.id));
        }
        if services.get(l).copied().unwrap_or(0) > 1 {
            v.push(format!("{}: task {name} has several Services", env.id));
        }
    }
    v.extend(roster(site, env, &tl.items).await);
    v.extend(ports(site).await);
    v
}

/// Both replicas' rosters list the same tasks in the same states as the Task objects, once
/// their watches caught up (a replica that is down is skipped).
async fn roster(site: &Site, env: &Env, tl: &[Task]) -> Vec<String> {
    let want: BTreeMap<String, String> = tl
        .iter()
        .map(|t| {
            (
                t.metadata.name.clone().unwrap_or_default(),
                t.status
                    .as_ref()
                    .and_then(|s| s.state)
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            )
        })
        .collect();
    let mut v = Vec::new();
    for r in 0..site.daemons.len() {
        let start = Instant::now();
        loop {
            // Re-read the cluster too: a task may have moved meanwhile.
            let now: Option<BTreeMap<String, String>> = cluster_view(site, env).await.map(|c| c.0);
            let want = now.unwrap_or_else(|| want.clone());
            let last = match drive::get(site, r, &env.id).await {
                Some(e) => {
                    let got: BTreeMap<String, String> =
                        e.tasks.into_iter().map(|t| (t.name, t.state)).collect();
                    if got == want {
                        break;
                    }
                    format!("roster {got:?} vs cluster {want:?}")
                }
                None if site.daemons[r]
                    .downtime
                    .covers(Instant::now(), Duration::ZERO) =>
                {
                    break;
                }
                None => "the environment is not in its roster".to_string(),
            };
            if start.elapsed() > Duration::from_secs(20) {
                v.push(format!("{}: daemon-{r}: {last}", env.id));
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    v
}

/// No two live tasks on one node share a control port (across environments and restarts).
async fn ports(site: &Site) -> Vec<String> {
    let all: Api<Task> = Api::all(site.client.clone());
    let Ok(tl) = all.list(&ListParams::default()).await else {
        return vec!["the Tasks cannot be listed".into()];
    };
    let mut seen: BTreeMap<(String, u16), String> = BTreeMap::new();
    let mut v = Vec::new();
    for t in tl {
        if t.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let key = (t.spec.task.node.clone(), t.spec.task.control_port);
        let name = format!(
            "{}/{}",
            t.metadata.namespace.unwrap_or_default(),
            t.metadata.name.unwrap_or_default()
        );
        if let Some(other) = seen.insert(key.clone(), name.clone()) {
            v.push(format!(
                "{other} and {name} share control port {} on {}",
                key.1, key.0
            ));
        }
    }
    v
}

/// After a destroy: nothing of the environment is left (its namespace with its RoleBindings,
/// Tasks, TaskSets, Pods, Services; the Environment), and no roster lists it.
pub async fn gone(site: &Site, env: &Env) -> Vec<String> {
    let start = Instant::now();
    let mut left = Vec::new();
    while start.elapsed() < GONE {
        left.clear();
        let c = &site.client;
        let sel = selector(env);
        let ns: Api<Namespace> = Api::all(c.clone());
        match ns.get_opt(&env.namespace).await {
            Ok(None) => {}
            Ok(Some(_)) => left.push(format!("namespace {}", env.namespace)),
            Err(e) => left.push(format!("(cluster unreadable: {e})")),
        }
        let n = |r: Result<usize, kube::Error>, what: &str, left: &mut Vec<String>| match r {
            Ok(0) => {}
            Ok(k) => left.push(format!("{k} {what}")),
            Err(e) => left.push(format!("({what} unreadable: {e})")),
        };
        n(
            Api::<Task>::all(c.clone())
                .list(&sel)
                .await
                .map(|l| l.items.len()),
            "Tasks",
            &mut left,
        );
        n(
            Api::<TaskSet>::all(c.clone())
                .list(&sel)
                .await
                .map(|l| l.items.len()),
            "TaskSets",
            &mut left,
        );
        n(
            Api::<Environment>::all(c.clone())
                .list(&sel)
                .await
                .map(|l| l.items.len()),
            "Environments",
            &mut left,
        );
        n(
            Api::<Pod>::all(c.clone())
                .list(&sel)
                .await
                .map(|l| l.items.len()),
            "Pods",
            &mut left,
        );
        n(
            Api::<Service>::all(c.clone())
                .list(&sel)
                .await
                .map(|l| l.items.len()),
            "Services",
            &mut left,
        );
        n(
            Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(c.clone(), &env.namespace)
                .list(&ListParams::default())
                .await
                .map(|l| l.items.len()),
            "RoleBindings",
            &mut left,
        );
        for r in 0..site.daemons.len() {
            if drive::get(site, r, &env.id).await.is_some() {
                left.push(format!("daemon-{r}'s roster entry"));
            }
        }
        if left.is_empty() {
            return Vec::new();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    vec![format!(
        "{}: {GONE:?} after destroy, left: {}",
        env.id,
        left.join(", ")
    )]
}

/// The simulators' own logs: no FairMQ device got a step it could not take (INIT DEVICE
/// outside IDLE, a step rejected or inapplicable in its state): a half-done sequence was
/// carried on or rolled back, never started over.
pub fn fairmq_calls(site: &Site, env: &Env, infos: &[TaskInfo]) -> Vec<String> {
    let mut v = Vec::new();
    for t in infos.iter().filter(|t| t.fairmq) {
        let Ok(log) = std::fs::read_to_string(t.log(site)) else {
            continue;
        };
        for line in log.lines() {
            let bad_init = line.contains("received transition INIT DEVICE in ")
                && !line.contains("received transition INIT DEVICE in IDLE");
            let rejected =
                line.contains("task simulator rejected") || line.contains("does not apply in");
            if bad_init || rejected {
                v.push(format!("{}: {}: {}", env.id, t.name, line.trim()));
            }
        }
    }
    v
}

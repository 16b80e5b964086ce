//! The operator benchmark's floor, a bare client: the same Task, Pod and Service created
//! directly (`create`), a transition (`transition`) with per task the writes
//! and the call the operator makes for it: its Task's `spec.transition` (a JSON patch of that
//! one field), the call to its process, its Task's status (state and the transition's
//! outcome); `in_flight` tasks at once; and the same calls and deletes (`destroy`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envbridge::control::{ControlClient, TaskEndpoint};
use envbridge::crd::{
    Environment, EnvironmentSpec, Task, TaskStatus, TaskTemplate, TransitionPhase,
    TransitionRequest, TransitionStatus,
};
use envbridge::operator::names::{service_name, task_annotations, task_labels};
use envbridge::operator::pod::{PodSettings, build_pod};
use envbridge::operator::service::build_service;
use envbridge::operator::task_controller::take_out_events;
use envbridge::operator::task_sets::build_task;
use envbridge::plan::TaskRef;
use envbridge::state::{Event, State};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::Res;
use super::tasks::CLASSES;

/// The four transitions a run takes, each with the state it starts from.
pub const CYCLE: [(Event, State); 4] = [
    (Event::Configure, State::Standby),
    (Event::Start, State::Configured),
    (Event::Stop, State::Running),
    (Event::Reset, State::Configured),
];

/// Drives every task of `tasks` (their pods' IPs in their status) through `event` from
/// `from`, as transition `id`; the time until the last task's status is written.
pub async fn transition(
    client: &Client,
    control: &ControlClient,
    tasks: &[Task],
    (event, from): (Event, State),
    id: &str,
    in_flight: usize,
) -> Res<Duration> {
    let api: Api<Task> = Api::namespaced(client.clone(), &namespace(tasks));
    let req = TransitionRequest {
        id: id.into(),
        event,
        arguments: BTreeMap::new(),
    };
    let t0 = Instant::now();
    stream::iter(tasks)
        .map(|t| one(&api, control, t, &req, from))
        .buffer_unordered(in_flight.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(t0.elapsed())
}

fn namespace(tasks: &[Task]) -> String {
    tasks
        .first()
        .and_then(|t| t.namespace())
        .unwrap_or_default()
}

async fn one(
    api: &Api<Task>,
    control: &ControlClient,
    task: &Task,
    req: &TransitionRequest,
    from: State,
) -> Res {
    let name = task.name_any();
    let pp = PatchParams::default();
    let spec = json!([{"op": "add", "path": "/spec/transition", "value": req}]);
    let spec: json_patch::Patch = serde_json::from_value(spec)?;
    api.patch(&name, &pp, &Patch::<()>::Json(spec)).await?;
    let tref = &task.spec.task;
    let reached = if tref.control_mode.has_protocol() {
        let ep = TaskEndpoint::new(endpoint(task)?, tref.control_mode);
        let args = envbridge::operator::transition_args::arguments(req.event, tref, &req.arguments);
        control
            .transition(&ep, from, req.event, &args, Duration::from_secs(60))
            .await?
    } else {
        req.event.target()
    };
    if reached != req.event.target() {
        return Err(format!("floor {}: {name} reached {reached}", req.event).into());
    }
    let outcome = TransitionStatus {
        id: req.id.clone(),
        event: req.event,
        phase: TransitionPhase::Succeeded,
        message: String::new(),
    };
    let status = json!({"status": {"state": reached, "transition": outcome}});
    api.patch_status(&name, &pp, &Patch::Merge(&status)).await?;
    Ok(())
}

/// The bare client: the same Task, Pod and Service bodies, created directly, then one status
/// write per Task once its pod runs.
pub async fn create(
    client: &Client,
    ns: &str,
    refs: &[TaskRef],
    concurrency: usize,
    discovery_port: u16,
) -> Res {
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
                // Its finalizer kept: the destroy then sends the operator's four writes a task.
                let mut t = build_task(&owner, &r);
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
                svcs.create(pp, &build_service(&t, &labels, discovery_port))
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
        let pod = tokio::time::timeout(super::drive::TIMEOUT, w.try_next())
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

/// The bare client's destroy: per task the calls and writes the operator sends for it (its
/// process taken out in order from `from`, as the operator does before deleting a live
/// task's pod; its Pod's and its Service's deletes, the Task's delete and its finalizer
/// dropped), `in_flight` tasks at once; the time until none of them is left.
pub async fn destroy(
    client: &Client,
    control: &ControlClient,
    tasks: &[Task],
    from: State,
    in_flight: usize,
) -> Res<Duration> {
    let ns = namespace(tasks);
    let dp = DeleteParams::default();
    let drop = json!({"metadata": {"finalizers": null}});
    let (pods, svcs, api) = (
        Api::<Pod>::namespaced(client.clone(), &ns),
        Api::<Service>::namespaced(client.clone(), &ns),
        Api::<Task>::namespaced(client.clone(), &ns),
    );
    let t0 = Instant::now();
    stream::iter(tasks)
        .map(|t| {
            let (pods, svcs, api, dp, drop) = (&pods, &svcs, &api, &dp, &drop);
            async move {
                let name = t.name_any();
                take_out(control, t, from).await?;
                pods.delete(&name, dp).await?;
                svcs.delete(&service_name(&name), dp).await?;
                api.delete(&name, dp).await?;
                api.patch(&name, &PatchParams::default(), &Patch::Merge(drop))
                    .await?;
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            }
        })
        .buffer_unordered(in_flight.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    super::wait_gone(client, &ns, super::drive::TIMEOUT).await?;
    Ok(t0.elapsed())
}

/// The operator's calls before a live task's pod is deleted (`take_out_events`: EXIT from
/// STANDBY), to the process at its pod's IP.
async fn take_out(control: &ControlClient, task: &Task, from: State) -> Res {
    let tref = &task.spec.task;
    if !tref.control_mode.has_protocol() {
        return Ok(());
    }
    let ep = TaskEndpoint::new(endpoint(task)?, tref.control_mode);
    let mut at = from;
    for event in take_out_events(from) {
        at = control
            .transition(&ep, at, *event, &[], Duration::from_secs(60))
            .await?;
    }
    Ok(())
}

/// The address of a task's process: its pod's IP (in its status), its control port.
fn endpoint(task: &Task) -> Res<SocketAddr> {
    let ip = task
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .ok_or_else(|| format!("floor: Task {} has no pod IP", task.name_any()))?;
    Ok(SocketAddr::new(ip.parse()?, task.spec.task.control_port))
}

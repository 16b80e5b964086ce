//! A transition done by a bare client (the operator benchmark's floor): per task the writes
//! and the call the operator makes for it: its Task's `spec.transition` (a JSON patch of that
//! one field), the call to its process, its Task's status (state and the transition's
//! outcome); `in_flight` tasks at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envbridge::control::{ControlClient, TaskEndpoint};
use envbridge::crd::{Task, TransitionPhase, TransitionRequest, TransitionStatus};
use envbridge::state::{Event, State};
use futures::{StreamExt, TryStreamExt, stream};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::Res;

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
        let ip = task
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .ok_or_else(|| format!("floor: Task {name} has no pod IP"))?;
        let ep = TaskEndpoint::new(
            SocketAddr::new(ip.parse()?, tref.control_port),
            tref.control_mode,
        );
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

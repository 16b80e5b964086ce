//! A deleted Task: its process taken out in order, then its pod and Service deleted.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, warn};

use super::objects::{POD, POD_DELETION, SERVICE, SERVICE_DELETION, awaiting_store};
use super::outcome::publish;
use super::process::forget_endpoint;
use crate::crd::Task;
use crate::operator::context::Ctx;
use crate::operator::control_api::{ControlError, TaskEndpoint};
use crate::operator::names::service_name;
use crate::operator::pod_status::observe;
use crate::operator::stored_pod::StoredPod;
use crate::operator::transition_calls::{Call, Found};
use crate::operator::{Error, Result, delete_ignore_missing, unread};
use crate::plan::ControlMode;
use crate::state::{Event, State};

/// Deletes the task's Pod and Service; `Pending` until both are gone, then the Task may go.
pub(super) async fn cleanup(task: &Task, ctx: &Ctx) -> Result<Action> {
    let ns = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let sname = service_name(&name);
    let uid = task.uid().unwrap_or_default();
    let pod = ctx.pods.get(&ObjectRef::new(&name).within(&ns));
    let svc = ctx.services.get(&ObjectRef::new(&sname).within(&ns));
    // A call under way ends first (bounded by its deadline; its end wakes this reconcile): a
    // transition's, and the process is taken out from the state it answered; or the
    // take-out's, and the pod goes.
    let (reached, taken_out) = match ctx.transitions.find(&uid) {
        Found::Running => {
            return Err(Error::Pending {
                what: format!("task {ns}/{name}: its control call"),
                after: Duration::from_secs(1),
            });
        }
        Found::Done(Call::Transition(_), outcome) => (outcome.ok(), false),
        Found::Done(Call::TakeOut, _) => (None, true),
        Found::Nothing => (None, false),
    };
    // One delete each: while the store has not shown the deletion yet, not another.
    if let Some(p) = &pod
        && p.metadata.deletion_timestamp.is_none()
        && awaiting_store(ctx, POD_DELETION, &uid).is_none()
    {
        ctx.live.unfollow(&uid);
        if !taken_out && take_out(task, ctx, p, reached) {
            return Err(Error::Pending {
                what: format!("task {ns}/{name}: its process going out"),
                after: Duration::from_secs(1),
            });
        }
        delete_ignore_missing(
            &Api::<Pod>::namespaced(ctx.client.clone(), &ns),
            &name,
            "Pod",
            &ns,
        )
        .await?;
        ctx.requested
            .insert((POD_DELETION, uid.clone()), std::time::Instant::now());
    }
    if let Some(s) = &svc
        && s.metadata.deletion_timestamp.is_none()
        && awaiting_store(ctx, SERVICE_DELETION, &uid).is_none()
    {
        delete_ignore_missing(
            &Api::<Service>::namespaced(ctx.client.clone(), &ns),
            &sname,
            "Service",
            &ns,
        )
        .await?;
        ctx.requested
            .insert((SERVICE_DELETION, uid.clone()), std::time::Instant::now());
    }
    // A pod whose node is dead stays Terminating (no kubelet confirms): past the bound it is
    // removed by force, so that a finalizer never holds an environment forever.
    if let Some(p) = &pod
        && let Some(since) = p.metadata.deletion_timestamp.as_ref()
    {
        let waited =
            Duration::try_from(jiff::Timestamp::now().duration_since(since.0)).unwrap_or_default();
        let bound = Duration::from_secs(u64::from(ctx.args.pod_deletion_timeout_seconds));
        if waited >= bound {
            let api = Api::<Pod>::namespaced(ctx.client.clone(), &ns);
            let now = kube::api::DeleteParams::default().grace_period(0);
            match unread::delete(&api, &name, &now).await {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(Error::kube("force delete", "Pod", &ns, &name, e)),
            }
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            warn!(task = %name, %node, waited = ?waited, "pod still terminating: removed by force (its node does not answer)");
            publish(
                ctx,
                task,
                "PodForceDeleted",
                format!(
                    "pod still terminating after {}s on node {node}: removed by force",
                    waited.as_secs()
                ),
            )
            .await;
        }
    }
    if pod.is_some() || svc.is_some() {
        // Their deletion events bring the next reconcile; this is the fallback.
        return Err(Error::Pending {
            what: format!("task {ns}/{name}: pod and service going"),
            after: Duration::from_secs(2),
        });
    }
    for what in [
        POD,
        SERVICE,
        POD_DELETION,
        SERVICE_DELETION,
        crate::operator::context::TASK_DELETION,
    ] {
        ctx.requested.remove(&(what, uid.clone()));
    }
    ctx.verified.remove(&uid);
    ctx.answered.remove(&uid);
    ctx.transitions.forget(&uid);
    ctx.live.unfollow(&uid);
    forget_endpoint(task, &ctx.control);
    Ok(Action::await_change())
}

/// The events that take a process out in order from `from`: to STANDBY first (STOP from
/// RUNNING, RESET from CONFIGURED), then EXIT, which the OCC state machine accepts only
/// from STANDBY, CONFIGURED or ERROR. The FairMQ sequences (RESET = RESET TASK + RESET
/// DEVICE, EXIT = END) come from the control client.
pub fn take_out_events(from: State) -> &'static [Event] {
    match from {
        State::Running => &[Event::Stop, Event::Reset, Event::Exit],
        State::Configured => &[Event::Reset, Event::Exit],
        State::Standby | State::Error => &[Event::Exit],
        _ => &[],
    }
}

/// Before a live task's pod is deleted, its process goes out in order, bounded by the
/// shutdown timeout; a refusal or the timeout only ends the attempt (the pod goes anyway).
/// `reached`: the state a transition call answered that the status does not show yet.
/// Starts the take-out as a call of its own (its end wakes the Task) and says whether it
/// did: false when there is no live process to take out.
pub(super) fn take_out(task: &Task, ctx: &Ctx, pod: &StoredPod, reached: Option<State>) -> bool {
    let tref = &task.spec.task;
    if !matches!(tref.control_mode, ControlMode::Direct | ControlMode::Fairmq) {
        return false;
    }
    let Some(from) = reached.or_else(|| task.status.as_ref().and_then(|s| s.state)) else {
        return false;
    };
    let view = observe(pod);
    let (Some(Ok(ip)), "Running") = (
        view.ip.as_deref().map(str::parse::<IpAddr>),
        view.phase.as_str(),
    ) else {
        return false;
    };
    let events = take_out_events(from);
    if events.is_empty() {
        return false;
    }
    let ep = TaskEndpoint {
        addr: SocketAddr::new(ip, tref.control_port),
        mode: tref.control_mode,
    };
    let name = task.name_any();
    let tname = name.clone();
    let budget = Duration::from_secs(u64::from(ctx.args.shutdown_timeout_seconds));
    let deadline = ctx.args.control_deadline(tref.timeout_seconds).min(budget);
    let control = ctx.control.clone();
    let steps = async move {
        let mut at = from;
        for event in events {
            match control.transition(&ep, at, *event, &[], deadline).await {
                Ok(reached) => at = reached,
                Err(e) => {
                    warn!(task = %name, %event, error = %e, "taking the task out: refused; its pod goes anyway");
                    return Err(e);
                }
            }
        }
        debug!(task = %name, state = %at, "task taken out before its pod is deleted");
        Ok(at)
    };
    let uid = task.uid().unwrap_or_default();
    ctx.transitions
        .start(&uid, ObjectRef::from_obj(task), Call::TakeOut, async move {
            tokio::time::timeout(budget, steps).await.unwrap_or_else(|_| {
                warn!(task = %tname, timeout = ?budget, "taking the task out timed out; its pod goes anyway");
                Err(ControlError::Deadline {
                    addr: ep.addr,
                    call: "taking the task out".into(),
                    deadline: budget,
                })
            })
        });
    true
}

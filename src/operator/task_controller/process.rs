//! A task's process: its end or failure to start, its control (dial, state, transitions)
//! and following it between transitions.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, warn};

use super::objects::running_for;
use super::outcome::{COND_ENDED, LiveChange, Step, fail, publish};
use crate::crd::{Task, TaskStatus, TransitionPhase, TransitionStatus};
use crate::operator::context::Ctx;
use crate::operator::control_api::{ControlClient, ControlError, TaskEndpoint};
use crate::operator::env_controller::set_condition;
use crate::operator::live;
use crate::operator::pod_status::PodView;
use crate::operator::pod_story;
use crate::operator::stored_pod::StoredPod;
use crate::operator::transition_args;
use crate::operator::transition_calls::{Call, Called, Found, Outcome};
use crate::plan::ControlMode;
use crate::state::{Event, State, next};

/// The process failed: once, its story (last log lines, the pod's Warning events) into the
/// status and an Event; the pod is kept for its logs until the environment goes (or a
/// RECOVER replaces it).
pub(super) async fn process_failed(
    task: &Task,
    ctx: &Ctx,
    st: &mut TaskStatus,
    step: &mut Step,
    pod: &StoredPod,
    failure: String,
    view: &PodView,
) {
    ctx.live.unfollow(&task.uid().unwrap_or_default());
    forget_endpoint(task, &ctx.control);
    if !ended(st) {
        st.last_log = pod_story::termination_message(pod);
        st.pod_events = pod_story::warning_events(&ctx.client, pod).await;
        let mut note = failure.clone();
        if let Some(last) = st.last_log.as_deref().and_then(|l| l.lines().last()) {
            note.push_str(&format!("; last log line: {last}"));
        }
        publish(ctx, task, "ProcessFailed", note).await;
    } else if st.pod_events.is_empty() && ended_for(st) < EVENTS_GRACE {
        // The kubelet's events may be written just after the status that failed it.
        st.pod_events = pod_story::warning_events(&ctx.client, pod).await;
    }
    fail(st, task, failure);
    set_condition(
        &mut st.conditions,
        COND_ENDED,
        true,
        "Failed",
        &view.phase,
        task.metadata.generation,
    );
    step.action = Some(
        if st.pod_events.is_empty() && ended_for(st) < EVENTS_GRACE {
            Action::requeue(Duration::from_secs(1))
        } else {
            Action::await_change()
        },
    );
}

/// Not Running in time: a failure, told in the pod's own words; the pod is deleted (it never
/// ran: nothing to keep, and it must not start later unmanaged).
pub(super) async fn startup_failed(
    task: &Task,
    ctx: &Ctx,
    st: &mut TaskStatus,
    step: &mut Step,
    pod: &StoredPod,
    view: &PodView,
) {
    let limit = ctx.args.startup_timeout_seconds;
    let mut why = pod_story::pending_reasons(pod);
    let events = pod_story::warning_events(&ctx.client, pod).await;
    why.extend(events.iter().cloned());
    let msg = format!(
        "pod not Running after {limit}s (phase {}){}",
        view.phase,
        if why.is_empty() {
            String::new()
        } else {
            format!(": {}", why.join("; "))
        }
    );
    st.pod_events = events;
    publish(ctx, task, "StartupFailed", msg.clone()).await;
    fail(st, task, msg);
    set_condition(
        &mut st.conditions,
        COND_ENDED,
        true,
        "StartupTimeout",
        &view.phase,
        task.metadata.generation,
    );
    step.delete_pod = true;
    step.action = Some(Action::await_change());
}

/// A Running pod: read the process's state once (and again after an operator restart), then
/// drive its transition and follow it.
pub(super) async fn control(
    task: &Task,
    ctx: &Ctx,
    st: &mut TaskStatus,
    step: &mut Step,
    pod: &StoredPod,
    ip: IpAddr,
) {
    let tref = &task.spec.task;
    let task_uid = task.uid().unwrap_or_default();
    if ctx.transitions.running(&task_uid) {
        // Its end wakes this Task's reconcile; nothing to read or follow until then.
        step.action = Some(Action::await_change());
        return;
    }
    let ep = TaskEndpoint {
        addr: SocketAddr::new(ip, tref.control_port),
        mode: tref.control_mode,
    };
    let deadline = ctx.args.control_deadline(tref.timeout_seconds);
    let protocol = matches!(tref.control_mode, ControlMode::Direct | ControlMode::Fairmq);
    if matches!(st.state, None | Some(State::Deploying))
        || (protocol && !ctx.verified.contains(&task_uid))
    {
        if !protocol {
            st.state = Some(State::Standby);
            st.message = None;
        } else {
            match ctx.control.get_state(&ep, deadline).await {
                Ok((state, pid)) => {
                    ctx.verified.insert(task_uid.clone());
                    st.state = Some(state);
                    st.pid = (pid > 0).then_some(pid);
                    if state != State::Error {
                        st.message = None;
                    }
                }
                // A FairMQ device part-way through a sequence (its last driver, an operator
                // killed between two steps, never finished it): it answers, and it stays in the
                // state its Task records until the transition, which plans from the device's
                // own state, carries the sequence on.
                Err(ControlError::Between { device_state, .. }) => {
                    ctx.verified.insert(task_uid.clone());
                    let recorded = st.state.filter(|s| *s != State::Deploying);
                    st.state = Some(recorded.unwrap_or(State::Standby));
                    debug!(task = %task.name_any(), %device_state, "FairMQ device between states; the transition carries on from there");
                }
                Err(e) => {
                    let since = running_for(pod);
                    let limit = Duration::from_secs(u64::from(ctx.args.connect_timeout_seconds));
                    if since < limit {
                        debug!(task = %task.name_any(), error = %e, "control port not reachable yet");
                        st.state.get_or_insert(State::Deploying);
                        // Nothing to report yet: the write comes with the answer (or the
                        // failure once the limit has passed).
                        step.write_status = false;
                        step.action = Some(Action::requeue(Duration::from_millis(500)));
                        return;
                    }
                    fail(
                        st,
                        task,
                        format!(
                            "control port {} unreachable for {}s: {e}",
                            ep.addr,
                            limit.as_secs()
                        ),
                    );
                    return;
                }
            }
        }
    }
    if transition(task, st, Some((&ep, ctx)), deadline, protocol) == Calling::UnderWay {
        step.action = Some(Action::await_change());
        return;
    }
    if protocol && !ctx.args.no_live_state {
        follow_live(task, ctx, st, step, &ep).await;
    }
}

/// Keeps a follower on the task process while it runs, and applies what it saw (told and
/// forgotten once the status is written: [`LiveChange`]).
pub(super) async fn follow_live(
    task: &Task,
    ctx: &Ctx,
    st: &mut TaskStatus,
    step: &mut Step,
    ep: &TaskEndpoint,
) {
    let uid = task.uid().unwrap_or_default();
    match st.state {
        Some(State::Done) | None | Some(State::Deploying) => {
            ctx.live.unfollow(&uid);
            return;
        }
        Some(_) => ctx.live.follow(&uid, ObjectRef::from_obj(task), *ep),
    }
    let Some((obs, call_end)) = ctx.live.news(&uid) else {
        return;
    };
    let mut verdict = live::judge(st.state, &obs, call_end);
    if verdict == live::Verdict::Confirm
        && let Some(current) = st.state
    {
        let read = {
            let _call = ctx.live.calling(&uid);
            ctx.control.get_state(ep, LIVE_READ_DEADLINE).await
        };
        verdict = live::confirmed(current, &obs, read.as_ref().map(|(s, _)| *s))
            .unwrap_or(live::Verdict::Nothing);
    }
    let live::Verdict::Apply {
        state,
        reason,
        message,
    } = verdict
    else {
        ctx.live.consumed(&uid, &obs);
        return;
    };
    warn!(task = %task.name_any(), %state, %message, "task changed state between transitions");
    st.state = Some(state);
    st.message = Some(message.clone());
    step.live_change = Some(LiveChange {
        obs,
        reason,
        message,
    });
}

/// A state read to confirm what a follower saw (direct GetState takes ~1 s while RUNNING).
pub(super) const LIVE_READ_DEADLINE: Duration = Duration::from_secs(3);

/// How long after a failure the pod's Warning events are looked for again while none is seen.
pub(super) const EVENTS_GRACE: Duration = Duration::from_secs(5);

/// How long ago the task's process ended (zero when unknown or not ended).
pub(super) fn ended_for(st: &TaskStatus) -> Duration {
    st.conditions
        .iter()
        .find(|c| c.type_ == COND_ENDED && c.status == "True")
        .and_then(|c| {
            Duration::try_from(jiff::Timestamp::now().duration_since(c.last_transition_time.0)).ok()
        })
        .unwrap_or_default()
}

pub(super) fn ended(st: &TaskStatus) -> bool {
    st.conditions
        .iter()
        .any(|c| c.type_ == COND_ENDED && c.status == "True")
}

/// A RECOVER not yet answered while the task is in ERROR.
pub(super) fn recover_pending(task: &Task, st: &TaskStatus) -> bool {
    st.state == Some(State::Error)
        && task.spec.transition.as_ref().is_some_and(|req| {
            req.event == Event::Recover && st.transition.as_ref().map(|t| &t.id) != Some(&req.id)
        })
}

/// Whether a transition left for a call under way (its end wakes the Task's reconcile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Calling {
    Settled,
    UnderWay,
}

/// Performs the task's pending transition (the one whose id its status has not recorded):
/// at once when no call is needed, else by a call started in `ctx.transitions`, whose
/// outcome a later reconcile takes ([`settle`]).
pub(super) fn transition(
    task: &Task,
    st: &mut TaskStatus,
    ep: Option<(&TaskEndpoint, &Ctx)>,
    deadline: Duration,
    protocol: bool,
) -> Calling {
    let Some(req) = &task.spec.transition else {
        return Calling::Settled;
    };
    if st.transition.as_ref().is_some_and(|t| t.id == req.id) {
        return Calling::Settled;
    }
    let Some(from) = st.state.filter(|s| *s != State::Deploying) else {
        return Calling::Settled;
    };
    let done = |phase, message| recorded(&req.id, req.event, phase, message);
    // The anchor's GO_ERROR: the environment goes to ERROR; a task still RUNNING is stopped
    // (STOP with the STOP keys), the others keep their state. No process knows GO_ERROR.
    let (event, target) = match req.event {
        Event::GoError if from != State::Running => (Event::GoError, from),
        Event::GoError => (Event::Stop, State::Configured),
        e => (e, req.target()),
    };
    if from == target {
        st.transition = Some(done(TransitionPhase::Succeeded, String::new()));
        return Calling::Settled;
    }
    if next(from, event).is_none() {
        let msg = format!("{} does not apply in state {from}", req.event);
        st.transition = Some(done(TransitionPhase::Failed, msg));
        return Calling::Settled;
    }
    let (true, Some((ep, ctx))) = (protocol, ep) else {
        st.state = Some(target);
        st.transition = Some(done(TransitionPhase::Succeeded, String::new()));
        return Calling::Settled;
    };
    let args = match req.event {
        Event::GoError => transition_args::go_error_stop(&req.arguments),
        e => transition_args::arguments(e, &task.spec.task, &req.arguments),
    };
    let uid = task.uid().unwrap_or_default();
    let name = task.name_any();
    let id = req.id.clone();
    debug!(target: "envbridge::hops", hop = "task_call", transition = %id, task = %name);
    let (control, live, ep) = (ctx.control.clone(), ctx.live.clone(), *ep);
    let called = Called {
        id: id.clone(),
        event: req.event,
        from,
        target,
    };
    let key = uid.clone();
    ctx.transitions
        .start(&uid, ObjectRef::from_obj(task), Call::Transition(called), async move {
            let outcome = {
                let _call = live.calling(&key);
                control.transition(&ep, from, event, &args, deadline).await
            };
            debug!(target: "envbridge::hops", hop = "task_answered", transition = %id, task = %name);
            outcome
        });
    Calling::UnderWay
}

/// A transition call that ended since the task's last reconcile: its outcome goes into the
/// status first, as if the reconcile had waited for the call.
pub(super) fn settle(task: &Task, ctx: &Ctx, st: &mut TaskStatus) {
    // A take-out is a deleted Task's alone (`cleanup`): a live Task never has one.
    if let Found::Done(Call::Transition(called), outcome) =
        ctx.transitions.find(&task.uid().unwrap_or_default())
    {
        record_outcome(task, st, &called, outcome);
    }
}

/// A call's outcome into the status. A transition the status records already (the task
/// failed while the call was under way, and `fail` recorded it) keeps what it has.
fn record_outcome(task: &Task, st: &mut TaskStatus, called: &Called, outcome: Outcome) {
    if st.transition.as_ref().is_some_and(|t| t.id == called.id) {
        return;
    }
    let done = |phase, message| recorded(&called.id, called.event, phase, message);
    match outcome {
        Ok(reached) if reached == called.target => {
            st.state = Some(reached);
            st.message = None;
            st.transition = Some(done(TransitionPhase::Succeeded, String::new()));
        }
        Ok(reached) => {
            let msg = format!(
                "{} ended in {reached}, expected {}",
                called.event, called.target
            );
            st.state = Some(reached);
            if reached == State::Error {
                st.message = Some(msg.clone());
            }
            st.transition = Some(done(TransitionPhase::Failed, msg));
        }
        Err(e) => {
            let msg = format!("{} failed: {e}", called.event);
            fail(st, task, msg.clone());
            st.transition = Some(done(TransitionPhase::Failed, msg));
        }
    }
}

/// How a Task's status records the end of its transition `id`.
fn recorded(id: &str, event: Event, phase: TransitionPhase, message: String) -> TransitionStatus {
    TransitionStatus {
        id: id.to_string(),
        event,
        phase,
        message,
    }
}

/// Drops the control client's cached channel to a task whose process is gone.
pub(super) fn forget_endpoint(task: &Task, control: &ControlClient) {
    let ip = task
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok());
    if let Some(ip) = ip {
        control.forget(&SocketAddr::new(ip, task.spec.task.control_port));
    }
}

//! Task controller: Task -> Pod (+ headless Service) on the resolved node; pod phase and early
//! failures -> Task status; task control (dial the process, drive transitions); cleanup.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::context::{Answer, Ctx};
use super::control_api::{ControlClient, ControlError, TaskEndpoint};
use super::env_controller::set_condition;
use super::hooks;
use super::live;
use super::names::{service_name, task_annotations, task_labels};
use super::nodes::resolve;
use super::pod::build_pod;
use super::pod_status::{PodView, observe};
use super::pod_story;
use super::service::{build_service, service_matches};
use super::stored_pod::StoredPod;
use super::task_sets::TASK_FINALIZER;
use super::task_step::{self, Next, PodSeen, Seen};
use super::transition_args;
use super::{Error, FIELD_MANAGER, Result, delete_ignore_missing};
use crate::crd::{Task, TaskStatus, TransitionPhase, TransitionStatus};
use crate::plan::ControlMode;
use crate::state::{Event, State, next};

/// Task condition: the task's process ended (its pod failed or completed); the pod is not
/// re-created for it.
pub const COND_ENDED: &str = "ProcessEnded";

pub async fn reconcile(task: Arc<Task>, ctx: Arc<Ctx>) -> Result<Action> {
    ctx.listed().await;
    let api: Api<Task> = Api::namespaced(ctx.client.clone(), &task.namespace().unwrap_or_default());
    // kube's helper adds the finalizer if missing and removes it once `cleanup` succeeds.
    finalizer(&api, TASK_FINALIZER, task.clone(), |ev| async {
        match ev {
            finalizer::Event::Apply(t) => apply(t, &ctx).await,
            finalizer::Event::Cleanup(t) => cleanup(&t, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::from_finalizer(task.as_ref(), e))
}

/// A live Task: its pod, its process and its status.
async fn apply(task: Arc<Task>, ctx: &Ctx) -> Result<Action> {
    let uid = task.uid().unwrap_or_default();
    let mine = answered(&task, ctx, &uid);
    let unwritten = mine.as_ref().is_some_and(|a| !a.written);
    let old = mine.as_ref().map_or_else(
        || task.status.clone().unwrap_or_default(),
        |a| a.status.clone(),
    );
    let mut st = old.clone();
    let mut step = Step::default();
    drive(&task, ctx, &mut st, &mut step).await?;
    if step.write_status && (st != old || unwritten) {
        // The answer is kept before the write: when the write fails (apiserver or etcd
        // down), the retry writes it again instead of sending the task the same step twice.
        // Kept until the store shows it (`answered`); any other write replaces it.
        let answer = Answer::after(st.clone(), &old, mine.as_ref());
        let keep = st.transition.is_some() || answer.is_ahead_of(task.status.as_ref());
        if keep {
            ctx.answered.insert(uid.clone(), answer);
        } else {
            ctx.answered.remove(&uid);
        }
        write_status(ctx, &task, &st).await?;
        if keep && let Some(mut a) = ctx.answered.get_mut(&uid) {
            a.written = true;
        }
        if let Some(t) = st
            .transition
            .as_ref()
            .filter(|t| old.transition.as_ref() != Some(*t))
        {
            debug!(target: "envbridge::hops", hop = "task_status_written", transition = %t.id, task = %task.name_any());
        }
    }
    if step.delete_pod && !ctx.args.keep_pods {
        let ns = task.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        delete_ignore_missing(&api, &task.name_any(), "Pod", &ns).await?;
    }
    Ok(step
        .action
        .unwrap_or_else(|| Action::requeue(Duration::from_secs(600))))
}

/// This operator's last answer for the Task, when the store does not show it yet: a
/// reconcile woken before the status write's watch event arrives (by a spec change made while
/// the previous transition was being answered, too), or after that write failed, must
/// neither send a step again nor judge against the old state ([`Answer::is_ahead_of`]).
fn answered(task: &Task, ctx: &Ctx, uid: &str) -> Option<Answer> {
    let stored = task.status.as_ref();
    // Shown and written: the store is the truth again; one answer a task held for good
    // was ~10,000 statuses at 10,000 tasks.
    ctx.answered.remove_if(uid, |_, a| a.is_shown_by(stored));
    let mine = ctx.answered.get(uid)?;
    mine.is_ahead_of(stored).then(|| mine.clone())
}

pub fn error_policy(task: Arc<Task>, err: &Error, _ctx: Arc<Ctx>) -> Action {
    if matches!(err, Error::Pending { .. }) {
        debug!(task = %task.name_any(), %err);
    } else {
        warn!(task = %task.name_any(), error = %err, "task reconcile failed, retrying");
    }
    Action::requeue(err.retry_after())
}

/// What one reconcile decided besides the new status.
#[derive(Default)]
struct Step {
    write_status: bool,
    delete_pod: bool,
    action: Option<Action>,
}

fn fail(st: &mut TaskStatus, task: &Task, message: String) {
    if st.state != Some(State::Error) || st.message.as_deref() != Some(message.as_str()) {
        info!(task = %task.name_any(), %message, "task ERROR");
    }
    st.state = Some(State::Error);
    st.message = Some(message.clone());
    // A pending transition fails with the task.
    if let Some(req) = &task.spec.transition
        && st.transition.as_ref().map(|t| &t.id) != Some(&req.id)
    {
        st.transition = Some(TransitionStatus {
            id: req.id.clone(),
            event: req.event,
            phase: TransitionPhase::Failed,
            message,
        });
    }
}

/// Observes, asks `task_step::next` what to do, and does it.
async fn drive(task: &Task, ctx: &Ctx, st: &mut TaskStatus, step: &mut Step) -> Result<()> {
    let ns = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let tref = &task.spec.task;
    step.write_status = true;
    let task_uid = task.uid().unwrap_or_default();
    let (seen, pod) = observe_task(task, ctx, st, &task_uid);
    let labels = task_labels(
        &task.spec.environment,
        tref,
        crate::crd::shard::of(task.labels()),
    );
    let pod_api = || Api::<Pod>::namespaced(ctx.client.clone(), &ns);
    let decided = task_step::next(&seen);
    let pod = match (&decided, pod) {
        (Next::ClearForeignPod { delete }, _) => {
            if *delete {
                delete_ignore_missing(&pod_api(), &name, "Pod", &ns).await?;
            }
            step.action = Some(Action::requeue(Duration::from_secs(1)));
            return Ok(());
        }
        (Next::WaitPodGone, _) => {
            step.action = Some(Action::requeue(Duration::from_secs(1)));
            return Ok(());
        }
        (Next::Hook, pod) => {
            return drive_hook(task, ctx, st, step, pod.as_deref(), &labels).await;
        }
        (Next::Idle, _) => {
            step.action = Some(Action::await_change());
            return Ok(());
        }
        (Next::Recreate, _) => {
            info!(task = %name, "RECOVER: creating a new pod");
            st.conditions.retain(|c| c.type_ != COND_ENDED);
            st.state = None;
            st.message = None;
            st.pod_phase = None;
            st.pod_ip = None;
            st.last_log = None;
            st.pod_events.clear();
            create_pod(task, ctx, st, step, &labels, None).await?;
            return Ok(());
        }
        (Next::PodVanished, _) => {
            ctx.live.unfollow(&task_uid);
            let was = st.state.unwrap_or_default();
            fail(
                st,
                task,
                format!("pod {name} disappeared while the task was {was}"),
            );
            set_condition(
                &mut st.conditions,
                COND_ENDED,
                true,
                "PodGone",
                "pod deleted",
                task.metadata.generation,
            );
            return Ok(());
        }
        (Next::AwaitStore(left), _) => {
            // Its event brings the next reconcile.
            ctx.live.unfollow(&task_uid);
            step.write_status = false;
            step.action = Some(Action::requeue(*left));
            return Ok(());
        }
        (Next::CreatePod, _) => {
            ctx.live.unfollow(&task_uid);
            create_pod(task, ctx, st, step, &labels, None).await?;
            // The pod first (it has to start), then its Service.
            if st.state != Some(State::Error) {
                ensure_service(task, ctx, &labels).await?;
            }
            return Ok(());
        }
        (_, Some(pod)) => pod,
        (_, None) => return Ok(()), // every pod-less answer is handled above
    };
    live_pod(task, ctx, st, step, decided, &seen, pod, &labels).await
}

/// What `decided` asks of a Task whose pod (of ours) is there: its Service, its process's
/// end or its control.
#[allow(clippy::too_many_arguments)]
async fn live_pod(
    task: &Task,
    ctx: &Ctx,
    st: &mut TaskStatus,
    step: &mut Step,
    decided: Next,
    seen: &Seen,
    pod: Arc<StoredPod>,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    let ns = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let tref = &task.spec.task;
    let task_uid = task.uid().unwrap_or_default();
    let pod_api = || Api::<Pod>::namespaced(ctx.client.clone(), &ns);
    ctx.requested.remove(&(POD, task_uid.clone()));
    ensure_service(task, ctx, labels).await?;
    let PodSeen::Present { view, .. } = &seen.pod else {
        return Ok(());
    };
    if decided == Next::ReplaceEndedPod {
        st.conditions.retain(|c| c.type_ != COND_ENDED);
        delete_ignore_missing(&pod_api(), &name, "Pod", &ns).await?;
        step.action = Some(Action::requeue(Duration::from_secs(1)));
        return Ok(());
    }
    record_pod(st, view, &pod);
    if matches!(
        decided,
        Next::StartupTimeout | Next::Starting { .. } | Next::BadIp(_) | Next::Control(_)
    ) {
        // A live pod: its process has not ended (a status read before a RECOVER may say so).
        st.conditions.retain(|c| c.type_ != COND_ENDED);
    }
    match decided {
        Next::Failed(failure) => process_failed(task, ctx, st, step, &pod, failure, view).await,
        Next::BasicCompleted => {
            // A basic task's process ran to completion (the anchor's basic tasks): the task
            // keeps following the environment's transitions; its pod stays until the
            // environment goes.
            if matches!(st.state, None | Some(State::Deploying)) {
                st.state = Some(State::Standby);
            }
            set_condition(
                &mut st.conditions,
                COND_ENDED,
                true,
                "Succeeded",
                "process ran to completion (exit code 0)",
                task.metadata.generation,
            );
            let deadline = ctx.args.control_deadline(tref.timeout_seconds);
            transition(task, st, None, deadline, false).await;
            step.action = Some(Action::await_change());
        }
        Next::Completed => {
            st.state = Some(State::Done);
            set_condition(
                &mut st.conditions,
                COND_ENDED,
                true,
                "Succeeded",
                "process exited with code 0",
                task.metadata.generation,
            );
            step.delete_pod = true;
            step.action = Some(Action::await_change());
        }
        Next::StartupTimeout => {
            st.state.get_or_insert(State::Deploying);
            startup_failed(task, ctx, st, step, &pod, view).await;
        }
        Next::Starting { quiet, after } => {
            st.state.get_or_insert(State::Deploying);
            if let Some(why) = &view.held {
                st.message = Some(format!("pod {}: {why}", view.phase));
            }
            step.write_status = !quiet;
            step.action = Some(Action::requeue(after));
        }
        Next::BadIp(ip) => {
            fail(st, task, format!("pod IP {ip:?} does not parse"));
        }
        Next::Control(ip) => {
            control(task, ctx, st, step, &pod, ip).await;
        }
        _ => {}
    }
    Ok(())
}

/// What a Task reconcile observes: the Task's own status and its pod as the store holds it.
fn observe_task(
    task: &Task,
    ctx: &Ctx,
    st: &TaskStatus,
    task_uid: &str,
) -> (Seen, Option<Arc<StoredPod>>) {
    let ns = task.namespace().unwrap_or_default();
    let pod = ctx.pods.get(&ObjectRef::new(&task.name_any()).within(&ns));
    let pod_seen = match &pod {
        None => PodSeen::None,
        Some(p) if !p.owner_references().iter().any(|o| o.uid == task_uid) => PodSeen::Foreign {
            deleting: p.metadata.deletion_timestamp.is_some(),
        },
        Some(p) if p.metadata.deletion_timestamp.is_some() => PodSeen::Deleting,
        Some(p) => PodSeen::Present {
            view: observe(p),
            age: pod_age(p),
        },
    };
    let seen = Seen {
        mode: task.spec.task.control_mode,
        state: st.state,
        ended: ended(st),
        recover: recover_pending(task, st),
        pod: pod_seen,
        awaiting_pod: awaiting_store(ctx, POD, task_uid),
        has_status: task.status.is_some(),
        startup_limit: Duration::from_secs(u64::from(ctx.args.startup_timeout_seconds)),
    };
    (seen, pod)
}

/// The process failed: once, its story (last log lines, the pod's Warning events) into the
/// status and an Event; the pod is kept for its logs until the environment goes (or a
/// RECOVER replaces it).
async fn process_failed(
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
async fn startup_failed(
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
async fn control(
    task: &Task,
    ctx: &Ctx,
    st: &mut TaskStatus,
    step: &mut Step,
    pod: &StoredPod,
    ip: IpAddr,
) {
    let tref = &task.spec.task;
    let task_uid = task.uid().unwrap_or_default();
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
    transition(task, st, Some((&ep, ctx)), deadline, protocol).await;
    if protocol && !ctx.args.no_live_state {
        follow_live(task, ctx, st, &ep).await;
    }
}

/// Keeps a follower on the task process while it runs, and applies what it saw.
async fn follow_live(task: &Task, ctx: &Ctx, st: &mut TaskStatus, ep: &TaskEndpoint) {
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
    ctx.live.consumed(&uid, &obs);
    let live::Verdict::Apply {
        state,
        reason,
        message,
    } = verdict
    else {
        return;
    };
    warn!(task = %task.name_any(), %state, %message, "task changed state between transitions");
    st.state = Some(state);
    st.message = Some(message.clone());
    publish(ctx, task, reason, message).await;
}

/// A Kubernetes Event on the Task (Warning: every reason published here is bad news but
/// `TaskStateChanged`).
async fn publish(ctx: &Ctx, task: &Task, reason: &str, note: String) {
    use kube::runtime::events::{Event as KEvent, EventType};
    let ev = KEvent {
        type_: if reason == "TaskStateChanged" {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: reason.into(),
        note: Some(pod_story::tail(&note, 1024)),
        action: "Observe".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &task.object_ref(&())).await {
        warn!(task = %task.name_any(), error = %e, "could not publish event");
    }
}

/// A state read to confirm what a follower saw (direct GetState takes ~1 s while RUNNING).
const LIVE_READ_DEADLINE: Duration = Duration::from_secs(3);

/// How long after a failure the pod's Warning events are looked for again while none is seen.
const EVENTS_GRACE: Duration = Duration::from_secs(5);

/// How long ago the task's process ended (zero when unknown or not ended).
fn ended_for(st: &TaskStatus) -> Duration {
    st.conditions
        .iter()
        .find(|c| c.type_ == COND_ENDED && c.status == "True")
        .and_then(|c| {
            Duration::try_from(jiff::Timestamp::now().duration_since(c.last_transition_time.0)).ok()
        })
        .unwrap_or_default()
}

fn ended(st: &TaskStatus) -> bool {
    st.conditions
        .iter()
        .any(|c| c.type_ == COND_ENDED && c.status == "True")
}

/// A RECOVER not yet answered while the task is in ERROR.
fn recover_pending(task: &Task, st: &TaskStatus) -> bool {
    st.state == Some(State::Error)
        && task.spec.transition.as_ref().is_some_and(|req| {
            req.event == Event::Recover && st.transition.as_ref().map(|t| &t.id) != Some(&req.id)
        })
}

/// A hook task: no pod while idle; when its Environment gives it a transition that
/// triggers it (the environment controller decides when, see `hooks`), one pod runs to
/// completion; its end (or `timeoutSeconds`) answers the transition. STANDBY idle, RUNNING
/// while the pod runs, back to STANDBY after; ERROR when it failed and is critical (until the
/// environment's next transition).
async fn drive_hook(
    task: &Task,
    ctx: &Ctx,
    st: &mut TaskStatus,
    step: &mut Step,
    pod: Option<&StoredPod>,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    let ns = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let tref = &task.spec.task;
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let trigger = tref.trigger.as_deref().unwrap_or("");
    let pending = task
        .spec
        .transition
        .as_ref()
        .filter(|r| st.transition.as_ref().map(|t| &t.id) != Some(&r.id));
    let run_of = |p: &StoredPod| p.annotations().get(HOOK_RUN).cloned();
    // A bad trigger/await is reported here (the gate never starts such a hook); it also
    // answers a pending transition as failed.
    let bad = hooks::parse_moment("trigger", trigger).err().or_else(|| {
        tref.r#await
            .as_deref()
            .and_then(|a| hooks::parse_moment("await", a).err())
    });
    if let Some(e) = bad {
        fail(st, task, format!("hook task: {e}"));
        step.action = Some(Action::await_change());
        return Ok(());
    }
    let Some(req) = pending else {
        if matches!(st.state, None | Some(State::Deploying | State::Running)) {
            st.state = Some(State::Standby);
        }
        // A pod left over (abandoned run, or ended and kept): a running one goes.
        if let Some(p) = pod {
            let v = observe(p);
            if !(ctx.args.keep_pods && (v.succeeded || v.failure.is_some())) {
                delete_ignore_missing(&api, &name, "Pod", &ns).await?;
            }
        }
        step.action = Some(Action::await_change());
        return Ok(());
    };
    let answer = |st: &mut TaskStatus, phase, message: String| {
        st.transition = Some(TransitionStatus {
            id: req.id.clone(),
            event: req.event,
            phase,
            message,
        });
    };
    if !hooks::in_transition(trigger, req.event) {
        // Not triggered by this transition: answered without running; a failure of an
        // earlier run is cleared.
        answer(st, TransitionPhase::Succeeded, String::new());
        if matches!(
            st.state,
            None | Some(State::Deploying | State::Running | State::Error)
        ) {
            st.state = Some(State::Standby);
            st.message = None;
        }
        step.action = Some(Action::requeue(Duration::from_secs(1)));
        return Ok(());
    }
    let deadline = ctx.args.control_deadline(tref.timeout_seconds);
    let pod = match pod {
        // A pod of an earlier run (kept, or being deleted): gone first.
        Some(p) if run_of(p).as_deref() != Some(req.id.as_str()) => {
            if p.metadata.deletion_timestamp.is_none() {
                delete_ignore_missing(&api, &name, "Pod", &ns).await?;
            }
            step.action = Some(Action::requeue(Duration::from_secs(1)));
            return Ok(());
        }
        Some(p) => p,
        None => {
            info!(task = %name, transition = %req.id, event = %req.event, "hook: starting its pod");
            create_pod(task, ctx, st, step, labels, Some(&req.id)).await?;
            if st.state != Some(State::Error) {
                st.state = Some(State::Running);
                st.message = None;
                st.pod_phase = None;
                step.write_status = true;
                step.action = Some(Action::requeue(deadline));
            }
            return Ok(());
        }
    };
    let view = observe(pod);
    record_pod(st, &view, pod);
    let age = pod_age(pod);
    let failure = match (view.failure, view.succeeded) {
        (Some(f), _) => Some(f),
        (None, true) => None,
        (None, false) if age >= deadline => {
            // Still running at its deadline: stopped (even with --keep-pods).
            delete_ignore_missing(&api, &name, "Pod", &ns).await?;
            Some(format!("timed out after {}s", deadline.as_secs()))
        }
        (None, false) => {
            st.state = Some(State::Running);
            step.action = Some(Action::requeue(deadline - age));
            return Ok(());
        }
    };
    match failure {
        None => {
            info!(task = %name, transition = %req.id, "hook succeeded");
            answer(st, TransitionPhase::Succeeded, String::new());
            st.state = Some(State::Standby);
            st.message = None;
        }
        Some(why) => {
            warn!(task = %name, transition = %req.id, critical = tref.critical, %why, "hook failed");
            answer(st, TransitionPhase::Failed, why.clone());
            if tref.critical {
                st.state = Some(State::Error);
                st.message = Some(format!("hook failed: {why}"));
            } else {
                st.state = Some(State::Standby);
                st.message = Some(format!("hook failed (not critical): {why}"));
            }
        }
    }
    step.delete_pod = true;
    step.action = Some(Action::await_change());
    Ok(())
}

/// Pod annotation: the transition id a hook task's pod runs for.
pub const HOOK_RUN: &str = "envbridge.dev/hook-run";

/// Performs the task's pending transition (the one whose id its status has not recorded).
async fn transition(
    task: &Task,
    st: &mut TaskStatus,
    ep: Option<(&TaskEndpoint, &Ctx)>,
    deadline: Duration,
    protocol: bool,
) {
    let Some(req) = &task.spec.transition else {
        return;
    };
    if st.transition.as_ref().is_some_and(|t| t.id == req.id) {
        return;
    }
    let Some(from) = st.state.filter(|s| *s != State::Deploying) else {
        return;
    };
    let done = |phase, message: String| TransitionStatus {
        id: req.id.clone(),
        event: req.event,
        phase,
        message,
    };
    // The anchor's GO_ERROR: the environment goes to ERROR; a task still RUNNING is stopped
    // (STOP with the STOP keys), the others keep their state. No process knows GO_ERROR.
    let (event, target) = match req.event {
        Event::GoError if from != State::Running => (Event::GoError, from),
        Event::GoError => (Event::Stop, State::Configured),
        e => (e, req.target()),
    };
    if from == target {
        st.transition = Some(done(TransitionPhase::Succeeded, String::new()));
        return;
    }
    if next(from, event).is_none() {
        let msg = format!("{} does not apply in state {from}", req.event);
        st.transition = Some(done(TransitionPhase::Failed, msg));
        return;
    }
    let (true, Some((ep, ctx))) = (protocol, ep) else {
        st.state = Some(target);
        st.transition = Some(done(TransitionPhase::Succeeded, String::new()));
        return;
    };
    let args = match req.event {
        Event::GoError => transition_args::go_error_stop(&req.arguments),
        e => transition_args::arguments(e, &task.spec.task, &req.arguments),
    };
    let uid = task.uid().unwrap_or_default();
    debug!(target: "envbridge::hops", hop = "task_call", transition = %req.id, task = %task.name_any());
    let result = {
        let _call = ctx.live.calling(&uid);
        ctx.control
            .transition(ep, from, event, &args, deadline)
            .await
    };
    debug!(target: "envbridge::hops", hop = "task_answered", transition = %req.id, task = %task.name_any());
    match result {
        Ok(reached) if reached == target => {
            st.state = Some(reached);
            st.message = None;
            st.transition = Some(done(TransitionPhase::Succeeded, String::new()));
        }
        Ok(reached) => {
            let msg = format!("{} ended in {reached}, expected {target}", req.event);
            st.state = Some(reached);
            if reached == State::Error {
                st.message = Some(msg.clone());
            }
            st.transition = Some(done(TransitionPhase::Failed, msg));
        }
        Err(e) => {
            let msg = format!("{} failed: {e}", req.event);
            fail(st, task, msg.clone());
            st.transition = Some(done(TransitionPhase::Failed, msg));
        }
    }
}

/// Drops the control client's cached channel to a task whose process is gone.
fn forget_endpoint(task: &Task, control: &ControlClient) {
    let ip = task
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok());
    if let Some(ip) = ip {
        control.forget(&SocketAddr::new(ip, task.spec.task.control_port));
    }
}

const POD: &str = "Pod";
const SERVICE: &str = "Service";
const POD_DELETION: &str = "Pod deletion";
const SERVICE_DELETION: &str = "Service deletion";

/// Time left to wait when this operator sent the request `what` for the task moments ago.
fn awaiting_store(ctx: &Ctx, what: &'static str, task_uid: &str) -> Option<Duration> {
    ctx.awaiting_store(what, task_uid)
}

fn pod_age(pod: &StoredPod) -> Duration {
    match pod.metadata.creation_timestamp.as_ref() {
        Some(t) => {
            Duration::try_from(jiff::Timestamp::now().duration_since(t.0)).unwrap_or_default()
        }
        None => Duration::ZERO,
    }
}

fn running_for(pod: &StoredPod) -> Duration {
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .or(pod.metadata.creation_timestamp.as_ref())
        .map(|t| t.0);
    match started {
        Some(t) => Duration::try_from(jiff::Timestamp::now().duration_since(t)).unwrap_or_default(),
        None => Duration::ZERO,
    }
}

async fn create_pod(
    task: &Task,
    ctx: &Ctx,
    st: &mut TaskStatus,
    step: &mut Step,
    labels: &std::collections::BTreeMap<String, String>,
    hook_run: Option<&str>,
) -> Result<()> {
    let ns = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let tref = &task.spec.task;
    let mut annotations = task_annotations(tref);
    if let Some(run) = hook_run {
        annotations.insert(HOOK_RUN.into(), run.into());
    }
    let node = match resolve(
        &tref.node,
        ctx.nodes
            .state()
            .iter()
            .map(|n| {
                (
                    n.metadata.name.as_deref().unwrap_or(""),
                    n.metadata.labels.as_ref(),
                )
            })
            .collect::<Vec<_>>(),
    ) {
        Ok(n) => n,
        Err(e) => {
            fail(st, task, e.to_string());
            // Nodes may appear later: look again from time to time.
            step.action = Some(Action::requeue(Duration::from_secs(15)));
            return Ok(());
        }
    };
    let Some(template) = ctx.templates.get(&ObjectRef::new(&tref.template)) else {
        fail(
            st,
            task,
            format!("TaskTemplate {:?} not found", tref.template),
        );
        step.action = Some(Action::requeue(Duration::from_secs(15)));
        return Ok(());
    };
    let pod = match build_pod(
        task,
        &tref.template,
        &template.spec,
        &node,
        labels,
        &annotations,
        &ctx.pod_settings,
    ) {
        Ok(p) => p,
        Err(e) => {
            fail(st, task, e.to_string());
            step.action = Some(Action::requeue(Duration::from_secs(30)));
            return Ok(());
        }
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    match api
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &pod,
        )
        .await
    {
        Ok(_) => debug!(task = %name, %node, "pod created"),
        // Created before (store lag, or by an earlier operator run): re-attached, never duplicated.
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(Error::kube("create", "Pod", &ns, &name, e)),
    }
    ctx.requested.insert(
        (POD, task.uid().unwrap_or_default()),
        std::time::Instant::now(),
    );
    if st.state == Some(State::Error) && st.message.is_some() {
        // An earlier node or template problem is solved now.
        st.state = None;
        st.message = None;
    }
    // The pod's own events bring the next reconcile, which writes the status (one write
    // per task instead of two while pods start).
    step.write_status = st.state.is_none() && task.status.is_some();
    if step.write_status {
        st.state = Some(State::Deploying);
        st.node_name = Some(node);
    }
    step.action = Some(Action::requeue(Duration::from_secs(60)));
    Ok(())
}

async fn ensure_service(
    task: &Task,
    ctx: &Ctx,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    let ns = task.namespace().unwrap_or_default();
    let port = ctx.args.headless_discovery_port;
    let sname = service_name(&task.name_any());
    let key = (SERVICE, task.uid().unwrap_or_default());
    if let Some(svc) = ctx.services.get(&ObjectRef::new(&sname).within(&ns)) {
        ctx.requested.remove(&key);
        if service_matches(&svc, port) {
            return Ok(());
        }
    } else if awaiting_store(ctx, SERVICE, &key.1).is_some() {
        return Ok(());
    }
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let svc = build_service(task, labels, port);
    let exists = ctx
        .services
        .get(&ObjectRef::new(&sname).within(&ns))
        .is_some();
    let res = if exists {
        let mut body = serde_json::to_value(&svc).unwrap_or_default();
        body["apiVersion"] = json!("v1");
        body["kind"] = json!("Service");
        api.patch(
            &sname,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map(|_| ())
    } else {
        api.create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            &svc,
        )
        .await
        .map(|_| ())
    };
    match res {
        Ok(()) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(Error::kube("write", "Service", &ns, &sname, e)),
    }
    if !exists {
        ctx.requested.insert(key, std::time::Instant::now());
    }
    Ok(())
}

async fn write_status(ctx: &Ctx, task: &Task, st: &TaskStatus) -> Result<()> {
    let ns = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let api: Api<Task> = Api::namespaced(ctx.client.clone(), &ns);
    let mut st = st.clone();
    st.observed_generation = task.metadata.generation;
    // The whole status, replaced: only this operator writes it, and a JSON patch is far
    // lighter for the apiserver than a server-side apply (the transition's path waits on it).
    let patch = json_patch::Patch(vec![json_patch::PatchOperation::Add(
        json_patch::AddOperation {
            path: json_patch::jsonptr::PointerBuf::from_tokens(["status"]),
            value: serde_json::to_value(&st).unwrap_or_default(),
        },
    )]);
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    match api
        .patch_status(&name, &pp, &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube("patch status of", "Task", &ns, &name, e)),
    }
}

/// Deletes the task's Pod and Service; `Pending` until both are gone, then the Task may go.
async fn cleanup(task: &Task, ctx: &Ctx) -> Result<Action> {
    let ns = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let sname = service_name(&name);
    let uid = task.uid().unwrap_or_default();
    let pod = ctx.pods.get(&ObjectRef::new(&name).within(&ns));
    let svc = ctx.services.get(&ObjectRef::new(&sname).within(&ns));
    // One delete each: while the store has not shown the deletion yet, not another.
    if let Some(p) = &pod
        && p.metadata.deletion_timestamp.is_none()
        && awaiting_store(ctx, POD_DELETION, &uid).is_none()
    {
        ctx.live.unfollow(&uid);
        take_out(task, ctx, p).await;
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
            match api
                .delete(&name, &kube::api::DeleteParams::default().grace_period(0))
                .await
            {
                Ok(_) => {}
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
        super::context::TASK_DELETION,
    ] {
        ctx.requested.remove(&(what, uid.clone()));
    }
    ctx.verified.remove(&uid);
    ctx.answered.remove(&uid);
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
async fn take_out(task: &Task, ctx: &Ctx, pod: &StoredPod) {
    let tref = &task.spec.task;
    if !matches!(tref.control_mode, ControlMode::Direct | ControlMode::Fairmq) {
        return;
    }
    let Some(mut at) = task.status.as_ref().and_then(|s| s.state) else {
        return;
    };
    let view = observe(pod);
    let (Some(Ok(ip)), "Running") = (
        view.ip.as_deref().map(str::parse::<IpAddr>),
        view.phase.as_str(),
    ) else {
        return;
    };
    let ep = TaskEndpoint {
        addr: SocketAddr::new(ip, tref.control_port),
        mode: tref.control_mode,
    };
    let name = task.name_any();
    let budget = Duration::from_secs(u64::from(ctx.args.shutdown_timeout_seconds));
    let deadline = ctx.args.control_deadline(tref.timeout_seconds).min(budget);
    let steps = async {
        for event in take_out_events(at) {
            match ctx.control.transition(&ep, at, *event, &[], deadline).await {
                Ok(reached) => at = reached,
                Err(e) => {
                    warn!(task = %name, %event, error = %e, "taking the task out: refused; its pod goes anyway");
                    return;
                }
            }
        }
        info!(task = %name, state = %at, "task taken out before its pod is deleted");
    };
    if tokio::time::timeout(budget, steps).await.is_err() {
        warn!(task = %name, timeout = ?budget, "taking the task out timed out; its pod goes anyway");
    }
}

/// What the Task's status shows of its pod: phase, IP and node.
fn record_pod(st: &mut TaskStatus, view: &PodView, pod: &StoredPod) {
    st.pod_phase = Some(view.phase.clone());
    st.pod_ip = view.ip.clone();
    st.node_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .or(st.node_name.take());
}

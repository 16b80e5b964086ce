//! Task controller: Task -> Pod (+ headless Service) on the resolved node; pod phase and early
//! failures -> Task status; task control (dial the process, drive transitions); cleanup.
//! Here the reconcile and what it observes; the rest in `objects` (the pod and Service),
//! `process` (control, failures, following), `hook` (hook tasks), `cleanup` (a deleted Task)
//! and `outcome` (a reconcile's decision, a task's failure, its Events).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use super::context::{Answer, Ctx};
use super::env_controller::set_condition;
use super::names::task_labels;
use super::pod_status::observe;
use super::stored_pod::StoredPod;
use super::task_sets::TASK_FINALIZER;
use super::task_step::{self, Next, PodSeen, Seen};
use super::{Error, FIELD_MANAGER, Result, delete_ignore_missing, unread};
use crate::crd::{Task, TaskStatus};
use crate::state::State;

use cleanup::cleanup;
pub use cleanup::take_out_events;
use hook::drive_hook;
pub use objects::HOOK_RUN;
use objects::{POD, awaiting_store, create_pod, ensure_service, pod_age, record_pod};
pub use outcome::COND_ENDED;
use outcome::{Step, fail};
use process::{
    control, ended, process_failed, recover_pending, settle, startup_failed, transition,
};

mod cleanup;
mod hook;
mod objects;
mod outcome;
mod process;

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
    if let Some(change) = step.live_change.take() {
        change.told(ctx, &task).await;
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

/// Observes, asks `task_step::next` what to do, and does it.
async fn drive(task: &Task, ctx: &Ctx, st: &mut TaskStatus, step: &mut Step) -> Result<()> {
    let ns = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let tref = &task.spec.task;
    step.write_status = true;
    let task_uid = task.uid().unwrap_or_default();
    settle(task, ctx, st);
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
            ctx.transitions.forget(&task_uid);
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
            ctx.transitions.forget(&task_uid);
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
            ctx.transitions.forget(&task_uid);
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
        ctx.transitions.forget(&task_uid);
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
            transition(task, st, None, deadline, false);
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
    match unread::patch_status(&api, &name, &pp, &Patch::<()>::Json(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube("patch status of", "Task", &ns, &name, e)),
    }
}

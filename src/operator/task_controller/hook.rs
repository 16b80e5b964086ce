//! Hook tasks: one pod per triggering transition, run to completion.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use super::objects::{HOOK_RUN, create_pod, pod_age, record_pod};
use super::outcome::{Step, fail};
use crate::crd::{Task, TaskStatus, TransitionPhase, TransitionStatus};
use crate::operator::context::Ctx;
use crate::operator::hooks;
use crate::operator::pod_status::observe;
use crate::operator::stored_pod::StoredPod;
use crate::operator::{Result, delete_ignore_missing};
use crate::state::State;

/// A hook task: no pod while idle; when its Environment gives it a transition that
/// triggers it (the environment controller decides when, see `hooks`), one pod runs to
/// completion; its end (or `timeoutSeconds`) answers the transition. STANDBY idle, RUNNING
/// while the pod runs, back to STANDBY after; ERROR when it failed and is critical (until the
/// environment's next transition).
pub(super) async fn drive_hook(
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

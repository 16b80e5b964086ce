//! An Environment's status from its Tasks as stored: the summary, its writes, its Events,
//! its conditions.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event as KEvent, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::warn;

use super::gate::{deploy_calls, deploy_failures, hook_gate, hook_transition_status};
use crate::crd::{Environment, EnvironmentStatus, Task};
use crate::operator::aggregate::aggregate;
use crate::operator::calls;
use crate::operator::context::Ctx;
use crate::operator::{Error, FIELD_MANAGER, Result, unread};
use crate::plan::{ControlMode, TaskRef};
use crate::state::State;

/// The environment's status from its Tasks as stored (the operator's aggregation, the one
/// owner of a transition's outcome) and its deployment calls.
pub(super) fn summarize(
    ctx: &Ctx,
    env: &Environment,
    refs: &[&TaskRef],
    tasks: &[Arc<Task>],
    has_hooks: bool,
    status: &mut EnvironmentStatus,
) {
    let task_refs: Vec<&Task> = tasks.iter().map(|t| t.as_ref()).collect();
    // Every referenced task counts: one not (yet) in the store is DEPLOYING, so a lagging
    // store never makes the environment look complete early.
    let expected = refs
        .iter()
        .filter(|r| r.control_mode != ControlMode::Hook)
        .count();
    let agg = aggregate(
        env.spec.desired_state,
        env.spec.transition.as_ref(),
        &task_refs,
        expected,
    );
    status.state = Some(agg.state);
    status.counts = agg.counts;
    status.ready = Some(agg.ready);
    status.failing_tasks = agg.failing_tasks;
    status.failing_count = (agg.failing_count > 0).then_some(agg.failing_count as u32);
    // Once deployed (every task STANDBY, no transition asked yet): the calls after it; and
    // whatever a deployment call said (a critical failure makes the environment ERROR).
    if env.spec.transition.is_none() && agg.state == State::Standby {
        let _ = deploy_calls(ctx, env, calls::DeployStep::After);
    }
    let failed_calls = deploy_failures(ctx, env);
    let critical_calls = failed_calls.iter().filter(|f| f.critical).count();
    if critical_calls > 0 {
        status.state = Some(State::Error);
    }
    let critical = agg.failing_critical + critical_calls;
    status.failing_critical = (critical > 0).then_some(critical as u32);
    status.failing_tasks.extend(failed_calls);
    status.transition = match &env.spec.transition {
        Some(req) if has_hooks => {
            let (gate, _, _) = hook_gate(ctx, env, req, refs, tasks);
            Some(hook_transition_status(req, &gate.outcome))
        }
        _ => agg.transition,
    };
}

/// The environment's Tasks as stored (by the index), owned by this very Environment.
pub(super) fn own_tasks(ctx: &Ctx, env: &Environment) -> Vec<Arc<Task>> {
    let uid = env.uid().unwrap_or_default();
    ctx.tasks_of(&env.namespace().unwrap_or_default(), &env.name_any())
        .into_iter()
        .filter(|t| t.owner_references().iter().any(|o| o.uid == uid))
        .collect()
}

/// Sets a condition; its lastTransitionTime changes only when its status does (no spinning).
pub fn set_condition(
    conds: &mut Vec<Condition>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let status = if ok { "True" } else { "False" };
    let time = match conds.iter().find(|c| c.type_ == type_) {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(jiff::Timestamp::now()),
    };
    let cond = Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: time,
    };
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(slot) => *slot = cond,
        None => conds.push(cond),
    }
}

/// Writes status (server-side apply) only when it differs from what is stored.
pub(super) async fn write_status(
    ctx: &Ctx,
    api: &Api<Environment>,
    env: &Environment,
    old: &EnvironmentStatus,
    status: EnvironmentStatus,
) -> Result<()> {
    if &status == old {
        return Ok(());
    }
    let name = env.name_any();
    let patch =
        json!({"apiVersion": crate::crd::API_VERSION, "kind": "Environment", "status": status});
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let _ = ctx;
    unread::patch_status(api, &name, &pp, &Patch::Apply(&patch))
        .await
        .map_err(|e| {
            Error::kube(
                "patch status of",
                "Environment",
                &env.namespace().unwrap_or_default(),
                &name,
                e,
            )
        })?;
    Ok(())
}

pub(super) async fn publish_changes(
    ctx: &Ctx,
    env: &Environment,
    old: &EnvironmentStatus,
    new: &EnvironmentStatus,
) {
    let reference = env.object_ref(&());
    for (type_, reason, note) in status_events(old, new) {
        let ev = KEvent {
            type_,
            reason,
            note: Some(crate::operator::bounded::head(&note, 1000).to_string()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
            warn!(env = %env.name_any(), error = %e, "could not publish event");
        }
    }
}

/// The Events a status change deserves. The recorder folds events of equal reason into one
/// series, so the reason names the new state (`StateStandby`) or the transition outcome
/// (`ConfigureSucceeded`).
pub(super) fn status_events(
    old: &EnvironmentStatus,
    new: &EnvironmentStatus,
) -> Vec<(EventType, String, String)> {
    let mut events = Vec::new();
    if old.state != new.state
        && let Some(state) = new.state
    {
        let from = old
            .state
            .map(|s| s.to_string())
            .unwrap_or_else(|| "none".into());
        let ready = new.ready.clone().unwrap_or_default();
        let reason = format!("State{}", pascal(state.as_str()));
        if state == State::Error {
            let names: Vec<String> = new
                .failing_tasks
                .iter()
                .filter(|f| f.critical)
                .map(|f| format!("{} ({})", f.name, f.message))
                .collect();
            events.push((
                EventType::Warning,
                reason,
                format!("{from} -> ERROR: {}", names.join("; ")),
            ));
        } else {
            events.push((
                EventType::Normal,
                reason,
                format!("{from} -> {state} (ready {ready})"),
            ));
        }
    }
    if let Some(tr) = &new.transition
        && old.transition.as_ref().map(|o| (&o.id, o.phase)) != Some((&tr.id, tr.phase))
    {
        use crate::crd::TransitionPhase::*;
        let (ty, outcome) = match tr.phase {
            Running => (EventType::Normal, "Running"),
            // Non-critical hook tasks failed: a warning.
            Succeeded if !tr.message.is_empty() => (EventType::Warning, "SucceededWithWarnings"),
            Succeeded => (EventType::Normal, "Succeeded"),
            Failed => (EventType::Warning, "Failed"),
        };
        let reason = format!("{}{outcome}", pascal(tr.event.as_str()));
        let note = if tr.message.is_empty() {
            format!("{} {}", tr.event, tr.id)
        } else {
            format!("{} {}: {}", tr.event, tr.id, tr.message)
        };
        events.push((ty, reason, note));
    }
    events
}

/// `GO_ERROR` -> `GoError`.
pub(super) fn pascal(s: &str) -> String {
    s.split('_')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + &c.as_str().to_ascii_lowercase(),
                None => String::new(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{FailingTask, TransitionPhase, TransitionStatus};
    use crate::state::Event;

    #[test]
    fn events_name_the_new_state_and_the_transition_outcome() {
        let old = EnvironmentStatus {
            state: Some(State::Mixed),
            ..Default::default()
        };
        let new = EnvironmentStatus {
            state: Some(State::Error),
            failing_tasks: vec![FailingTask {
                name: "t1".into(),
                critical: true,
                message: "boom".into(),
                ..Default::default()
            }],
            transition: Some(TransitionStatus {
                id: "x".into(),
                event: Event::GoError,
                phase: TransitionPhase::Failed,
                message: "m".into(),
            }),
            ..Default::default()
        };
        let ev = status_events(&old, &new);
        assert_eq!(ev[0].1, "StateError");
        assert_eq!(ev[0].2, "MIXED -> ERROR: t1 (boom)");
        assert_eq!(
            (ev[1].0, ev[1].1.as_str(), ev[1].2.as_str()),
            (EventType::Warning, "GoErrorFailed", "GO_ERROR x: m")
        );
        assert!(status_events(&new, &new).is_empty());
        let mut cond = Vec::new();
        set_condition(&mut cond, "A", true, "R", "m", Some(1));
        let t0 = cond[0].last_transition_time.clone();
        set_condition(&mut cond, "A", true, "R2", "m2", Some(2));
        assert_eq!(
            cond[0].last_transition_time, t0,
            "time kept while the status holds"
        );
        assert_eq!(cond[0].reason, "R2");
    }
}

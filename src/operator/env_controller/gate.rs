//! What a transition waits for: the hook gate (hook tasks and calls before and after the
//! tasks) and the deployment's calls.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kube::ResourceExt;

use crate::crd::{Environment, Task, TransitionPhase, TransitionRequest, TransitionStatus};
use crate::operator::aggregate::aggregate;
use crate::operator::context::Ctx;
use crate::operator::{calls, hooks};
use crate::plan::{ControlMode, TaskRef};

/// The hook gate of transition `req` from the environment's Tasks as stored and its calls
/// as they stand: the gate, the names of the hook tasks to start now, and the calls to send
/// now (indices into `spec.hooks`).
pub(super) fn hook_gate(
    ctx: &Ctx,
    env: &Environment,
    req: &TransitionRequest,
    refs: &[&TaskRef],
    tasks: &[Arc<Task>],
) -> (hooks::Gate, HashSet<String>, Vec<usize>) {
    let by_name: HashMap<&str, &Task> = tasks
        .iter()
        .filter_map(|t| t.metadata.name.as_deref().map(|n| (n, t.as_ref())))
        .collect();
    let hook_refs: Vec<&TaskRef> = refs
        .iter()
        .copied()
        .filter(|r| r.control_mode == ControlMode::Hook)
        .collect();
    let env_uid = env.uid().unwrap_or_default();
    let mut list: Vec<hooks::Hook> = hook_refs
        .iter()
        .map(|r| hooks::Hook {
            kind: "hook task",
            name: &r.name,
            trigger: r.trigger.as_deref().unwrap_or(""),
            await_: r.r#await.as_deref(),
            critical: r.critical,
            run: hook_run(by_name.get(r.name.as_str()).copied(), req),
        })
        .collect();
    let first_call = list.len();
    list.extend(env.spec.hooks.iter().map(|c| hooks::Hook {
        kind: "call",
        name: &c.path,
        trigger: c.trigger.as_deref().unwrap_or(""),
        await_: c.r#await.as_deref(),
        critical: c.critical,
        run: ctx.calls.run_of(&env_uid, &req.id, &c.path),
    }));
    // The non-hook tasks' part of the transition, as the aggregate sees it.
    let plain: Vec<&Task> = by_name.values().copied().collect();
    let expected = refs.len() - hook_refs.len();
    let tasks_tr = aggregate(env.spec.desired_state, Some(req), &plain, expected).transition;
    let tasks = match tasks_tr {
        Some(t) if t.phase == TransitionPhase::Succeeded => hooks::Tasks::Succeeded,
        Some(t) if t.phase == TransitionPhase::Failed => hooks::Tasks::Failed(t.message),
        Some(t) => hooks::Tasks::Waiting(t.message),
        None => hooks::Tasks::Waiting(String::new()),
    };
    let gate = hooks::gate(req.event, &list, &tasks);
    let start = gate
        .start
        .iter()
        .filter(|i| **i < first_call)
        .map(|i| list[*i].name.to_string())
        .collect();
    let calls = gate
        .start
        .iter()
        .filter(|i| **i >= first_call)
        .map(|i| i - first_call)
        .collect();
    (gate, start, calls)
}

/// Where the deployment's calls of one step stand.
pub(super) enum DeployCalls {
    /// Some awaited at this step are still in flight.
    Pending,
    /// Critical ones failed (as failing entries of the status, named by the call's path).
    Failed(Vec<crate::crd::FailingTask>),
    Done,
}

/// Sends the calls of deployment step `step` (once) and tells whether those awaited at it have
/// ended. A call is awaited at its `await` (default: its trigger).
pub(super) fn deploy_calls(ctx: &Ctx, env: &Environment, step: calls::DeployStep) -> DeployCalls {
    let uid = env.uid().unwrap_or_default();
    let mut pending = false;
    for c in &env.spec.hooks {
        let trigger = c.trigger.as_deref().unwrap_or("");
        if calls::deploy_step(trigger) != Some(step) {
            continue;
        }
        if ctx.calls.run_of(&uid, calls::DEPLOY, &c.path) == hooks::Run::Idle {
            ctx.calls.start_at(calls::DEPLOY, &uid, &env.spec.id, c);
        }
        let awaited = calls::deploy_step(c.r#await.as_deref().unwrap_or(trigger)) == Some(step);
        if awaited && ctx.calls.run_of(&uid, calls::DEPLOY, &c.path) == hooks::Run::Started {
            pending = true;
        }
    }
    let failed: Vec<_> = deploy_failures(ctx, env)
        .into_iter()
        .filter(|f| f.critical)
        .collect();
    match (pending, failed.is_empty()) {
        (true, _) => DeployCalls::Pending,
        (false, false) => DeployCalls::Failed(failed),
        (false, true) => DeployCalls::Done,
    }
}

/// The deployment's calls that failed, as failing entries (node empty: a call is no task).
pub(super) fn deploy_failures(ctx: &Ctx, env: &Environment) -> Vec<crate::crd::FailingTask> {
    let uid = env.uid().unwrap_or_default();
    env.spec
        .hooks
        .iter()
        .filter_map(|c| match ctx.calls.run_of(&uid, calls::DEPLOY, &c.path) {
            hooks::Run::Failed(why) => Some(crate::crd::FailingTask {
                name: format!("call {}", c.path),
                node: String::new(),
                path: c.path.clone(),
                critical: c.critical,
                message: format!("{} at deployment: {why}", c.func),
            }),
            _ => None,
        })
        .collect()
}

/// Where hook task `t` stands in transition `req`: its status answered the id (ended), or
/// its spec carries the id (started), or neither.
pub(super) fn hook_run(t: Option<&Task>, req: &TransitionRequest) -> hooks::Run {
    let Some(t) = t else {
        return hooks::Run::Idle;
    };
    let answered = t
        .status
        .as_ref()
        .and_then(|s| s.transition.as_ref())
        .filter(|tr| tr.id == req.id);
    match answered {
        Some(tr) if tr.phase == TransitionPhase::Failed => hooks::Run::Failed(tr.message.clone()),
        Some(tr) if tr.phase == TransitionPhase::Succeeded => hooks::Run::Succeeded,
        _ if t.spec.transition.as_ref().is_some_and(|x| x.id == req.id) => hooks::Run::Started,
        _ => hooks::Run::Idle,
    }
}

/// The transition a Task gets under the hook gate: once given it stays; plain tasks get it
/// when the gate releases them; hooks when the gate starts them, or at once when the
/// transition does not trigger them (they answer it without running).
pub(super) fn gated_transition(
    r: &TaskRef,
    existing: Option<&Task>,
    req: &TransitionRequest,
    gate: &hooks::Gate,
    start: &HashSet<String>,
) -> Option<TransitionRequest> {
    let had = existing.and_then(|t| t.spec.transition.clone());
    let give = had.as_ref().is_some_and(|h| h.id == req.id)
        || if r.control_mode == ControlMode::Hook {
            start.contains(&r.name)
                || !hooks::in_transition(r.trigger.as_deref().unwrap_or(""), req.event)
        } else {
            gate.release_tasks
        };
    if give { Some(req.clone()) } else { had }
}

pub(super) fn hook_transition_status(
    req: &TransitionRequest,
    outcome: &hooks::Outcome,
) -> TransitionStatus {
    let (phase, message) = match outcome {
        hooks::Outcome::Running(m) => (TransitionPhase::Running, m.clone()),
        hooks::Outcome::Succeeded { warnings } if warnings.is_empty() => {
            (TransitionPhase::Succeeded, String::new())
        }
        hooks::Outcome::Succeeded { warnings } => (
            TransitionPhase::Succeeded,
            format!("warning: {}", warnings.join("; ")),
        ),
        hooks::Outcome::Failed(m) => (TransitionPhase::Failed, m.clone()),
    };
    TransitionStatus {
        id: req.id.clone(),
        event: req.event,
        phase,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::TransitionPhase;
    use crate::state::Event;

    #[test]
    fn gated_transitions_are_given_once_and_kept() {
        let req = |id: &str| TransitionRequest {
            id: id.into(),
            event: Event::Configure,
            arguments: Default::default(),
        };
        let plain = TaskRef {
            name: "a".into(),
            ..Default::default()
        };
        let hook = TaskRef {
            name: "h".into(),
            control_mode: ControlMode::Hook,
            trigger: Some("before_CONFIGURE".into()),
            ..Default::default()
        };
        let held = hooks::Gate {
            start: vec![0],
            release_tasks: false,
            outcome: hooks::Outcome::Running(String::new()),
        };
        let start = HashSet::from(["h".to_string()]);
        let with = |tr: Option<TransitionRequest>| {
            let mut t = Task::new("a", Default::default());
            t.spec.transition = tr;
            t
        };
        let old = with(Some(req("old")));
        // Held back: the plain task keeps what it had; the started hook gets it.
        assert_eq!(
            gated_transition(&plain, Some(&old), &req("new"), &held, &start),
            Some(req("old"))
        );
        assert_eq!(
            gated_transition(&plain, None, &req("new"), &held, &start),
            None
        );
        assert_eq!(
            gated_transition(&hook, Some(&old), &req("new"), &held, &start),
            Some(req("new"))
        );
        assert_eq!(
            gated_transition(&hook, Some(&old), &req("new"), &held, &HashSet::new()),
            Some(req("old"))
        );
        // Once given, never taken back; released tasks get it.
        let given = with(Some(req("new")));
        assert_eq!(
            gated_transition(&plain, Some(&given), &req("new"), &held, &start),
            Some(req("new"))
        );
        let released = hooks::Gate {
            release_tasks: true,
            ..held.clone()
        };
        assert_eq!(
            gated_transition(&plain, Some(&old), &req("new"), &released, &start),
            Some(req("new"))
        );
        // A hook this transition does not trigger answers it at once.
        let start_hook = TaskRef {
            trigger: Some("before_START_ACTIVITY".into()),
            ..hook.clone()
        };
        assert_eq!(
            gated_transition(&start_hook, Some(&old), &req("new"), &held, &HashSet::new()),
            Some(req("new"))
        );
        let outcome = hooks::Outcome::Succeeded {
            warnings: vec!["hook task h: x".into()],
        };
        let st = hook_transition_status(&req("new"), &outcome);
        assert_eq!(
            (st.phase, st.message.as_str()),
            (TransitionPhase::Succeeded, "warning: hook task h: x")
        );
    }
}

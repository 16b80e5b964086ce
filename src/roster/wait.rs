//! Waiting on the roster for a transition (or a deployment) to finish.
//!
//! The operator owns the answer: its aggregation writes the transition's phase, the failing
//! tasks and the counts into `Environment.status`, and a wait only reads that status (as the
//! roster holds it) until it settles. A wait is for ONE transition id, so a status still
//! showing the previous transition never ends it early.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::{EnvKey, EnvRecord, Failure, Phase, Roster, TaskRecord};
use crate::state::State;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The environment reached the target (non-critical failures in `warnings`).
    Reached {
        tasks: usize,
        warnings: Vec<Failure>,
    },
    /// The environment reports the transition (or the deployment) failed.
    Failed {
        message: String,
        failures: Vec<Failure>,
        warnings: Vec<Failure>,
    },
}

/// Where a pending wait stands, as the environment's status says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Tasks the environment consists of (0 while the environment is not in the roster).
    pub expected: usize,
    /// Tasks in the target state.
    pub in_target: usize,
    pub counts: BTreeMap<State, u32>,
    /// The operator's word on the pending transition (`3/9 critical tasks done`).
    pub message: Option<String>,
}

/// Tasks named in a failure's message; the rest are counted (a mass failure stays one line).
const NAMED: usize = 10;

/// The environment's failing tasks split into critical (failures) and the rest (warnings).
fn split(rec: &EnvRecord) -> (Vec<Failure>, Vec<Failure>) {
    rec.failing.iter().cloned().partition(|f| f.critical)
}

fn reached(rec: &EnvRecord) -> Outcome {
    Outcome::Reached {
        tasks: rec.tasks as usize,
        warnings: split(rec).1,
    }
}

/// The failure as the status tells it: the critical failing tasks named (the rest counted),
/// or, when no task is to blame (a task that could not be placed, a call), the operator's
/// own message.
fn failed(rec: &EnvRecord, operator_says: Option<&str>) -> Outcome {
    let (failures, warnings) = split(rec);
    let message = if failures.is_empty() {
        operator_says.unwrap_or("transition failed").to_string()
    } else {
        let total = (rec.failing_critical as usize).max(failures.len());
        let names: Vec<&str> = failures.iter().take(NAMED).map(|f| &*f.task).collect();
        let more = match total.saturating_sub(names.len()) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        format!(
            "{total} critical task(s) failed: {}{more}",
            names.join(", ")
        )
    };
    Outcome::Failed {
        message,
        failures,
        warnings,
    }
}

fn progress(rec: &EnvRecord, target: State) -> Progress {
    Progress {
        expected: rec.tasks as usize,
        in_target: rec.counts.get(&target).copied().unwrap_or(0) as usize,
        counts: rec.counts.clone(),
        message: rec
            .observed
            .as_ref()
            .and_then(|o| o.message.as_deref())
            .map(str::to_string),
    }
}

impl Roster {
    /// The outcome of transition `id` towards `target` on `env` once the environment's status
    /// settles it (Succeeded or Failed for this id), or its progress while pending.
    pub fn evaluate(&self, env: &EnvKey, id: &str, target: State) -> Result<Outcome, Progress> {
        let Some(rec) = self.env(env) else {
            return Err(Progress::default());
        };
        match rec.observed.as_ref().filter(|o| &*o.id == id) {
            Some(o) if o.phase == Phase::Succeeded && self.caught_up(env, Some(id), target) => {
                Ok(reached(&rec))
            }
            Some(o) if o.phase == Phase::Failed => Ok(failed(&rec, o.message.as_deref())),
            _ => Err(progress(&rec, target)),
        }
    }

    /// Like [`Roster::evaluate`] without a transition: the environment's state is `target`
    /// (a fresh environment reaching STANDBY), or ERROR (a critical task or deployment call
    /// failed).
    pub fn evaluate_state(&self, env: &EnvKey, target: State) -> Result<Outcome, Progress> {
        let Some(rec) = self.env(env) else {
            return Err(Progress::default());
        };
        match rec.state {
            Some(s) if s == target && self.caught_up(env, None, target) => Ok(reached(&rec)),
            Some(State::Error) => Ok(failed(&rec, None)),
            _ => Err(progress(&rec, target)),
        }
    }

    /// Whether the roster's task records have caught up with an environment status that
    /// says `target` was reached: the Task and Environment watches are separate streams, and
    /// a caller reading tasks right after its wait must see them there. Every task with a
    /// control port is in `target` or ERROR, or has acted on transition `id`; tasks without
    /// one (hooks) decide nothing.
    fn caught_up(&self, env: &EnvKey, id: Option<&str>, target: State) -> bool {
        self.with_tasks(env, |tasks| {
            let acted = |t: &TaskRecord| {
                id.is_some_and(|id| t.transition.as_ref().is_some_and(|(i, _)| &**i == id))
            };
            for t in tasks {
                if !(t.control_port == 0
                    || t.state == target
                    || t.state == State::Error
                    || acted(t))
                {
                    return false;
                }
            }
            true
        })
    }

    /// Re-evaluates `eval` on every roster change until it is `Ok` or `deadline` passes
    /// (then its last answer).
    async fn wait_on<T, P>(
        &self,
        deadline: Instant,
        mut eval: impl FnMut(&Roster) -> Result<T, P>,
    ) -> Result<T, P> {
        let mut version = self.version();
        loop {
            version.borrow_and_update();
            let pending = eval(self);
            if pending.is_ok() {
                return pending;
            }
            tokio::select! {
                changed = version.changed() => {
                    if changed.is_err() { return eval(self) }
                }
                _ = tokio::time::sleep_until(deadline) => return eval(self),
            }
        }
    }

    /// Waits until the environment is in `target` (see [`Roster::evaluate_state`]).
    pub async fn wait_state(
        &self,
        env: &EnvKey,
        target: State,
        deadline: Instant,
    ) -> Result<Outcome, Progress> {
        self.wait_on(deadline, |r| r.evaluate_state(env, target))
            .await
    }

    /// Waits until transition `id` finishes on `env` or `deadline` passes (then its progress).
    pub async fn wait_transition(
        &self,
        env: &EnvKey,
        id: &str,
        target: State,
        deadline: Instant,
    ) -> Result<Outcome, Progress> {
        self.wait_on(deadline, |r| r.evaluate(env, id, target))
            .await
    }

    /// Waits until `done(self)` holds or `deadline` passes; returns whether it held.
    pub async fn wait_until(
        &self,
        deadline: Instant,
        mut done: impl FnMut(&Roster) -> bool,
    ) -> bool {
        self.wait_on(deadline, |r| if done(r) { Ok(()) } else { Err(()) })
            .await
            .is_ok()
    }
}

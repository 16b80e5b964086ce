//! Waiting on the roster for a transition to finish.
//!
//! A wait is for ONE transition id: a task counts as done only when its status names that id
//! and it is in the target state, so a roster still showing the previous transition never
//! ends a wait early. A critical task in ERROR ends the wait at once with the failing tasks;
//! non-critical failures are reported alongside and do not fail it.

use std::collections::BTreeMap;
use std::time::SystemTime;

use tokio::time::Instant;

use super::{EnvKey, Phase, Roster, TaskRecord};
use crate::state::State;

/// A task that failed the transition (or is reported as failing by the environment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub task: String,
    pub node: String,
    pub path: String,
    pub critical: bool,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every task reached the target for this transition (non-critical failures in `warnings`).
    Reached {
        tasks: usize,
        warnings: Vec<Failure>,
    },
    /// A critical task failed, or the environment reported the transition failed.
    Failed {
        message: String,
        failures: Vec<Failure>,
        warnings: Vec<Failure>,
    },
}

/// Where a pending transition stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Tasks the environment consists of (0 while the environment is not in the roster).
    pub expected: usize,
    /// Tasks in the roster.
    pub seen: usize,
    /// Tasks done with this transition (target reached, or a non-critical failure).
    pub done: usize,
    pub counts: BTreeMap<State, u32>,
}

/// The tasks of one environment weighed against a target: what failed, what is done.
struct Tally {
    failures: Vec<Failure>,
    warnings: Vec<Failure>,
    progress: Progress,
}

impl Failure {
    fn of(t: &TaskRecord) -> Failure {
        Failure {
            task: t.name.to_string(),
            node: t.node.to_string(),
            path: t.path.to_string(),
            critical: t.critical,
            message: t
                .message
                .as_deref()
                .unwrap_or("failed without a message")
                .to_string(),
        }
    }
}

/// Tasks named in a failure's message; the rest are counted (a mass failure stays one line).
const NAMED: usize = 10;

impl Tally {
    /// The call fails when a critical task did.
    fn failed(self) -> Result<Outcome, Progress> {
        let names: Vec<_> = self
            .failures
            .iter()
            .take(NAMED)
            .map(|f| f.task.as_str())
            .collect();
        let more = match self.failures.len().saturating_sub(NAMED) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        let message = format!(
            "{} critical task(s) failed: {}{more}",
            self.failures.len(),
            names.join(", ")
        );
        Ok(Outcome::Failed {
            message,
            failures: self.failures,
            warnings: self.warnings,
        })
    }

    fn all_done(&self) -> bool {
        self.progress.seen >= self.progress.expected && self.progress.done == self.progress.seen
    }
}

impl Roster {
    /// Weighs every task of `env` (whose record says `expected` tasks) against `target`.
    /// With a transition `(id, since)` only tasks whose status names `id` count as done, and
    /// an ERROR counts when the task names `id` or turned ERROR after `since`; without one,
    /// every task counts as it stands.
    fn tally(
        &self,
        env: &EnvKey,
        expected: usize,
        transition: Option<(&str, SystemTime)>,
        target: State,
    ) -> Tally {
        let mut tally = Tally {
            failures: Vec::new(),
            warnings: Vec::new(),
            progress: Progress {
                expected,
                ..Progress::default()
            },
        };
        self.with_tasks(env, |tasks| {
            for t in tasks {
                tally.progress.seen += 1;
                *tally.progress.counts.entry(t.state).or_insert(0) += 1;
                let (acted, failed_here, recent) = match transition {
                    Some((id, since)) => {
                        let named = t.transition.as_ref().filter(|(tid, _)| &**tid == id);
                        (
                            named.is_some(),
                            named.is_some_and(|(_, p)| *p == Phase::Failed),
                            t.changed_at >= since,
                        )
                    }
                    None => (true, false, true),
                };
                let errored =
                    t.state == State::Error && target != State::Error && (acted || recent);
                if errored || failed_here {
                    let f = Failure::of(t);
                    if t.critical {
                        tally.failures.push(f);
                    } else {
                        tally.warnings.push(f);
                        tally.progress.done += 1;
                    }
                } else if acted && t.state == target {
                    tally.progress.done += 1;
                }
            }
        });
        tally.failures.sort_by(|a, b| a.task.cmp(&b.task));
        tally.warnings.sort_by(|a, b| a.task.cmp(&b.task));
        tally
    }

    /// The outcome of transition `id` towards `target` on `env`, or its progress while pending.
    /// `since` is when it was requested: an ERROR reported after it counts even when the task's
    /// status does not (yet) name the transition, one from before it is stale.
    pub fn evaluate(
        &self,
        env: &EnvKey,
        id: &str,
        target: State,
        since: SystemTime,
    ) -> Result<Outcome, Progress> {
        let Some(rec) = self.env(env) else {
            return Err(Progress::default());
        };
        let mut tally = self.tally(env, rec.tasks as usize, Some((id, since)), target);
        let observed = rec.observed.as_ref().filter(|o| &*o.id == id);
        if let Some(o) = observed
            && o.phase == Phase::Failed
            && tally.failures.is_empty()
        {
            // The operator gave up on it (e.g. a task could not be placed): take its word.
            tally.failures = rec
                .failing
                .iter()
                .filter(|f| f.critical)
                .map(|f| Failure {
                    task: f.name.to_string(),
                    node: f.node.to_string(),
                    path: f.path.to_string(),
                    critical: true,
                    message: f.message.to_string(),
                })
                .collect();
            let message = o
                .message
                .as_deref()
                .unwrap_or("transition failed")
                .to_string();
            return Ok(Outcome::Failed {
                message,
                failures: tally.failures,
                warnings: tally.warnings,
            });
        }
        if !tally.failures.is_empty() {
            return tally.failed();
        }
        let env_says_done = observed.is_some_and(|o| o.phase == Phase::Succeeded);
        if tally.all_done() || env_says_done {
            return Ok(Outcome::Reached {
                tasks: tally.progress.seen,
                warnings: tally.warnings,
            });
        }
        Err(tally.progress)
    }

    /// Like [`Roster::evaluate`] without a transition id: every task in `target` (a fresh
    /// environment reaching STANDBY). Any critical task in ERROR fails it.
    pub fn evaluate_state(&self, env: &EnvKey, target: State) -> Result<Outcome, Progress> {
        let Some(rec) = self.env(env) else {
            return Err(Progress::default());
        };
        let mut tally = self.tally(env, rec.tasks as usize, None, target);
        if tally.failures.is_empty() {
            // What the Environment reports failing that is no task of it (an integration call
            // of the deployment): the deployment failed, in the operator's words.
            let tasks: std::collections::HashSet<String> =
                self.with_tasks(env, |ts| ts.map(|t| t.name.to_string()).collect());
            tally.failures = rec
                .failing
                .iter()
                .filter(|f| f.critical && !tasks.contains(&*f.name))
                .map(|f| Failure {
                    task: f.name.to_string(),
                    node: f.node.to_string(),
                    path: f.path.to_string(),
                    critical: true,
                    message: f.message.to_string(),
                })
                .collect();
        }
        if !tally.failures.is_empty() {
            return tally.failed();
        }
        if tally.all_done() {
            return Ok(Outcome::Reached {
                tasks: tally.progress.seen,
                warnings: tally.warnings,
            });
        }
        Err(tally.progress)
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

    /// Waits until every task of `env` is in `target` (see [`Roster::evaluate_state`]).
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
        since: SystemTime,
        deadline: Instant,
    ) -> Result<Outcome, Progress> {
        self.wait_on(deadline, |r| r.evaluate(env, id, target, since))
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

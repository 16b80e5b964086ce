//! Waiting on the roster for a transition to finish.
//!
//! A wait is for ONE transition id: a task counts as done only when its status names that id
//! and it is in the target state, so a roster still showing the previous transition never
//! ends a wait early. A critical task in ERROR ends the wait at once with the failing tasks;
//! non-critical failures are reported alongside and do not fail it.

use std::collections::BTreeMap;
use std::time::SystemTime;

use tokio::time::Instant;

use super::{EnvKey, Phase, Roster};
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

impl Roster {
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
        let mut failures = Vec::new();
        let mut warnings = Vec::new();
        let mut progress = Progress {
            expected: rec.tasks as usize,
            ..Progress::default()
        };
        self.with_tasks(env, |tasks| {
            for t in tasks {
                progress.seen += 1;
                *progress.counts.entry(t.state).or_insert(0) += 1;
                let acted = t.transition.as_ref().is_some_and(|(tid, _)| &**tid == id);
                let failed_here = acted
                    && t.transition
                        .as_ref()
                        .is_some_and(|(_, p)| *p == Phase::Failed);
                let errored = t.state == State::Error
                    && target != State::Error
                    && (acted || t.changed_at >= since);
                if errored || failed_here {
                    let f = Failure {
                        task: t.name.to_string(),
                        node: t.node.to_string(),
                        path: t.path.to_string(),
                        critical: t.critical,
                        message: t
                            .message
                            .as_deref()
                            .unwrap_or("failed without a message")
                            .to_string(),
                    };
                    if t.critical {
                        failures.push(f);
                    } else {
                        warnings.push(f);
                        progress.done += 1;
                    }
                } else if acted && t.state == target {
                    progress.done += 1;
                }
            }
        });
        failures.sort_by(|a, b| a.task.cmp(&b.task));
        warnings.sort_by(|a, b| a.task.cmp(&b.task));
        let observed = rec.observed.as_ref().filter(|o| &*o.id == id);
        if let Some(o) = observed
            && o.phase == Phase::Failed
            && failures.is_empty()
        {
            // The operator gave up on it (e.g. a task could not be placed): take its word.
            failures = rec
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
                failures,
                warnings,
            });
        }
        if !failures.is_empty() {
            let names: Vec<_> = failures.iter().map(|f| f.task.as_str()).collect();
            let message = format!(
                "{} critical task(s) failed: {}",
                failures.len(),
                names.join(", ")
            );
            return Ok(Outcome::Failed {
                message,
                failures,
                warnings,
            });
        }
        let all_tasks_done = progress.seen >= progress.expected && progress.done == progress.seen;
        let env_says_done = observed.is_some_and(|o| o.phase == Phase::Succeeded);
        if all_tasks_done || env_says_done {
            return Ok(Outcome::Reached {
                tasks: progress.seen,
                warnings,
            });
        }
        Err(progress)
    }

    /// Like [`Roster::evaluate`] without a transition id: every task in `target` (a fresh
    /// environment reaching STANDBY). Any critical task in ERROR fails it.
    pub fn evaluate_state(&self, env: &EnvKey, target: State) -> Result<Outcome, Progress> {
        let Some(rec) = self.env(env) else {
            return Err(Progress::default());
        };
        let mut progress = Progress {
            expected: rec.tasks as usize,
            ..Progress::default()
        };
        let (mut failures, mut warnings) = (Vec::new(), Vec::new());
        self.with_tasks(env, |tasks| {
            for t in tasks {
                progress.seen += 1;
                *progress.counts.entry(t.state).or_insert(0) += 1;
                if t.state == State::Error && target != State::Error {
                    let f = Failure {
                        task: t.name.to_string(),
                        node: t.node.to_string(),
                        path: t.path.to_string(),
                        critical: t.critical,
                        message: t
                            .message
                            .as_deref()
                            .unwrap_or("failed without a message")
                            .to_string(),
                    };
                    if t.critical {
                        failures.push(f);
                    } else {
                        progress.done += 1;
                        warnings.push(f);
                    }
                } else if t.state == target {
                    progress.done += 1;
                }
            }
        });
        failures.sort_by(|a, b| a.task.cmp(&b.task));
        warnings.sort_by(|a, b| a.task.cmp(&b.task));
        if !failures.is_empty() {
            let names: Vec<_> = failures.iter().map(|f| f.task.as_str()).collect();
            let message = format!(
                "{} critical task(s) failed: {}",
                failures.len(),
                names.join(", ")
            );
            return Ok(Outcome::Failed {
                message,
                failures,
                warnings,
            });
        }
        if progress.seen >= progress.expected && progress.done == progress.seen {
            return Ok(Outcome::Reached {
                tasks: progress.seen,
                warnings,
            });
        }
        Err(progress)
    }

    /// Waits until every task of `env` is in `target` (see [`Roster::evaluate_state`]).
    pub async fn wait_state(
        &self,
        env: &EnvKey,
        target: State,
        deadline: Instant,
    ) -> Result<Outcome, Progress> {
        let mut version = self.version();
        loop {
            version.borrow_and_update();
            let pending = match self.evaluate_state(env, target) {
                Ok(outcome) => return Ok(outcome),
                Err(p) => p,
            };
            tokio::select! {
                changed = version.changed() => {
                    if changed.is_err() { return Err(pending) }
                }
                _ = tokio::time::sleep_until(deadline) => return Err(pending),
            }
        }
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
        let mut version = self.version();
        loop {
            version.borrow_and_update();
            let pending = match self.evaluate(env, id, target, since) {
                Ok(outcome) => return Ok(outcome),
                Err(p) => p,
            };
            tokio::select! {
                changed = version.changed() => {
                    if changed.is_err() { return Err(pending) }
                }
                _ = tokio::time::sleep_until(deadline) => return Err(pending),
            }
        }
    }

    /// Waits until `done(self)` holds or `deadline` passes; returns whether it held.
    pub async fn wait_until(
        &self,
        deadline: Instant,
        mut done: impl FnMut(&Roster) -> bool,
    ) -> bool {
        let mut version = self.version();
        loop {
            version.borrow_and_update();
            if done(self) {
                return true;
            }
            tokio::select! {
                changed = version.changed() => {
                    if changed.is_err() { return done(self) }
                }
                _ = tokio::time::sleep_until(deadline) => return done(self),
            }
        }
    }
}

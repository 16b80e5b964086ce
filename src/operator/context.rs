//! The one context every reconcile is handed: the client, the settings, the stores fed by
//! the watches, and the operator's memory between reconciles. Built by `runtime`; read by both
//! controllers (which therefore never import the runtime that runs them).

use std::sync::Arc;

use dashmap::{DashMap, DashSet};
use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use super::OperatorArgs;
use super::control_api::ControlClient;
use super::pod::PodSettings;
use super::stored_pod::StoredPod;
use super::stored_service::StoredService;
use crate::crd::{Task, TaskSet, TaskTemplate};

/// A transition's answer as this operator recorded it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: crate::crd::TaskStatus,
    /// The status write succeeded (false: the apiserver or etcd refused it; write it again).
    pub written: bool,
    /// The transition ids (None: no transition yet) of the statuses this answer follows, its
    /// own chain of earlier answers included: a stored status showing one of them is behind
    /// this answer; one showing anything else (another operator's newer write) is not.
    pub follows: Vec<Option<String>>,
}

/// How many earlier statuses an answer remembers following (a chain of answers whose writes
/// the store has not shown yet is short: one per transition requested meanwhile).
const FOLLOWS: usize = 16;

impl Answer {
    /// The answer `status` computed from `base`: the stored status, or `kept`, the answer
    /// that stood in for it.
    pub fn after(
        status: crate::crd::TaskStatus,
        base: &crate::crd::TaskStatus,
        kept: Option<&Answer>,
    ) -> Answer {
        let mut follows = kept.map(|k| k.follows.clone()).unwrap_or_default();
        follows.push(base.transition.as_ref().map(|t| t.id.clone()));
        if follows.len() > FOLLOWS {
            follows.drain(..follows.len() - FOLLOWS);
        }
        Answer {
            status,
            written: false,
            follows,
        }
    }

    /// Whether this answer stands for `stored` (the Task status the watch store shows): the
    /// store is behind it. A reconcile woken by a spec change made while the previous
    /// transition was being answered sees the status from before that answer; it must start
    /// from the answer, not send a step again nor judge against the old state. Before any
    /// transition, the process's first answer (its state read once its pod runs) stands for
    /// a stored status that has no state yet: a reconcile woken meanwhile (the pod's or the
    /// Service's event) neither asks the process again nor writes the same answer twice.
    pub fn is_ahead_of(&self, stored: Option<&crate::crd::TaskStatus>) -> bool {
        let shown = stored.and_then(|s| s.transition.as_ref()).map(|t| &t.id);
        let mine = self.status.transition.as_ref().map(|t| &t.id);
        if shown == mine {
            return mine.is_none() && has_answer(Some(&self.status)) && !has_answer(stored);
        }
        self.follows.iter().any(|f| f.as_ref() == shown)
    }

    /// Whether `stored` shows this answer, written: the store has caught up and is the truth
    /// again, so the answer need not be kept. The whole transition (its phase too: a step of
    /// a sequence under way is not its end) and the state must match.
    pub fn is_shown_by(&self, stored: Option<&crate::crd::TaskStatus>) -> bool {
        stored.is_some_and(|s| {
            self.written && s.transition == self.status.transition && s.state == self.status.state
        })
    }
}

/// A status that records the process's (or the task's failed) state, not only its deployment.
fn has_answer(st: Option<&crate::crd::TaskStatus>) -> bool {
    use crate::state::State;
    !matches!(st.and_then(|s| s.state), None | Some(State::Deploying))
}

/// Everything a reconcile reads: stores fed by watches (never a GET per reconcile).
pub struct Ctx {
    pub client: Client,
    pub args: OperatorArgs,
    pub pod_settings: PodSettings,
    pub tasks: Store<Task>,
    /// The Task store's names by environment (fed by the same watch).
    pub task_index: Arc<super::task_index::TaskIndex>,
    pub pods: Store<StoredPod>,
    pub services: Store<StoredService>,
    /// Nodes by host label (fed by the Node watch): a task's node.
    pub node_index: Arc<super::nodes::NodeIndex>,
    pub templates: Store<TaskTemplate>,
    pub task_sets: Store<TaskSet>,
    pub recorder: Recorder,
    /// Tasks whose process state was read since this operator started (re-attach check).
    pub verified: DashSet<String>,
    /// Task uid -> this operator's last answer to a transition and whether its status write
    /// landed (read while the store lags behind that write, or instead of sending the step
    /// again after the write failed; see `task_controller::answered`).
    pub answered: DashMap<String, Answer>,
    /// Environment uid -> when this operator last wrote its status (progress is coalesced to
    /// one write a window; see `status_pace`).
    pub status_written: DashMap<String, std::time::Instant>,
    /// TaskSet uid -> (resourceVersion, content hash): TaskSets are immutable, hash each once.
    pub set_hashes: DashMap<String, (String, String)>,
    /// (what, task uid) -> when this operator created (or deleted) the task's Pod or
    /// Service, or deleted the Task, until its store shows it: a reconcile in between (store
    /// lag) does not send the same request again.
    pub requested: DashMap<(&'static str, String), std::time::Instant>,
    /// Integration calls in flight and their outcomes.
    pub calls: Arc<super::calls::Calls>,
    /// Transition calls in flight, outside the task reconciles, and their outcomes.
    pub transitions: super::transition_calls::TransitionCalls,
    /// Live task state between transitions (followers of the task processes).
    pub live: Arc<super::live::Live>,
    /// The task control client every caller uses (one policy, one channel cache).
    pub control: ControlClient,
    /// Turns true once every watch has listed.
    pub(super) listed: tokio::sync::watch::Receiver<bool>,
}

/// How long an object this operator created or deleted may stay as it was in its store
/// before the request is sent again (normally its watch event arrives well within this).
pub const STORE_LAG: std::time::Duration = std::time::Duration::from_secs(30);

/// The key of [`Ctx::requested`] for a Task's own deletion (by its environment's cleanup).
pub const TASK_DELETION: &str = "Task deletion";

impl Ctx {
    /// Time left to wait when this operator sent the request `what` for the task (uid)
    /// moments ago.
    pub fn awaiting_store(
        &self,
        what: &'static str,
        task_uid: &str,
    ) -> Option<std::time::Duration> {
        let at = *self.requested.get(&(what, task_uid.to_string()))?;
        STORE_LAG.checked_sub(at.elapsed())
    }

    /// The stored Tasks of Environment `env` in `namespace` (by the index, no scan).
    pub fn tasks_of(&self, namespace: &str, env: &str) -> Vec<Arc<Task>> {
        let mut tasks = Vec::new();
        self.task_index.each(namespace, env, |key| {
            tasks.extend(self.tasks.get(key));
        });
        tasks
    }

    /// Reconciles wait here until every watch has listed (no decision on a partial view).
    pub async fn listed(&self) {
        let mut rx = self.listed.clone();
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{TaskStatus, TransitionPhase, TransitionStatus};
    use crate::state::{Event, State};

    fn status(state: State, id: &str, event: Event) -> TaskStatus {
        TaskStatus {
            state: Some(state),
            transition: Some(TransitionStatus {
                id: id.into(),
                event,
                phase: TransitionPhase::Succeeded,
                message: String::new(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_answer_stands_for_the_status_it_followed_whatever_the_spec_asks_now() {
        // The fault run's seed 500 round 50: CONFIGURE `c` stored, START `s` answered
        // (RUNNING) while the spec moved on to GO_ERROR: the store still shows `c`.
        let stored = status(State::Configured, "c", Event::Configure);
        let start = Answer::after(status(State::Running, "s", Event::Start), &stored, None);
        assert!(start.is_ahead_of(Some(&stored)));
        // Once the store shows the answer, the store is the truth again.
        assert!(!start.is_ahead_of(Some(&start.status)));
        // A chain: GO_ERROR `g` answered from the kept START before either write showed.
        let stop = Answer::after(
            status(State::Configured, "g", Event::GoError),
            &start.status,
            Some(&start),
        );
        assert!(stop.is_ahead_of(Some(&stored)));
        assert!(stop.is_ahead_of(Some(&start.status)));
        // A status this operator never followed (another operator's newer write) wins.
        let other = status(State::Running, "x", Event::Start);
        assert!(!stop.is_ahead_of(Some(&other)));
        // No transition stored yet: the first answer stands for it.
        let first = Answer::after(
            status(State::Configured, "c", Event::Configure),
            &TaskStatus::default(),
            None,
        );
        assert!(first.is_ahead_of(Some(&TaskStatus::default())));
        assert!(first.is_ahead_of(None));
    }

    #[test]
    fn the_first_answer_stands_for_a_status_without_one_until_shown() {
        let answer = |state: Option<State>| TaskStatus {
            state,
            ..Default::default()
        };
        let deploying = answer(Some(State::Deploying));
        let mut first = Answer::after(answer(Some(State::Standby)), &deploying, None);
        assert!(first.is_ahead_of(None));
        assert!(first.is_ahead_of(Some(&deploying)));
        // Shown: the store is the truth again, and the answer may go once written.
        assert!(!first.is_ahead_of(Some(&first.status.clone())));
        assert!(
            !first.is_shown_by(Some(&first.status.clone())),
            "not written yet"
        );
        first.written = true;
        assert!(first.is_shown_by(Some(&first.status.clone())));
        assert!(!first.is_shown_by(Some(&deploying)));
        // A stored answer of its own (another operator's) is not overridden.
        assert!(!first.is_ahead_of(Some(&answer(Some(State::Error)))));
        // A status without an answer is no answer to stand for.
        let quiet = Answer::after(deploying.clone(), &TaskStatus::default(), None);
        assert!(!quiet.is_ahead_of(None));
        // Transitions keep their own rule: the same transition shown is not behind.
        let c = status(State::Configured, "c", Event::Configure);
        let mut later = Answer::after(c.clone(), &c, None);
        later.status.state = Some(State::Error);
        assert!(!later.is_ahead_of(Some(&c)));
        later.written = true;
        assert!(!later.is_shown_by(Some(&c)), "another state: not shown");
        // The same transition and state, another phase (a sequence's step, then its end).
        let mut ended = Answer::after(c.clone(), &c, None);
        ended.written = true;
        let mut under_way = c.clone();
        if let Some(t) = under_way.transition.as_mut() {
            t.phase = TransitionPhase::Running;
        }
        assert!(!ended.is_shown_by(Some(&under_way)));
        assert!(ended.is_shown_by(Some(&c)));
    }

    #[test]
    fn an_answer_remembers_a_bounded_chain() {
        let mut base = TaskStatus::default();
        let mut kept: Option<Answer> = None;
        for i in 0..100 {
            let a = Answer::after(
                status(State::Configured, &format!("t{i}"), Event::Configure),
                &base,
                kept.as_ref(),
            );
            base = a.status.clone();
            kept = Some(a);
        }
        assert_eq!(kept.unwrap().follows.len(), FOLLOWS);
    }
}

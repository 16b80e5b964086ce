//! Transition calls in flight, outside the task reconciles.
//!
//! A real process's CONFIGURE takes seconds of its own work. A task reconcile that waited for
//! its call would hold one of the controller's `--task-concurrency` places all that time, so
//! 10,000 tasks would be called 256 at a time, round after round. Instead the reconcile starts
//! the call here and ends; the call runs as a task of its own, keeps its outcome, and wakes
//! the Task's reconcile, which takes the outcome and writes it. A deleted Task's take-out
//! (STOP, RESET, EXIT before its pod goes) runs here too, for the same reason: a real
//! process's STOP takes seconds, and a teardown would otherwise go 256 tasks at a time.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::AbortHandle;

use super::control_api::ControlError;
use crate::crd::Task;
use crate::state::{Event, State};

/// Which transition a call makes: the Task's request, and the state it was sent from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Called {
    pub id: String,
    pub event: Event,
    pub from: State,
    pub target: State,
}

/// What a call is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// The Task's requested transition: its outcome goes into the Task's status.
    Transition(Called),
    /// A deleted Task's process taken out in order before its pod goes: its outcome only says
    /// that the take-out ended.
    TakeOut,
}

/// A call's answer: the state the process reached, or why it did not answer.
pub type Outcome = Result<State, ControlError>;

/// What a task reconcile finds for its task.
#[derive(Debug)]
pub enum Found {
    Nothing,
    /// A call is under way; its end wakes the Task's reconcile.
    Running,
    /// A call ended; its outcome is handed over once (the entry is gone).
    Done(Call, Outcome),
}

struct Entry {
    call: Call,
    /// Which start this is: a replaced call's end must not fill its successor's entry.
    seq: u64,
    outcome: Option<Outcome>,
    abort: Option<AbortHandle>,
}

/// Task uid -> its call in flight or its outcome not yet taken.
pub struct TransitionCalls {
    calls: Arc<DashMap<String, Entry>>,
    wake: UnboundedSender<ObjectRef<Task>>,
    started: AtomicU64,
}

impl TransitionCalls {
    /// Calls whose end is sent to `wake` (the task controller's reconcile trigger).
    pub fn new(wake: UnboundedSender<ObjectRef<Task>>) -> Self {
        Self {
            calls: Arc::default(),
            wake,
            started: AtomicU64::new(0),
        }
    }

    /// The task's call: under way, ended (taken now), or none.
    pub fn find(&self, uid: &str) -> Found {
        let Some(mut e) = self.calls.get_mut(uid) else {
            return Found::Nothing;
        };
        if e.outcome.is_none() {
            return Found::Running;
        }
        let outcome = e.outcome.take();
        drop(e);
        match (self.calls.remove(uid), outcome) {
            (Some((_, e)), Some(o)) => Found::Done(e.call, o),
            _ => Found::Nothing,
        }
    }

    /// Whether a call of the task is under way (its outcome not in yet).
    pub fn running(&self, uid: &str) -> bool {
        self.calls.get(uid).is_some_and(|e| e.outcome.is_none())
    }

    /// Starts `call` for the task `uid` (`task` is woken when it ends). A call already in the
    /// map for the task is replaced (and stopped): callers start one only after [`find`]
    /// returned `Nothing`.
    ///
    /// [`find`]: TransitionCalls::find
    pub fn start<F>(&self, uid: &str, task: ObjectRef<Task>, call: Call, work: F)
    where
        F: Future<Output = Outcome> + Send + 'static,
    {
        let calls = self.calls.clone();
        let wake = self.wake.clone();
        let key = uid.to_string();
        let seq = self.started.fetch_add(1, Ordering::Relaxed);
        // The entry is in the map before the call can end (its task waits on the shard's
        // lock until `slot` is dropped below).
        let mut slot = self.calls.entry(key.clone()).or_insert_with(|| Entry {
            call: call.clone(),
            seq,
            outcome: None,
            abort: None,
        });
        if let Some(earlier) = slot.abort.take() {
            earlier.abort();
        }
        let handle = tokio::spawn(async move {
            let outcome = work.await;
            if let Some(mut e) = calls.get_mut(&key)
                && e.seq == seq
                && e.outcome.is_none()
            {
                e.outcome = Some(outcome);
            }
            let _ = wake.send(task);
        });
        *slot = Entry {
            call,
            seq,
            outcome: None,
            abort: Some(handle.abort_handle()),
        };
    }

    /// Stops the task's call, if any, and drops its outcome (its process was replaced or its
    /// Task is gone).
    pub fn forget(&self, uid: &str) {
        if let Some(abort) = self.calls.remove(uid).and_then(|(_, e)| e.abort) {
            abort.abort();
        }
    }

    /// Returns once no call is under way: the controllers' graceful stop lets calls end, as it
    /// lets reconciles end (each call is bounded by its deadline).
    pub async fn wait_idle(&self) {
        while self.calls.iter().any(|e| e.outcome.is_none()) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn called(id: &str) -> Call {
        Call::Transition(Called {
            id: id.into(),
            event: Event::Configure,
            from: State::Standby,
            target: State::Configured,
        })
    }

    fn task(name: &str) -> ObjectRef<Task> {
        ObjectRef::new(name).within("ns")
    }

    #[tokio::test]
    async fn an_ended_call_wakes_its_task_and_hands_its_outcome_over_once() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let calls = TransitionCalls::new(tx);
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<()>();
        calls.start("u1", task("t1"), called("c1"), async move {
            let _ = answer_rx.await;
            Ok(State::Configured)
        });
        assert!(matches!(calls.find("u1"), Found::Running));
        assert!(calls.running("u1"));
        assert!(matches!(calls.find("u2"), Found::Nothing));
        answer_tx.send(()).unwrap();
        let woken = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert_eq!(woken.unwrap().unwrap().name, "t1");
        match calls.find("u1") {
            Found::Done(c, Ok(s)) => {
                assert_eq!(c, called("c1"));
                assert_eq!(s, State::Configured);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(calls.find("u1"), Found::Nothing));
        assert!(calls.calls.is_empty());
    }

    #[tokio::test]
    async fn a_forgotten_call_is_stopped_and_leaves_nothing() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let calls = TransitionCalls::new(tx);
        calls.start("u1", task("t1"), called("c1"), async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(State::Configured)
        });
        calls.forget("u1");
        assert!(matches!(calls.find("u1"), Found::Nothing));
        assert!(calls.calls.is_empty());
        // Its task was stopped: it never wakes the Task.
        let woken = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await;
        assert!(woken.is_err(), "a stopped call woke its task");
    }

    #[tokio::test]
    async fn a_replaced_call_does_not_leave_its_outcome_for_the_new_one() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let calls = TransitionCalls::new(tx);
        calls.start("u1", task("t1"), called("c1"), async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(State::Configured)
        });
        calls.start("u1", task("t1"), called("c2"), async {
            Err(ControlError::NotApplicable {
                event: Event::Configure,
                from: State::Running,
            })
        });
        let _ = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        match calls.find("u1") {
            Found::Done(c, Err(_)) => assert_eq!(c, called("c2")),
            other => panic!("{other:?}"),
        }
    }
}

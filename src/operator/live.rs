//! Live task state between transitions: one follower per task process listens to what the
//! process says on its own (StateStream and EventStream for direct tasks; EventStream for
//! FairMQ devices, which have no StateStream) and notices a lost control connection. Each
//! finding is kept as the task's latest observation and wakes the task's reconcile, which
//! judges it ([`judge`], pure) and writes the Task status: the task controller stays the
//! only writer.
//!
//! A follower never reports what it saw while the operator's own call to the task was in
//! flight: the call's reply decides that state, and a change the stream delivers late is
//! ignored by [`judge`] (it is older than the call's end, or equal to the state reached).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures::{StreamExt, stream};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::control_api::{ControlClient, ControlError, TaskEndpoint};
use crate::crd::Task;
use crate::plan::ControlMode;
use crate::state::State;

/// What a follower saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The process reported this state (StateStream, or GetState after a stream ended).
    State(State),
    /// A device event (EventStream): the state is read before anything is concluded.
    Event(String),
    /// The control connection is lost or refused: the process is gone or unreachable.
    Lost(String),
}

/// One observation and when it was made.
#[derive(Clone, Debug)]
pub struct Observed {
    pub seen: Seen,
    pub at: Instant,
    pub wall: jiff::Timestamp,
}

/// What the task's reconcile does with its latest observation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Nothing,
    /// Read the state (GetState) and judge that.
    Confirm,
    /// The task is now in `state`, for this reason.
    Apply {
        state: State,
        reason: &'static str,
        message: String,
    },
}

/// Judges an observation against the state the Task shows. `call_end` is when the
/// operator's last call to this task ended: anything seen before is stale.
pub fn judge(current: Option<State>, obs: &Observed, call_end: Option<Instant>) -> Verdict {
    let Some(current) = current.filter(|s| !matches!(s, State::Deploying | State::Done)) else {
        return Verdict::Nothing;
    };
    if call_end.is_some_and(|end| obs.at <= end) {
        return Verdict::Nothing;
    }
    let when = obs.wall.strftime("%Y-%m-%dT%H:%M:%S%.3fZ");
    match &obs.seen {
        Seen::State(s) if *s == current => Verdict::Nothing,
        Seen::State(State::Error) => Verdict::Apply {
            state: State::Error,
            reason: "TaskError",
            message: format!("left {current} for ERROR by itself at {when}"),
        },
        Seen::State(State::Done) => Verdict::Apply {
            state: State::Done,
            reason: "TaskEnded",
            message: format!("left {current} and ended (DONE) by itself at {when}"),
        },
        // Another settled state (e.g. END_OF_STREAM taking RUNNING back to CONFIGURED): a
        // late delivery of an earlier change would look the same, so the task is asked.
        Seen::State(_) | Seen::Event(_) => Verdict::Confirm,
        Seen::Lost(_) if current == State::Error => Verdict::Nothing,
        Seen::Lost(why) => Verdict::Apply {
            state: State::Error,
            reason: "TaskUnreachable",
            message: format!("control connection lost while {current} at {when}: {why}"),
        },
    }
}

/// The answer to a [`Verdict::Confirm`]: what GetState said.
pub fn confirmed(
    current: State,
    obs: &Observed,
    read: Result<State, &ControlError>,
) -> Option<Verdict> {
    let when = obs.wall.strftime("%Y-%m-%dT%H:%M:%S%.3fZ");
    let cause = match &obs.seen {
        Seen::Event(e) => format!("device event {e}"),
        _ => "a state change it reported".to_string(),
    };
    match read {
        Ok(s) if s == current => None,
        Ok(s) => Some(Verdict::Apply {
            state: s,
            reason: if s == State::Error {
                "TaskError"
            } else {
                "TaskStateChanged"
            },
            message: format!("left {current} for {s} by itself at {when} ({cause})"),
        }),
        // A slow answer is no failure (direct GetState takes ~1 s while RUNNING).
        Err(ControlError::Deadline { .. }) => None,
        // Already ERROR: nothing more to say.
        Err(_) if current == State::Error => None,
        Err(e) => Some(Verdict::Apply {
            state: State::Error,
            reason: "TaskUnreachable",
            message: format!("unreachable after {cause} while {current} at {when}: {e}"),
        }),
    }
}

struct Follower {
    addr: SocketAddr,
    stop: CancellationToken,
}

/// Followers, latest observations and call marks, by Task uid.
pub struct Live {
    followers: DashMap<String, Follower>,
    news: DashMap<String, Observed>,
    /// None while a call is in flight; the end of the last call otherwise.
    calls: DashMap<String, Option<Instant>>,
    wake: UnboundedSender<ObjectRef<Task>>,
    /// The operator's control client (its policy and channel cache).
    control: ControlClient,
}

impl Live {
    pub fn new(wake: UnboundedSender<ObjectRef<Task>>, control: ControlClient) -> Live {
        Live {
            followers: DashMap::new(),
            news: DashMap::new(),
            calls: DashMap::new(),
            wake,
            control,
        }
    }

    /// Follows the task at `ep` (again, if its address changed). Idempotent.
    pub fn follow(self: &std::sync::Arc<Self>, uid: &str, task: ObjectRef<Task>, ep: TaskEndpoint) {
        if !matches!(ep.mode, ControlMode::Direct | ControlMode::Fairmq) {
            return;
        }
        if self.followers.get(uid).is_some_and(|f| f.addr == ep.addr) {
            return;
        }
        let stop = CancellationToken::new();
        if let Some(old) = self.followers.insert(
            uid.to_string(),
            Follower {
                addr: ep.addr,
                stop: stop.clone(),
            },
        ) {
            old.stop.cancel();
        }
        let live = self.clone();
        let uid = uid.to_string();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = follow(&live.control, ep, |seen| live.report(&uid, &task, seen)) => {}
            }
            debug!(task = %task.name, "no longer following");
        });
    }

    /// Stops following the task and forgets what was seen.
    pub fn unfollow(&self, uid: &str) {
        if let Some((_, f)) = self.followers.remove(uid) {
            f.stop.cancel();
        }
        self.news.remove(uid);
        self.calls.remove(uid);
    }

    pub fn following(&self) -> usize {
        self.followers.len()
    }

    fn report(&self, uid: &str, task: &ObjectRef<Task>, seen: Seen) {
        if self.calls.get(uid).is_some_and(|c| c.is_none()) {
            // The operator's own call decides this state.
            return;
        }
        debug!(task = %task.name, ?seen, "live observation");
        self.news.insert(
            uid.to_string(),
            Observed {
                seen,
                at: Instant::now(),
                wall: jiff::Timestamp::now(),
            },
        );
        let _ = self.wake.send(task.clone());
    }

    /// The task's latest observation and the end of the operator's last call to it.
    pub fn news(&self, uid: &str) -> Option<(Observed, Option<Instant>)> {
        let obs = self.news.get(uid)?.clone();
        Some((obs, self.calls.get(uid).and_then(|c| *c)))
    }

    /// Forgets `obs` once it is dealt with (a newer one stays).
    pub fn consumed(&self, uid: &str, obs: &Observed) {
        self.news.remove_if(uid, |_, o| o.at == obs.at);
    }

    /// Marks a call to the task as started; the returned guard marks its end.
    pub fn calling<'a>(&'a self, uid: &'a str) -> CallGuard<'a> {
        self.calls.insert(uid.to_string(), None);
        CallGuard { live: self, uid }
    }
}

/// Ends a call mark when dropped (also when the call's future is cancelled).
pub struct CallGuard<'a> {
    live: &'a Live,
    uid: &'a str,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.live
            .calls
            .insert(self.uid.to_string(), Some(Instant::now()));
    }
}

/// First wait before subscribing again after a stream ended; doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A state read after a stream ended (direct GetState takes ~1 s while RUNNING).
const READ_DEADLINE: Duration = Duration::from_secs(3);

/// Follows one task process until it reaches a final state: subscribes, reports what comes,
/// and when the subscription ends reads the state (or finds the process gone), then
/// subscribes again with backoff.
async fn follow(control: &ControlClient, ep: TaskEndpoint, report: impl Fn(Seen)) {
    let mut backoff = BACKOFF_MIN;
    let mut lost_reported = false;
    loop {
        let opened = Instant::now();
        let mut streams = subscriptions(control, ep);
        let mut failure = None;
        while let Some(item) = streams.next().await {
            match item {
                Ok(seen) => {
                    let last = matches!(seen, Seen::State(State::Done));
                    report(seen);
                    if last {
                        return;
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        drop(streams);
        if let Some(e) = &failure {
            debug!(addr = %ep.addr, error = %e, "live subscription failed");
        }
        // Boxed: a state read is a rare moment of the follower, and its future (~1 KB) would
        // otherwise be part of every follower's, idle ones included.
        match Box::pin(control.get_state(&ep, READ_DEADLINE)).await {
            Ok((s, _)) => {
                lost_reported = false;
                report(Seen::State(s));
                if matches!(s, State::Done) {
                    return;
                }
            }
            Err(ControlError::Deadline { .. }) => {}
            Err(e) if gone(&e) => {
                if !lost_reported {
                    lost_reported = true;
                    report(Seen::Lost(e.to_string()));
                }
                // The cached channel may hold a dead connection: a fresh one next time.
                control.forget(&ep.addr);
            }
            Err(e) => debug!(addr = %ep.addr, error = %e, "state read after the stream ended"),
        }
        if opened.elapsed() > BACKOFF_MAX * 2 {
            backoff = BACKOFF_MIN;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Whether an error means the process cannot be reached at all.
fn gone(e: &ControlError) -> bool {
    matches!(
        e,
        ControlError::Rpc {
            code: tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled,
            ..
        }
    )
}

/// The mode's subscriptions, merged: they end together when one ends.
fn subscriptions(
    control: &ControlClient,
    ep: TaskEndpoint,
) -> futures::stream::BoxStream<'static, Result<Seen, ControlError>> {
    let events = control
        .event_stream(&ep)
        .map(|r| r.map(Seen::Event))
        .chain(stream::once(async { Err(ended()) }));
    match ep.mode {
        ControlMode::Direct => {
            let states = control
                .state_stream(&ep)
                .map(|r| r.map(Seen::State))
                .chain(stream::once(async { Err(ended()) }));
            // The first end (or failure) of either ends both.
            stream::select(states, events)
                .scan(false, |done, item| {
                    if *done {
                        return std::future::ready(None);
                    }
                    *done = item.is_err();
                    std::future::ready(Some(item))
                })
                .boxed()
        }
        _ => events.boxed(),
    }
}

/// A subscription that ended normally (not an error of the task; the state is read next).
fn ended() -> ControlError {
    ControlError::StreamEnded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(seen: Seen) -> Observed {
        Observed {
            seen,
            at: Instant::now(),
            wall: jiff::Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn error_seen_between_transitions_is_applied() {
        let o = obs(Seen::State(State::Error));
        match judge(Some(State::Running), &o, None) {
            Verdict::Apply {
                state,
                reason,
                message,
            } => {
                assert_eq!(state, State::Error);
                assert_eq!(reason, "TaskError");
                assert!(message.contains("left RUNNING for ERROR"), "{message}");
                assert!(message.contains("1970-01-01T00:00:00.000Z"), "{message}");
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn what_a_call_decided_is_not_judged_again() {
        let o = obs(Seen::State(State::Configured));
        // Seen before the last call ended: stale.
        let later = o.at + Duration::from_millis(1);
        assert_eq!(
            judge(Some(State::Running), &o, Some(later)),
            Verdict::Nothing
        );
        // The same state as shown: nothing.
        assert_eq!(judge(Some(State::Configured), &o, None), Verdict::Nothing);
        // Another normal state, seen after the call: asked first.
        assert_eq!(judge(Some(State::Running), &o, None), Verdict::Confirm);
        // Nothing is judged while deploying or after the end.
        for s in [None, Some(State::Deploying), Some(State::Done)] {
            assert_eq!(
                judge(s, &obs(Seen::State(State::Error)), None),
                Verdict::Nothing
            );
        }
    }

    #[test]
    fn lost_connection_fails_the_task_once() {
        let o = obs(Seen::Lost("connection refused".into()));
        assert!(matches!(
            judge(Some(State::Running), &o, None),
            Verdict::Apply {
                state: State::Error,
                reason: "TaskUnreachable",
                ..
            }
        ));
        assert_eq!(judge(Some(State::Error), &o, None), Verdict::Nothing);
    }

    #[test]
    fn device_events_are_confirmed_by_reading_the_state() {
        let o = obs(Seen::Event("NULL_DEVICE_EVENT".into()));
        assert_eq!(judge(Some(State::Running), &o, None), Verdict::Confirm);
        assert!(matches!(
            confirmed(State::Running, &o, Ok(State::Error)),
            Some(Verdict::Apply {
                state: State::Error,
                ..
            })
        ));
        assert_eq!(confirmed(State::Running, &o, Ok(State::Running)), None);
        let slow = ControlError::Deadline {
            addr: "127.0.0.1:1".parse().unwrap(),
            call: "GetState".into(),
            deadline: READ_DEADLINE,
        };
        assert_eq!(confirmed(State::Running, &o, Err(&slow)), None);
        let refused = ControlError::Rpc {
            addr: "127.0.0.1:1".parse().unwrap(),
            call: "GetState".into(),
            code: tonic::Code::Unavailable,
            message: "connection refused".into(),
        };
        assert!(matches!(
            confirmed(State::Running, &o, Err(&refused)),
            Some(Verdict::Apply {
                state: State::Error,
                reason: "TaskUnreachable",
                ..
            })
        ));
    }
}

/// One follower a task lives as long as the task: its future is what an idle one costs.
#[cfg(test)]
mod follower_size {
    #[test]
    fn a_follower_is_small_while_it_waits() {
        let control = crate::control::policy::ControlClient::new(false);
        let ep = super::TaskEndpoint {
            addr: "127.0.0.1:1".parse().expect("addr"),
            mode: crate::model::ControlMode::Direct,
        };
        let follower = super::follow(&control, ep, |_| {});
        let read = control.get_state(&ep, std::time::Duration::from_secs(1));
        let (size, read) = (
            std::mem::size_of_val(&follower),
            std::mem::size_of_val(&read),
        );
        // 1,216 bytes with the state read inline (960 of them), 368 without (debug build).
        assert!(size < 512, "a follower's future is {size} bytes");
        assert!(size < read, "the state read ({read} bytes) is not inline");
    }
}

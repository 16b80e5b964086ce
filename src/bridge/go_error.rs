//! A critical task failing while its environment runs takes the environment out the anchor's
//! way: the leader requests GO_ERROR, once, so that the workflow's GO_ERROR hooks and calls
//! run and the tasks still RUNNING are stopped (the operator does both).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Bridge;
use super::audit::Audit;
use super::error::BridgeError;
use super::transition::TransitionCall;
use crate::roster::{Change, EnvKey, EnvRecord, Phase};
use crate::state::{Event, State};

/// How often the leader looks over every environment, besides the roster's changes: a
/// GO_ERROR whose request failed (the apiserver down), a change missed (the subscription
/// lagged), or one that came before this replica led, is asked then.
const RESCAN: Duration = Duration::from_secs(2);

/// Whether `e` needs the automatic GO_ERROR: ERROR with a critical task failing while RUNNING
/// is its desired state, not being deleted, no transition in flight, and no GO_ERROR asked.
pub fn needs_go_error(e: &EnvRecord) -> bool {
    let in_flight = match (&e.requested, &e.observed) {
        // Requested and not picked up yet (the status shows an earlier transition), or under
        // way: GO_ERROR waits for its outcome instead of overtaking it (seed 500 round 50).
        (Some((id, _)), Some(o)) => o.id != *id || o.phase == Phase::Running,
        (Some(_), None) => true,
        (None, _) => false,
    };
    e.state == Some(State::Error)
        && e.desired == State::Running
        && !e.deleting
        && e.failing.iter().any(|f| f.critical)
        && !matches!(e.requested, Some((_, Event::GoError)))
        && !in_flight
}

/// The environments of `seen` to ask GO_ERROR for now, each once while it needs it
/// (`asked` remembers them); one that is no longer ERROR may be asked again later.
pub fn to_ask(seen: &[Arc<EnvRecord>], asked: &mut HashSet<EnvKey>) -> Vec<Arc<EnvRecord>> {
    let mut ask = Vec::new();
    for e in seen {
        if !needs_go_error(e) {
            if e.state != Some(State::Error) {
                asked.remove(&e.key);
            }
        } else if asked.insert(e.key.clone()) {
            ask.push(e.clone());
        }
    }
    ask
}

/// A refusal that may pass later (the apiserver or etcd down, a timeout): asked again at the
/// next look. Any other (e.g. the event no longer applies) is the answer.
fn passing(e: &BridgeError) -> bool {
    matches!(e, BridgeError::Kube { .. } | BridgeError::Timeout { .. })
}

impl Bridge {
    /// Watches the roster and requests GO_ERROR where [`needs_go_error`] says so (leader only).
    pub async fn run_go_error(self: &Arc<Self>, stop: CancellationToken) {
        let mut changes = self.roster.subscribe();
        let mut asked: HashSet<EnvKey> = HashSet::new();
        let (again_tx, mut again) = mpsc::unbounded_channel::<EnvKey>();
        let mut rescan = tokio::time::interval(RESCAN);
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let seen = tokio::select! {
                _ = stop.cancelled() => return,
                _ = rescan.tick() => self.roster.envs(),
                Some(key) = again.recv() => {
                    asked.remove(&key);
                    continue;
                }
                change = changes.recv() => match change {
                    Ok(Change::EnvApplied(e)) => vec![e],
                    Ok(Change::EnvDeleted(k)) => {
                        asked.remove(&k);
                        continue;
                    }
                    Ok(_) => continue,
                    Err(RecvError::Lagged(_)) => self.roster.envs(),
                    Err(RecvError::Closed) => return,
                },
            };
            if !self.is_leader() {
                // A standby asks nothing; once it leads, the next look asks what is due.
                asked.clear();
                continue;
            }
            for e in to_ask(&seen, &mut asked) {
                let bridge = self.clone();
                let again = again_tx.clone();
                tokio::spawn(async move {
                    if let Err(err) = bridge.ask_go_error(&e).await
                        && passing(&err)
                    {
                        let _ = again.send(e.key.clone());
                    }
                });
            }
        }
    }

    /// Requests GO_ERROR for `e`, audited with its outcome.
    async fn ask_go_error(&self, e: &EnvRecord) -> Result<(), BridgeError> {
        let key = &e.key;
        let failing = e
            .failing
            .iter()
            .find(|f| f.critical)
            .map(|f| f.task.to_string())
            .unwrap_or_default();
        tracing::warn!(environment = %key.name, task = %failing, "critical task failed while RUNNING: GO_ERROR");
        let call = TransitionCall {
            env: format!("{}/{}", key.namespace, key.name),
            event: Some(Event::GoError),
            arguments: Default::default(),
            wait: false,
            timeout: None,
            transition_id: None,
        };
        let result = self.transition(&call).await.map(|_| ());
        let outcome = match &result {
            Ok(()) => "ok".to_string(),
            Err(e) if passing(e) => format!("refused (asked again): {e}"),
            Err(e) => format!("refused: {e}"),
        };
        self.audit(
            &Audit {
                caller: "envbridge (automatic)",
                role: "daemon",
                action: "transition",
                target: &format!("{} GO_ERROR (critical task {failing} failed)", key.name),
                outcome: &outcome,
            },
            Some((&key.namespace, &key.name)),
        )
        .await;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roster::{Failure, Observed};

    /// ERROR while RUNNING is desired, a critical task failing, its START done.
    fn failed_running(name: &str) -> Arc<EnvRecord> {
        Arc::new(EnvRecord {
            desired: State::Running,
            state: Some(State::Error),
            requested: Some(("t1".into(), Event::Start)),
            observed: Some(Observed {
                id: "t1".into(),
                event: Event::Start,
                phase: Phase::Succeeded,
                message: None,
            }),
            failing: vec![Failure {
                task: "readout-flp001".into(),
                node: "flp001".into(),
                path: "rd.readout".into(),
                critical: true,
                message: "control connection lost while RUNNING".into(),
            }],
            failing_critical: 1,
            ..EnvRecord::bare(EnvKey::new("ns", name))
        })
    }

    #[test]
    fn an_environment_is_asked_once_while_it_needs_go_error() {
        let mut asked = HashSet::new();
        let e = failed_running("a");
        let ask = to_ask(std::slice::from_ref(&e), &mut asked);
        assert_eq!(ask.len(), 1);
        // The next look (a rescan, another change of it) while the request is under way.
        assert!(to_ask(std::slice::from_ref(&e), &mut asked).is_empty());
        // A request that failed and may pass is forgotten: the next look asks again.
        asked.remove(&e.key);
        assert_eq!(to_ask(std::slice::from_ref(&e), &mut asked).len(), 1);
    }

    #[test]
    fn go_error_asked_or_a_transition_in_flight_asks_nothing() {
        let mut asked = HashSet::new();
        let mut e = (*failed_running("a")).clone();
        e.requested = Some(("t2".into(), Event::GoError));
        assert!(to_ask(&[Arc::new(e.clone())], &mut asked).is_empty());
        e.requested = Some(("t2".into(), Event::Stop));
        assert!(
            to_ask(&[Arc::new(e)], &mut asked).is_empty(),
            "STOP not picked up yet"
        );
        assert!(asked.is_empty());
    }

    #[test]
    fn an_environment_out_of_error_may_be_asked_again_later() {
        let mut asked = HashSet::new();
        let e = failed_running("a");
        assert_eq!(to_ask(std::slice::from_ref(&e), &mut asked).len(), 1);
        let recovered = Arc::new(EnvRecord {
            state: Some(State::Running),
            failing: vec![],
            failing_critical: 0,
            ..(*e).clone()
        });
        assert!(to_ask(&[recovered], &mut asked).is_empty());
        assert!(asked.is_empty());
        assert_eq!(to_ask(&[e], &mut asked).len(), 1);
    }
}

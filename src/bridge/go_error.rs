//! A critical task failing while its environment runs takes the environment out the anchor's
//! way: the leader requests GO_ERROR, once, so that the workflow's GO_ERROR hooks and calls
//! run and the tasks still RUNNING are stopped (the operator does both).

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::Bridge;
use super::audit::Audit;
use super::transition::TransitionCall;
use crate::roster::{Change, EnvKey, EnvRecord, Phase};
use crate::state::{Event, State};

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

impl Bridge {
    /// Watches the roster and requests GO_ERROR where [`needs_go_error`] says so (leader only).
    pub async fn run_go_error(self: &Arc<Self>, stop: CancellationToken) {
        let mut changes = self.roster.subscribe();
        let mut asked: HashSet<EnvKey> = HashSet::new();
        loop {
            let change = tokio::select! {
                _ = stop.cancelled() => return,
                c = changes.recv() => c,
            };
            let e = match change {
                Ok(Change::EnvApplied(e)) => e,
                Ok(Change::EnvDeleted(k)) => {
                    asked.remove(&k);
                    continue;
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            };
            if !needs_go_error(&e) {
                if e.state != Some(State::Error) {
                    asked.remove(&e.key);
                }
                continue;
            }
            if !self.is_leader() || !asked.insert(e.key.clone()) {
                continue;
            }
            let bridge = self.clone();
            let key = e.key.clone();
            tokio::spawn(async move {
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
                let outcome = match bridge.transition(&call).await {
                    Ok(_) => "ok".to_string(),
                    Err(e) => format!("refused: {e}"),
                };
                bridge
                    .audit(
                        &Audit {
                            caller: "envbridge (automatic)",
                            role: "daemon",
                            action: "transition",
                            target: &format!(
                                "{} GO_ERROR (critical task {failing} failed)",
                                key.name
                            ),
                            outcome: &outcome,
                        },
                        Some((&key.namespace, &key.name)),
                    )
                    .await;
            });
        }
    }
}

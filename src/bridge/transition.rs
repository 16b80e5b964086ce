//! Transitions: write {id, event, arguments} and the desired state on the Environment, then
//! wait on the roster for that transition id (see roster::wait for what counts).
//!
//! The transition lives in the Environment's spec and status, not in the daemon: after a
//! daemon restart it can be awaited again by id.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use tokio::time::Instant;

use super::Bridge;
use super::error::{BridgeError, Result};
use crate::crd::Environment;
use crate::roster::{EnvKey, Outcome, Progress};
use crate::state::{Event, State, next};

#[derive(Clone, Debug, Default)]
pub struct TransitionCall {
    /// Environment id or name.
    pub env: String,
    /// None with `transition_id`: await an earlier transition.
    pub event: Option<Event>,
    pub arguments: BTreeMap<String, String>,
    pub wait: bool,
    /// None: the configured timeout for the event.
    pub timeout: Option<Duration>,
    pub transition_id: Option<String>,
}

#[derive(Clone, Debug)]
pub struct TransitionResult {
    pub id: String,
    pub event: Event,
    pub target: State,
    /// None: not waited for. Some(Err(progress)): the deadline passed.
    pub outcome: Option<Result<Outcome, Progress>>,
    pub elapsed: Duration,
}

impl TransitionResult {
    pub fn ok(&self) -> bool {
        matches!(self.outcome, None | Some(Ok(Outcome::Reached { .. })))
    }
}

/// The most a transition's arguments may weigh in all: they are written on the Environment
/// twice (the transition, and a run's among its run variables).
pub const MAX_ARGUMENTS_BYTES: usize = 64 * 1024;

/// A transition's arguments within [`MAX_ARGUMENTS_BYTES`], or the error naming their size.
pub fn check_arguments(args: &BTreeMap<String, String>) -> Result<()> {
    let size: usize = args.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_ARGUMENTS_BYTES {
        return Err(BridgeError::Invalid(vec![format!(
            "arguments: {size} bytes in all, at most {MAX_ARGUMENTS_BYTES}; nothing was written"
        )]));
    }
    Ok(())
}

impl Bridge {
    pub async fn transition(&self, call: &TransitionCall) -> Result<TransitionResult> {
        let started = Instant::now();
        check_arguments(&call.arguments)?;
        let env = self.resolve(&call.env)?;
        let key = env.key.clone();
        let (id, event) = match (
            call.event,
            call.transition_id.as_deref().filter(|s| !s.is_empty()),
        ) {
            (None, Some(id)) => {
                let event = env
                    .requested
                    .as_ref()
                    .filter(|(rid, _)| &**rid == id)
                    .map(|(_, e)| *e)
                    .or_else(|| {
                        env.observed
                            .as_ref()
                            .filter(|o| &*o.id == id)
                            .map(|o| o.event)
                    })
                    .ok_or_else(|| BridgeError::NotFound(format!("transition {id} on {key}")))?;
                (id.to_string(), event)
            }
            (Some(event), _) => {
                self.ensure_leader()?;
                self.check_applicable(&key, event)?;
                let id = call
                    .transition_id
                    .clone()
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
                self.request(&key, &id, event, &call.arguments).await?;
                (id, event)
            }
            (None, None) => {
                return Err(BridgeError::Invalid(vec![
                    "a transition needs an event or a transition id".into(),
                ]));
            }
        };
        let target = event.target();
        let outcome = if call.wait {
            let timeout = call
                .timeout
                .unwrap_or_else(|| self.cfg.transition_timeout(event));
            let out = self
                .roster
                .wait_transition(&key, &id, target, started + timeout)
                .await;
            tracing::debug!(target: "envbridge::hops", hop = "daemon_seen", transition = %id, environment = %key);
            let label = match &out {
                Ok(Outcome::Reached { .. }) => "reached",
                Ok(Outcome::Failed { .. }) => "failed",
                Err(_) => "timeout",
            };
            self.metrics
                .transitions
                .get_or_create(&vec![
                    ("event", event.as_str().to_string()),
                    ("outcome", label.to_string()),
                ])
                .inc();
            Some(out)
        } else {
            None
        };
        Ok(TransitionResult {
            id,
            event,
            target,
            outcome,
            elapsed: started.elapsed(),
        })
    }

    /// Refuses an event that no critical task could take from where it stands (e.g. START on
    /// an environment still in STANDBY); mixed environments are left to the operator.
    fn check_applicable(&self, key: &EnvKey, event: Event) -> Result<()> {
        let (any, able, states) = self.roster.with_tasks(key, |tasks| {
            let mut states = std::collections::BTreeSet::new();
            let (mut any, mut able) = (false, false);
            for t in tasks.filter(|t| t.critical) {
                any = true;
                able |= next(t.state, event).is_some();
                states.insert(t.state.as_str());
            }
            (any, able, states)
        });
        if !any || able {
            return Ok(());
        }
        let state = states.into_iter().collect::<Vec<_>>().join("/");
        Err(BridgeError::InvalidTransition {
            event: event.to_string(),
            state,
        })
    }

    /// Writes the transition on the Environment (a JSON patch of these two fields only).
    async fn request(
        &self,
        key: &EnvKey,
        id: &str,
        event: Event,
        args: &BTreeMap<String, String>,
    ) -> Result<()> {
        let api: Api<Environment> = Api::namespaced(self.client.clone(), &key.namespace);
        // A JSON patch that sets the whole transition: a merge patch would merge `arguments`
        // into the previous transition's, so START's run number would stay in STOP, RESET and
        // the next CONFIGURE. Each transition carries exactly the arguments given for it.
        let mut ops = vec![
            serde_json::json!({ "op": "add", "path": "/spec/desiredState", "value": event.target() }),
            serde_json::json!({ "op": "add", "path": "/spec/transition",
              "value": { "id": id, "event": event, "arguments": args } }),
        ];
        // The run's variables, over the previous run's as the roster has them (a STOP
        // follows the START it ends, which the roster has seen once that START was answered).
        let previous = self
            .roster
            .env(key)
            .map(|e| e.run_variables.clone())
            .unwrap_or_default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        if let Some(vars) = crate::crd::run_variables(event, args, &previous, now) {
            ops.push(
                serde_json::json!({ "op": "add", "path": "/spec/runVariables", "value": vars }),
            );
        }
        let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
            .map_err(|e| BridgeError::Invalid(vec![format!("transition patch: {e}")]))?;
        let pp = PatchParams {
            field_manager: Some(self.cfg.field_manager.clone()),
            ..PatchParams::default()
        };
        api.patch(&key.name, &pp, &Patch::<()>::Json(patch))
            .await
            .map_err(BridgeError::kube(format!("request {event} on {key}")))?;
        tracing::info!(environment = %key, transition = id, %event, "transition requested");
        tracing::debug!(target: "envbridge::hops", hop = "daemon_written", transition = id, environment = %key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_bounded_and_the_refusal_names_their_size() {
        let small = BTreeMap::from([("run_number".to_string(), "7".to_string())]);
        assert!(check_arguments(&small).is_ok());
        let big = BTreeMap::from([("x".to_string(), "y".repeat(MAX_ARGUMENTS_BYTES))]);
        let e = check_arguments(&big).unwrap_err().to_string();
        assert!(e.contains(&(MAX_ARGUMENTS_BYTES + 1).to_string()), "{e}");
        assert!(e.contains("nothing was written"), "{e}");
    }
}

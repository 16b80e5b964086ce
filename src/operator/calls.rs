//! Integration calls (`call:` roles, `Environment.spec.hooks`): sent to their plugin's
//! endpoint when the hook gate reaches their trigger, awaited at their `await` moment like
//! hook tasks (docs/integrations.md has the interface).
//!
//! One HTTP POST per call and transition, JSON both ways, bounded by the call's timeout
//! (default 30 s) and by a response size limit. Where each call stands lives in memory, per
//! (environment uid, transition id, role path): an operator that restarts mid-transition
//! sends the calls of the current step again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tracing::{info, warn};

use super::hooks::Run;
use crate::crd::{HookRef, TransitionRequest};

/// A call with no `timeout`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// (environment uid, transition id or [`DESTROY`], call's role path).
type Key = (String, String, String);

/// The occasion of the calls at an environment's destruction (their trigger: `DESTROY`).
pub const DESTROY: &str = "DESTROY";
/// The occasion of the calls at an environment's deployment (`before_DEPLOY`, `after_DEPLOY`,
/// `enter_DEPLOYED`).
pub const DEPLOY: &str = "DEPLOY";

/// When a call runs around the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeployStep {
    /// `before_DEPLOY[±w]`: before the Tasks are created.
    Before,
    /// `after_DEPLOY[±w]`, `enter_DEPLOYED`: once every task is deployed (STANDBY).
    After,
}

/// The deployment step of a trigger or await, if it is one.
pub fn deploy_step(moment: &str) -> Option<DeployStep> {
    use super::hooks::{Moment, Phase, parse_moment};
    match parse_moment("trigger", moment).ok()? {
        Moment::Event {
            phase: Phase::Before,
            event,
            ..
        } if event == DEPLOY => Some(DeployStep::Before),
        Moment::Event {
            phase: Phase::After,
            event,
            ..
        } if event == DEPLOY => Some(DeployStep::After),
        Moment::State {
            phase: Phase::Enter,
            state,
            ..
        } if state == "DEPLOYED" => Some(DeployStep::After),
        _ => None,
    }
}

/// What a call is sent for: a transition, or the destruction.
struct Occasion<'a> {
    id: &'a str,
    event: &'a str,
    arguments: &'a std::collections::BTreeMap<String, String>,
}

/// What an integration receives (JSON, camelCase): the documented payload.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Payload<'a> {
    pub plugin: &'a str,
    pub function: &'a str,
    pub arguments: &'a [String],
    /// The call's role path and `func` as written.
    pub call: &'a str,
    pub func: &'a str,
    pub environment_id: &'a str,
    /// The transition's event (`START`), and the trigger that sent the call.
    pub event: &'a str,
    pub trigger: &'a str,
    /// The run's number for calls of START, STOP and GO_ERROR (START's `run_number`).
    pub run_number: Option<&'a str>,
    pub variables: &'a std::collections::BTreeMap<String, String>,
}

/// The calls in flight and their outcomes.
#[derive(Default)]
pub struct Calls {
    runs: Mutex<HashMap<Key, Run>>,
    /// The run number of each environment's current run (START's `run_number`): what the
    /// calls of START, STOP and GO_ERROR carry, as the anchor's do.
    run_numbers: Mutex<HashMap<String, String>>,
    http: crate::integration::Endpoints,
}

impl Calls {
    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Run>> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where call `path` of occasion `id` (a transition's id, or [`DESTROY`]) of environment
    /// `env_uid` stands.
    pub fn run_of(&self, env_uid: &str, id: &str, path: &str) -> Run {
        self.runs()
            .get(&(env_uid.to_string(), id.to_string(), path.to_string()))
            .cloned()
            .unwrap_or(Run::Idle)
    }

    /// Whether a call of this occasion is still in flight.
    pub fn any_running(&self, env_uid: &str, id: &str) -> bool {
        self.runs()
            .iter()
            .any(|((e, t, _), r)| e == env_uid && t == id && *r == Run::Started)
    }

    /// Forgets everything about an environment that is gone.
    pub fn forget(&self, env_uid: &str) {
        self.runs().retain(|(e, _, _), _| e != env_uid);
        self.run_numbers().remove(env_uid);
    }

    fn run_numbers(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.run_numbers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The run number a call of `event` carries: START's own, remembered for the STOP and
    /// GO_ERROR of that run.
    fn run_number(
        &self,
        env_uid: &str,
        event: &str,
        args: &std::collections::BTreeMap<String, String>,
    ) -> Option<String> {
        let mut known = self.run_numbers();
        match event {
            "START" => {
                let n = args.get("run_number").cloned()?;
                known.insert(env_uid.to_string(), n.clone());
                Some(n)
            }
            "STOP" | "GO_ERROR" => known.get(env_uid).cloned(),
            _ => None,
        }
    }

    /// Sends `call` of transition `req` (once per transition).
    pub fn start(
        self: &Arc<Self>,
        env_uid: &str,
        environment_id: &str,
        req: &TransitionRequest,
        call: &HookRef,
    ) {
        let occasion = Occasion {
            id: &req.id,
            event: req.event.as_str(),
            arguments: &req.arguments,
        };
        self.send(env_uid, environment_id, &occasion, call);
    }

    /// Sends `call` at the environment's deployment or destruction ([`DEPLOY`], [`DESTROY`]),
    /// once.
    pub fn start_at(
        self: &Arc<Self>,
        occasion: &'static str,
        env_uid: &str,
        environment_id: &str,
        call: &HookRef,
    ) {
        let none = Default::default();
        let occasion = Occasion {
            id: occasion,
            event: occasion,
            arguments: &none,
        };
        self.send(env_uid, environment_id, &occasion, call);
    }

    fn send(self: &Arc<Self>, env_uid: &str, environment_id: &str, req: &Occasion, call: &HookRef) {
        let key = (env_uid.to_string(), req.id.to_string(), call.path.clone());
        {
            let mut runs = self.runs();
            // Outcomes of this environment's earlier transitions are no longer read.
            runs.retain(|(e, t, _), _| e != env_uid || t == req.id);
            if runs.contains_key(&key) {
                return;
            }
            runs.insert(key.clone(), Run::Started);
        }
        let Some(endpoint) = call.endpoint.clone() else {
            let why = format!("no endpoint serves plugin `{}`", call.plugin);
            warn!(call = %call.path, "{why}");
            self.runs().insert(key, Run::Failed(why));
            return;
        };
        let run_number = self.run_number(env_uid, req.event, req.arguments);
        let payload = Payload {
            plugin: &call.plugin,
            function: &call.function,
            arguments: &call.arguments,
            call: &call.path,
            func: &call.func,
            environment_id,
            event: req.event,
            trigger: call.trigger.as_deref().unwrap_or(""),
            run_number: run_number.as_deref(),
            variables: &call.variables,
        };
        let body = serde_json::to_vec(&payload).unwrap_or_default();
        let timeout = call
            .timeout_seconds
            .map(|s| Duration::from_secs(u64::from(s)))
            .unwrap_or(DEFAULT_TIMEOUT);
        let this = self.clone();
        let path = call.path.clone();
        info!(call = %path, %endpoint, "integration call sent");
        tokio::spawn(async move {
            let outcome = match tokio::time::timeout(timeout, this.http.post(&endpoint, body)).await
            {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
            };
            let run = match outcome {
                Ok(_) => Run::Succeeded,
                Err(why) => {
                    warn!(call = %path, error = %why, "integration call failed");
                    Run::Failed(why)
                }
            };
            this.runs().insert(key, run);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploy_steps() {
        assert_eq!(deploy_step("before_DEPLOY-100"), Some(DeployStep::Before));
        assert_eq!(deploy_step("before_DEPLOY"), Some(DeployStep::Before));
        assert_eq!(deploy_step("after_DEPLOY+100"), Some(DeployStep::After));
        assert_eq!(deploy_step("enter_DEPLOYED"), Some(DeployStep::After));
        assert_eq!(deploy_step("before_CONFIGURE"), None);
        assert_eq!(deploy_step("DESTROY"), None);
    }
}

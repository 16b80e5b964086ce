//! NewAutoEnvironment and Subscribe: an environment that runs by itself, as the anchor's
//! automatic environments do: created, deployed, configured and started at once; once its
//! run ends (the environment back in CONFIGURED: its tasks finished, or a shifter stopped
//! it) it is reset and destroyed; a failure on the way sends it GO_ERROR and destroys it.
//! Its events (the environment's and its tasks' changes, from the roster) go to the
//! Subscribe stream of the same id, which ends when the environment is gone.
//!
//! Subscribe with the id of an environment the roster holds (and no automatic environment
//! of that id) streams that environment's changes until it is gone: envbridge's addition,
//! the anchor streams automatic environments only.
//!
//! The driver lives in this daemon: after a restart the environment stays, as any other, in
//! the state its tasks tell, for a shifter to drive or destroy.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::events::{Feed, stamped};
use super::pb::events as ev;
use super::pb::o2control as pb;
use super::service::Control;
use super::subscriptions::{EventStream, Sink};
use super::writes::{NewRequest, deploy_and_configure, run};
use crate::bridge::Bridge;
use crate::roster::EnvKey;
use crate::server::auth::Caller;
use crate::state::{Event, State};

/// An environment event from the driver itself (a step of the automatic environment).
fn said(env_id: &str, state: &str, message: &str, error: &str) -> ev::Event {
    stamped(ev::event::Payload::EnvironmentEvent(
        ev::EvEnvironmentEvent {
            environment_id: env_id.to_string(),
            state: state.into(),
            message: message.into(),
            error: error.into(),
            ..Default::default()
        },
    ))
}

/// Forwards an environment's roster changes as events into `sink` until its end is told or
/// `stop` resolves; whether the end was told.
async fn forward(
    bridge: Arc<Bridge>,
    mut feed: Feed,
    sink: Arc<tokio::sync::Mutex<Sink>>,
    stop: impl std::future::Future<Output = ()>,
) -> bool {
    let mut changes = bridge.roster.subscribe();
    let first = feed.snapshot(&bridge.roster);
    sink.lock().await.send_all(first);
    tokio::pin!(stop);
    while !feed.ended() {
        let change = tokio::select! {
            _ = &mut stop => break,
            c = changes.recv() => c,
        };
        let out = match change {
            Ok(c) => feed.on(&c, &bridge.roster),
            Err(RecvError::Lagged(_)) => feed.snapshot(&bridge.roster),
            Err(RecvError::Closed) => break,
        };
        sink.lock().await.send_all(out);
    }
    feed.ended()
}

/// The step an automatic environment takes next while its run goes on, from its state:
/// None while it runs (or is between states).
#[derive(Debug, PartialEq)]
enum Next {
    /// The run ended (CONFIGURED): reset and destroy.
    Finish,
    /// It failed or fell back (ERROR, STANDBY, DEPLOYING): GO_ERROR and destroy.
    Fail,
    /// Someone else destroyed it.
    Gone,
}

fn next(state: Option<Option<State>>) -> Option<Next> {
    match state {
        None => Some(Next::Gone),
        Some(Some(State::Configured)) => Some(Next::Finish),
        Some(Some(State::Error | State::Standby | State::Deploying | State::Done)) => {
            Some(Next::Fail)
        }
        Some(Some(State::Running | State::Mixed) | None) => None,
    }
}

impl Control {
    /// NewAutoEnvironment: created before the answer (a refused variable or workflow is the
    /// answer), then driven in the background.
    pub(super) async fn new_auto(
        &self,
        caller: &Caller,
        r: pb::NewAutoEnvironmentRequest,
    ) -> Result<pb::NewAutoEnvironmentReply, Status> {
        let mut sink = self.subscriptions.bind(&r.id)?;
        let req = NewRequest {
            workflow_template: &r.workflow_template,
            vars: &r.vars,
            request_user: r.request_user.as_ref(),
        };
        let (key, caller, created) = match self.create_only(caller, &req).await {
            Ok(c) => c,
            Err(s) => {
                // As the anchor: the GUI and coconut listen for these words.
                sink.send(said(
                    &r.id,
                    "ERROR",
                    "cannot create new environment",
                    s.message(),
                ));
                return Err(s);
            }
        };
        sink.send(said(&created.id, "PENDING", "instantiating", ""));
        let this = self.clone();
        tokio::spawn(async move { this.drive(key, caller, created.id, sink).await });
        Ok(pb::NewAutoEnvironmentReply {
            timestamp: crate::server::convert::millis(std::time::SystemTime::now()),
        })
    }

    /// Subscribe: the automatic environment's events for its id, or (envbridge's addition)
    /// an existing environment's changes.
    pub(super) fn subscribe(&self, id: &str) -> Result<EventStream, Status> {
        let existing = self.bridge.roster.find_env(id);
        if let [env] = existing.as_slice()
            && &*env.id == id
            && let Ok(mut sink) = self.subscriptions.bind(id)
        {
            let stream = self.subscriptions.subscribe(id)?;
            let mut feed = Feed::new(env.key.clone(), id);
            if self.bridge.roster.env(&env.key).is_none() {
                // Gone since it was found: the end, at once.
                sink.send(feed.env_gone());
                return Ok(stream);
            }
            // Until the environment is gone, or the subscriber.
            let gone = sink.closed_signal();
            let sink = Arc::new(tokio::sync::Mutex::new(sink));
            tokio::spawn(forward(self.bridge.clone(), feed, sink, gone));
            return Ok(stream);
        }
        self.subscriptions.subscribe(id)
    }

    /// The automatic environment's life after its create.
    async fn drive(self, key: EnvKey, caller: Caller, env_id: String, sink: Sink) {
        let sink = Arc::new(tokio::sync::Mutex::new(sink));
        let stop = CancellationToken::new();
        let fwd = tokio::spawn(forward(
            self.bridge.clone(),
            Feed::new(key.clone(), &env_id),
            sink.clone(),
            stop.clone().cancelled_owned(),
        ));
        let end = self.run_auto(&key, &caller, &env_id).await;
        if let Err(why) = end {
            tracing::warn!(environment = %key, error = %why, "automatic environment failed; it is destroyed");
            sink.lock().await.send(said(
                &env_id,
                "ERROR",
                "automatic environment failed, cleanup in progress",
                &why,
            ));
            self.force_destroy(&key, &caller).await;
        }
        stop.cancel();
        let told = fwd.await.unwrap_or(false);
        if !told {
            sink.lock()
                .await
                .send(said(&env_id, "DONE", "environment teardown complete", ""));
        }
    }

    /// Deploy, CONFIGURE, START_ACTIVITY, then wait for the run to end; RESET and destroy.
    /// Err: what failed (the caller sends GO_ERROR and destroys).
    async fn run_auto(&self, key: &EnvKey, caller: &Caller, env_id: &str) -> Result<(), String> {
        // Its own words: "deployment failed: ..." or "CONFIGURE failed: ...".
        deploy_and_configure(&self.bridge, caller, key).await?;
        let args = self
            .start_arguments(env_id, std::time::SystemTime::now())
            .await
            .map_err(|s| format!("transition START_ACTIVITY failed: {}", s.message()))?;
        run(&self.bridge, caller, key, Event::Start, args)
            .await
            .map_err(|m| format!("transition START_ACTIVITY failed: {m}"))?;
        let roster = &self.bridge.roster;
        let mut version = roster.version();
        let step = loop {
            version.borrow_and_update();
            if let Some(n) = next(roster.env(key).map(|e| e.state)) {
                break n;
            }
            if version.changed().await.is_err() {
                break Next::Gone;
            }
        };
        match step {
            Next::Gone => Ok(()),
            Next::Fail => Err("the run ended in ERROR or lost its tasks".to_string()),
            Next::Finish => {
                run(&self.bridge, caller, key, Event::Reset, BTreeMap::new())
                    .await
                    .map_err(|m| format!("transition RESET failed: {m}"))?;
                self.destroy_env(key, caller)
                    .await
                    .map_err(|s| format!("teardown failed: {}", s.message()))
            }
        }
    }

    /// GO_ERROR where it applies, then destroy whatever the state.
    async fn force_destroy(&self, key: &EnvKey, caller: &Caller) {
        if self.bridge.roster.env(key).is_none() {
            return;
        }
        let _ = run(&self.bridge, caller, key, Event::GoError, BTreeMap::new()).await;
        if let Err(e) = self.destroy_env(key, caller).await {
            tracing::warn!(environment = %key, error = %e, "automatic environment: teardown failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_ends_by_state() {
        assert_eq!(next(Some(Some(State::Running))), None);
        assert_eq!(next(Some(Some(State::Mixed))), None);
        assert_eq!(next(Some(None)), None);
        assert_eq!(next(Some(Some(State::Configured))), Some(Next::Finish));
        for s in [State::Error, State::Standby, State::Deploying, State::Done] {
            assert_eq!(next(Some(Some(s))), Some(Next::Fail), "{s:?}");
        }
        assert_eq!(next(None), Some(Next::Gone));
    }
}

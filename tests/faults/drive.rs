//! The client side of a round, as a run-control client that survives its daemon: every call
//! goes to the replica that leads (else any), and one that fails because a daemon, the
//! apiserver or etcd is down is retried, a transition already written being awaited by its id
//! rather than asked twice. A step that does not end within [`STEP_BOUND`] is a violation
//! (a wait that hangs).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use envbridge::server::pb;
use envbridge::server::pb::env_bridge_client::EnvBridgeClient;
use tonic::transport::Channel;

use super::site::Site;

/// The longest a step may take, faults included, before it counts as hung.
pub const STEP_BOUND: Duration = Duration::from_secs(150);
const RETRY: Duration = Duration::from_millis(300);

/// What a step's call answered in the end.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub ok: bool,
    pub message: String,
    /// Tasks named as failing (task name, message); an empty name: no task named.
    pub failures: Vec<(String, String)>,
    pub retries: u32,
}

fn failures(f: &[pb::Failure]) -> Vec<(String, String)> {
    f.iter()
        .map(|f| (f.task.clone(), f.message.clone()))
        .collect()
}

/// Replicas in the order to try: the leader first.
async fn order(site: &Site) -> Vec<usize> {
    let mut o: Vec<usize> = (0..site.daemons.len()).collect();
    if let Some(l) = site.leader().await
        && l < o.len()
    {
        o.retain(|i| *i != l);
        o.insert(0, l);
    }
    o
}

/// What one call to one replica gave.
enum Attempt {
    Done(Outcome),
    /// Not an answer yet (an error, or a wait that ended first): this, then try again.
    Again(String),
}

/// Calls `call` on the replicas, leader first, until one gives an outcome or
/// [`STEP_BOUND`] passes; `call` gets the client, the replica and the retries so far.
async fn retrying<F, Fut>(site: &Site, what: &str, mut call: F) -> Result<Outcome, String>
where
    F: FnMut(EnvBridgeClient<Channel>, usize, u32) -> Fut,
    Fut: Future<Output = Attempt>,
{
    let start = Instant::now();
    let mut retries = 0;
    let mut last = String::new();
    while start.elapsed() < STEP_BOUND {
        for r in order(site).await {
            let Some(api) = site.api(r).await else {
                continue;
            };
            match call(api, r, retries).await {
                Attempt::Done(mut o) => {
                    o.retries = retries;
                    return Ok(o);
                }
                Attempt::Again(why) => last = why,
            }
        }
        retries += 1;
        tokio::time::sleep(RETRY).await;
    }
    Err(format!(
        "{what} did not end within {STEP_BOUND:?} (last: {last})"
    ))
}

fn outcome(ok: bool, message: String, failures: Vec<(String, String)>) -> Attempt {
    Attempt::Done(Outcome {
        ok,
        message,
        failures,
        retries: 0,
    })
}

/// Creates environment `id` on `hosts`, waiting until its tasks are STANDBY.
pub async fn create(site: &Site, id: &str, hosts: &[String]) -> Result<Outcome, String> {
    let hosts = serde_json::to_string(hosts).expect("hosts as JSON");
    let hosts = &hosts;
    retrying(site, &format!("create {id}"), |mut api, r, _| async move {
        let req = pb::CreateEnvironmentRequest {
            workflow: "readout-dataflow".into(),
            variables: BTreeMap::from([("hosts".to_string(), hosts.clone())])
                .into_iter()
                .collect(),
            // The same key on every retry: a create the daemon had written is not made twice.
            idempotency_key: format!("faults-{id}"),
            env_id: id.to_string(),
            wait: true,
            timeout_seconds: 120,
        };
        match api.create_environment(req).await {
            // The same key again waits on the same environment.
            Ok(r) if r.get_ref().outcome == "timeout" => {
                let r = r.into_inner();
                Attempt::Again(format!("{}: {}", r.outcome, r.message))
            }
            Ok(r) => {
                let r = r.into_inner();
                outcome(
                    r.outcome == "reached",
                    format!("{}: {}", r.outcome, r.message),
                    failures(&r.failures),
                )
            }
            Err(e) => Attempt::Again(format!("daemon-{r}: {}", e.message())),
        }
    })
    .await
}

pub async fn requested(site: &Site, id: &str) -> Option<pb::TransitionInfo> {
    for r in order(site).await {
        if let Some(mut api) = site.api(r).await
            && let Ok(e) = api
                .get_environment(pb::GetEnvironmentRequest { id: id.into() })
                .await
        {
            return e.into_inner().requested;
        }
    }
    None
}

/// Runs `event` on `id` and waits for its outcome. A requested transition with this event
/// and an id other than the one the environment had asked for before this call is ours,
/// written before a call failed: it is awaited by its id, never asked twice.
pub async fn transition(site: &Site, id: &str, event: &str) -> Result<Outcome, String> {
    let before = requested(site, id).await.map(|t| t.id).unwrap_or_default();
    let ours: RefCell<Option<String>> = RefCell::new(None);
    let (ours, before) = (&ours, &before);
    retrying(
        site,
        &format!("{event} of {id}"),
        |mut api, r, retries| async move {
            if ours.borrow().is_none()
                && retries > 0
                && let Some(t) = requested(site, id).await
                && t.id != *before
                && t.event == event
            {
                *ours.borrow_mut() = Some(t.id);
            }
            let awaited = ours.borrow().clone();
            let req = match awaited {
                Some(tid) => pb::TransitionRequest {
                    id: id.into(),
                    transition_id: tid,
                    wait: true,
                    timeout_seconds: 90,
                    ..Default::default()
                },
                None => pb::TransitionRequest {
                    id: id.into(),
                    event: event.into(),
                    wait: true,
                    timeout_seconds: 90,
                    ..Default::default()
                },
            };
            match api.transition(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    if r.outcome == "timeout" || r.outcome == "requested" {
                        // Still running (the wait ended first): await it again.
                        *ours.borrow_mut() = Some(r.transition_id.clone());
                        return Attempt::Again(format!("{}: {}", r.outcome, r.message));
                    }
                    outcome(
                        r.ok,
                        format!("{}: {}", r.outcome, r.message),
                        failures(&r.failures),
                    )
                }
                // The leader's refusal (the event does not apply, e.g. after the automatic
                // GO_ERROR) is an answer, not an outage: retrying it only hangs the step.
                Err(e) if e.code() == tonic::Code::FailedPrecondition => outcome(
                    false,
                    format!("refused by daemon-{r}: {}", e.message()),
                    Vec::new(),
                ),
                Err(e) => Attempt::Again(format!("daemon-{r}: {:?} {}", e.code(), e.message())),
            }
        },
    )
    .await
}

/// Destroys `id`, waiting until it is gone.
pub async fn destroy(site: &Site, id: &str) -> Result<Outcome, String> {
    retrying(
        site,
        &format!("destroy of {id}"),
        |mut api, r, retries| async move {
            let req = pb::DestroyEnvironmentRequest {
                id: id.into(),
                wait: true,
                timeout_seconds: 120,
            };
            match api.destroy_environment(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    outcome(r.gone, r.message, Vec::new())
                }
                // Gone already: a destroy that landed before its answer was lost.
                Err(e) if e.code() == tonic::Code::NotFound && retries > 0 => {
                    outcome(true, "gone (not found on retry)".into(), Vec::new())
                }
                Err(e) => Attempt::Again(format!("daemon-{r}: {:?} {}", e.code(), e.message())),
            }
        },
    )
    .await
}

/// Environment `id` as replica `r` sees it (None: unreachable or unknown there).
pub async fn get(site: &Site, r: usize, id: &str) -> Option<pb::Environment> {
    let mut api = site.api(r).await?;
    api.get_environment(pb::GetEnvironmentRequest { id: id.into() })
        .await
        .ok()
        .map(|e| e.into_inner())
}

/// Gives the outcome's tasks and the reason, for a violation message.
pub fn describe(o: &Outcome) -> String {
    let named: Vec<&str> = o.failures.iter().map(|(t, _)| t.as_str()).collect();
    format!("{} (failing: {:?})", o.message, named)
}

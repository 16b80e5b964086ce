//! The client side of a round, as a run-control client that survives its daemon: every call
//! goes to the replica that leads (else any), and one that fails because a daemon, the
//! apiserver or etcd is down is retried, a transition already written being awaited by its id
//! rather than asked twice. A step that does not end within [`STEP_BOUND`] is a violation
//! (a wait that hangs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use envbridge::server::pb;

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

/// Creates environment `id` on `hosts`, waiting until its tasks are STANDBY.
pub async fn create(site: &Site, id: &str, hosts: &[String]) -> Result<Outcome, String> {
    let start = Instant::now();
    let hosts = serde_json::to_string(hosts).expect("hosts as JSON");
    let mut retries = 0;
    let mut last = String::new();
    while start.elapsed() < STEP_BOUND {
        for r in order(site).await {
            let Some(mut api) = site.api(r).await else {
                continue;
            };
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
                Ok(r) => {
                    let r = r.into_inner();
                    if r.outcome == "timeout" {
                        last = format!("{}: {}", r.outcome, r.message);
                        continue; // the same key again: waits on the same environment
                    }
                    return Ok(Outcome {
                        ok: r.outcome == "reached",
                        message: format!("{}: {}", r.outcome, r.message),
                        failures: failures(&r.failures),
                        retries,
                    });
                }
                Err(e) => last = format!("daemon-{r}: {}", e.message()),
            }
        }
        retries += 1;
        tokio::time::sleep(RETRY).await;
    }
    Err(format!(
        "create {id} did not end within {STEP_BOUND:?} (last: {last})"
    ))
}

async fn requested(site: &Site, id: &str) -> Option<pb::TransitionInfo> {
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

/// Runs `event` on `id` and waits for its outcome. `before` is the id of the transition the
/// environment had asked for before this one: a requested transition with another id and
/// this event is ours, written before the call failed.
pub async fn transition(site: &Site, id: &str, event: &str) -> Result<Outcome, String> {
    let start = Instant::now();
    let before = requested(site, id).await.map(|t| t.id).unwrap_or_default();
    let mut ours: Option<String> = None;
    let mut retries = 0;
    let mut last = String::new();
    while start.elapsed() < STEP_BOUND {
        for r in order(site).await {
            let Some(mut api) = site.api(r).await else {
                continue;
            };
            if ours.is_none()
                && retries > 0
                && let Some(t) = requested(site, id).await
                && t.id != before
                && t.event == event
            {
                ours = Some(t.id);
            }
            let req = match &ours {
                Some(tid) => pb::TransitionRequest {
                    id: id.into(),
                    transition_id: tid.clone(),
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
                        ours = Some(r.transition_id.clone());
                        last = format!("{}: {}", r.outcome, r.message);
                        continue;
                    }
                    return Ok(Outcome {
                        ok: r.ok,
                        message: format!("{}: {}", r.outcome, r.message),
                        failures: failures(&r.failures),
                        retries,
                    });
                }
                Err(e) => last = format!("daemon-{r}: {:?} {}", e.code(), e.message()),
            }
        }
        retries += 1;
        tokio::time::sleep(RETRY).await;
    }
    Err(format!(
        "{event} of {id} did not end within {STEP_BOUND:?} (last: {last})"
    ))
}

/// Destroys `id`, waiting until it is gone.
pub async fn destroy(site: &Site, id: &str) -> Result<Outcome, String> {
    let start = Instant::now();
    let mut retries = 0;
    let mut last = String::new();
    while start.elapsed() < STEP_BOUND {
        for r in order(site).await {
            let Some(mut api) = site.api(r).await else {
                continue;
            };
            let req = pb::DestroyEnvironmentRequest {
                id: id.into(),
                wait: true,
                timeout_seconds: 120,
            };
            match api.destroy_environment(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    return Ok(Outcome {
                        ok: r.gone,
                        message: r.message,
                        failures: Vec::new(),
                        retries,
                    });
                }
                // Gone already: a destroy that landed before its answer was lost.
                Err(e) if e.code() == tonic::Code::NotFound && retries > 0 => {
                    return Ok(Outcome {
                        ok: true,
                        message: "gone (not found on retry)".into(),
                        failures: Vec::new(),
                        retries,
                    });
                }
                Err(e) => last = format!("daemon-{r}: {:?} {}", e.code(), e.message()),
            }
        }
        retries += 1;
        tokio::time::sleep(RETRY).await;
    }
    Err(format!(
        "destroy of {id} did not end within {STEP_BOUND:?} (last: {last})"
    ))
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

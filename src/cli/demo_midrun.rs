//! The demo's mid-run failure: a process that fails while RUNNING, unprompted by any
//! transition, and how long the Environment takes to show it.

use std::time::Duration;

use envbridge::server::pb;
use futures::StreamExt;

use super::demo::{Kubectl, create, destroy, say, step, transition};
use super::env_connect::Client;

/// How long the simulator runs before failing by itself.
const FAIL_AFTER: &str = "RUNNING=2s";
/// How long the demo waits for the Environment to show the failure.
const SEEN_WITHIN: Duration = Duration::from_secs(60);

/// Creates an environment whose StfBuilder on `host` moves itself to ERROR 2 s into RUNNING,
/// starts it, and waits for the Environment's ERROR on the daemon's WatchEvents. Returns the
/// milliseconds from the simulator's own state change (its log's `unix_ms`) to the
/// Environment showing ERROR, and the task's name.
pub async fn show(
    api: &mut Client,
    live: &mut Vec<String>,
    kubectl: &Kubectl,
    hosts_json: &str,
    host: &str,
    logs: &super::demo_cluster::TaskLogs,
) -> Result<(u64, String), String> {
    step(&format!(
        "mid-run failure: a third environment whose StfBuilder on {host} fails by itself 2 s into RUNNING"
    ));
    let env = create(
        api,
        live,
        "demo-midrun",
        "readout-dataflow",
        &[
            ("hosts", hosts_json),
            ("sim_fail_host", host),
            ("sim_fail_in", FAIL_AFTER),
        ],
    )
    .await?;
    let mut events = api
        .watch_events(pb::WatchEventsRequest {
            id: env.id.clone(),
            snapshot: false,
        })
        .await
        .map_err(|s| format!("WatchEvents: {}", s.message()))?
        .into_inner();
    for event in ["CONFIGURE", "START"] {
        let r = transition(api, &env.id, event, &[]).await?;
        if !r.ok {
            return Err(format!("{event} of {}: {}", env.id, r.message));
        }
    }
    say("RUNNING; no transition is asked from here on");
    let seen = tokio::time::timeout(SEEN_WITHIN, async {
        while let Some(ev) = events.next().await {
            let ev = ev.map_err(|s| format!("WatchEvents: {}", s.message()))?;
            if let Some(e) = ev.environment.filter(|e| e.state == "ERROR") {
                return Ok::<_, String>((unix_ms(), e));
            }
        }
        Err("WatchEvents ended".to_string())
    })
    .await
    .map_err(|_| format!("the Environment did not show ERROR within {SEEN_WITHIN:?}"))??;
    let (at, e) = seen;
    let failed = e
        .failing
        .iter()
        .find(|f| f.critical)
        .ok_or("ERROR without a critical failing task")?;
    let text = logs.text(&e.namespace, &failed.task).await?;
    let changed = envbridge::control::sim::last_self_error_ms(&text)
        .ok_or_else(|| format!("{}: no self-inflicted change logged", failed.task))?;
    let ms = at.saturating_sub(changed);
    say(&format!(
        "ERROR shown {ms} ms after the simulator's own change: task {} on {}: {}",
        failed.task, failed.node, failed.message
    ));
    kubectl.show_when(&e.namespace, &env.id, "ERROR");
    let task = failed.task.clone();
    destroy(api, &env.id).await?;
    live.retain(|id| id != &env.id);
    say("mid-run failed environment destroyed");
    Ok((ms, task))
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

//! What a failed or stuck pod tells about its task: the container's termination message and
//! the pod's Warning events, bounded so that a mass failure still fits in the status.

use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use super::stored_pod::StoredPod;

use super::bounded;
use tracing::debug;

/// At most this much of a termination message is kept (its end: the last lines).
pub const LAST_LOG_MAX: usize = 4096;
/// At most this many Warning events, each at most [`EVENT_MAX`] bytes.
pub const EVENTS_MAX: usize = 10;
pub const EVENT_MAX: usize = 512;

/// The end of `s`, at most `max` bytes (marked when cut).
pub fn tail(s: &str, max: usize) -> String {
    match bounded::tail(s, max) {
        t if t.len() == s.len() => s.to_string(),
        t => format!("[...]{t}"),
    }
}

/// The start of `s`, at most `max` bytes (marked when cut).
fn head(s: &str, max: usize) -> String {
    match bounded::head(s, max) {
        h if h.len() == s.len() => s.to_string(),
        h => format!("{h}[...]"),
    }
}

/// The termination message of the pod's first container that has one.
pub fn termination_message(pod: &StoredPod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
        .find(|m| !m.trim().is_empty())
        .map(|m| tail(m.trim_end(), LAST_LOG_MAX))
}

/// Why a pod is not scheduled or not started, from its conditions (e.g. PodScheduled False).
pub fn pending_reasons(pod: &StoredPod) -> Vec<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.status == "False")
        .filter_map(|c| {
            let reason = c.reason.as_deref().unwrap_or(&c.type_);
            let msg = c.message.as_deref().unwrap_or("");
            (!msg.is_empty() || c.reason.is_some()).then(|| format!("{reason}: {msg}"))
        })
        .collect()
}

/// Orders and bounds event lines ("Reason: message"), the most recent last.
pub fn event_lines(mut events: Vec<(String, String, String)>) -> Vec<String> {
    // (time, reason, message)
    events.sort();
    events.dedup_by(|a, b| a.1 == b.1 && a.2 == b.2);
    let skip = events.len().saturating_sub(EVENTS_MAX);
    events
        .into_iter()
        .skip(skip)
        .map(|(_, reason, msg)| head(&format!("{reason}: {msg}"), EVENT_MAX))
        .collect()
}

/// The pod's Warning events (one list call, made only when a task fails).
pub async fn warning_events(client: &Client, pod: &StoredPod) -> Vec<String> {
    let ns = pod.namespace().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    let mut fields = format!("involvedObject.name={},type=Warning", pod.name_any());
    if let Some(uid) = pod.uid() {
        fields.push_str(&format!(",involvedObject.uid={uid}"));
    }
    match api.list(&ListParams::default().fields(&fields)).await {
        Ok(list) => event_lines(
            list.items
                .into_iter()
                .map(|e| {
                    let at = e
                        .last_timestamp
                        .map(|t| t.0.to_string())
                        .or_else(|| e.event_time.map(|t| t.0.to_string()))
                        .unwrap_or_default();
                    (
                        at,
                        e.reason.unwrap_or_default(),
                        e.message.unwrap_or_default(),
                    )
                })
                .collect(),
        ),
        Err(e) => {
            debug!(pod = %pod.name_any(), error = %e, "could not list the pod's events");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_long_log_is_kept() {
        let log: String = (0..2000).map(|i| format!("line {i}\n")).collect();
        let t = tail(&log, LAST_LOG_MAX);
        assert!(t.len() <= LAST_LOG_MAX + 5);
        assert!(t.starts_with("[...]"));
        assert!(t.ends_with("line 1999\n"));
        assert_eq!(tail("short", LAST_LOG_MAX), "short");
        // Never cut inside a character.
        let wide = "é".repeat(3000);
        assert!(tail(&wide, 4095).is_char_boundary(5));
    }

    #[test]
    fn events_are_ordered_deduplicated_and_bounded() {
        let mut evs: Vec<(String, String, String)> = (0..30)
            .map(|i| {
                (
                    format!("t{i:02}"),
                    "BackOff".to_string(),
                    format!("try {i}"),
                )
            })
            .collect();
        evs.push(("t99".into(), "Failed".into(), "x".repeat(2000)));
        evs.push(("t98".into(), "Failed".into(), "x".repeat(2000)));
        let lines = event_lines(evs);
        assert_eq!(lines.len(), EVENTS_MAX);
        assert!(lines.last().unwrap().starts_with("Failed: xxx"));
        assert!(lines.last().unwrap().len() <= EVENT_MAX + 5);
        assert!(lines[0].starts_with("BackOff: try 21"), "{lines:?}");
    }
}

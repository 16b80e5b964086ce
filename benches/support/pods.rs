//! Milestones of a benchmark's pods, from a watch in the benchmark process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

/// From a watch of the side's pods: when all `n` existed, when all were Running, when the
/// first was being deleted and when the last was gone.
#[derive(Default)]
pub struct PodMarks {
    running: HashMap<String, bool>,
    pub created: Option<Instant>,
    pub all_running: Option<Instant>,
    pub deleting: Option<Instant>,
    pub gone: Option<Instant>,
}

pub fn watch_pods(
    admin: &Client,
    ns: &str,
    n: usize,
    stop: CancellationToken,
) -> Arc<Mutex<PodMarks>> {
    let marks = Arc::<Mutex<PodMarks>>::default();
    let (m, api) = (marks.clone(), Api::<Pod>::namespaced(admin.clone(), ns));
    tokio::spawn(async move {
        let mut w = watcher(api, Default::default()).default_backoff().boxed();
        loop {
            let ev = tokio::select! { _ = stop.cancelled() => return, e = w.next() => e };
            let (Some(ev), Ok(mut m)) = (ev, m.lock()) else {
                return;
            };
            let now = Some(Instant::now());
            match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                    if p.metadata.deletion_timestamp.is_some() && m.deleting.is_none() {
                        m.deleting = now;
                    }
                    m.running.insert(p.name_any(), phase == Some("Running"));
                }
                Ok(watcher::Event::Delete(p)) => drop(m.running.remove(&p.name_any())),
                _ => {}
            }
            if m.created.is_none() && m.running.len() >= n {
                m.created = now;
            }
            if m.all_running.is_none() && m.running.values().filter(|r| **r).count() >= n {
                m.all_running = now;
            }
            if m.all_running.is_some() && m.gone.is_none() && m.running.is_empty() {
                m.gone = now;
            }
        }
    });
    marks
}

//! The page's live feed: server-sent events fed by the roster's change stream.
//!
//! Each connection gets a `snapshot` first (so a reconnect resumes from the truth), then an
//! `update` per batch of the shared producer (feed.rs) that concerns its page. A client too
//! slow for the producer lags on its own receiver (it never holds up others) and gets a fresh
//! snapshot. Connections are bounded (slots.rs); a stream ends when its session does.

use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;
use tokio::sync::broadcast::{self, error::RecvError};

use super::Ui;
use super::feed::Batch;
use super::slots::Slot;
use super::view::{self, EnvView, TaskView};
use crate::roster::EnvKey;

/// How soon a browser reconnects after losing the stream.
const RECONNECT: Duration = Duration::from_secs(1);
/// How often the stream re-checks the session and the leader flag (not roster data).
const CHECK_EVERY: Duration = Duration::from_secs(2);

#[derive(Serialize, Default)]
struct Message {
    leader: bool,
    /// Environments (whole list in a snapshot; changed ones in an update).
    envs: Vec<Arc<EnvView>>,
    /// Keys of environments gone.
    envs_gone: Vec<String>,
    /// Tasks of the watched environment (all in a snapshot; changed ones in an update).
    tasks: Vec<Arc<TaskView>>,
    tasks_gone: Vec<String>,
}

struct Feed {
    ui: Arc<Ui>,
    session: String,
    /// The environment page's environment id (None: the list, without tasks), and its key
    /// once the roster holds it (a page opened right after a create may come first).
    page: Option<(String, Option<EnvKey>)>,
    rx: broadcast::Receiver<Arc<Batch>>,
    snapshot_due: bool,
    leader: bool,
    done: bool,
    /// Session and leader checks, on their own clock (not reset by roster changes).
    check: tokio::time::Interval,
    _slot: Slot,
}

impl Feed {
    fn snapshot(&mut self) -> SseEvent {
        let r = &self.ui.bridge.roster;
        let mut m = Message {
            leader: self.leader,
            ..Default::default()
        };
        match &mut self.page {
            Some((id, key)) => {
                if key.is_none() {
                    *key = self.ui.bridge.resolve(id).ok().map(|e| e.key.clone());
                }
                match key.as_ref().and_then(|k| r.env(k)) {
                    Some(e) => m.envs.push(Arc::new(view::env(r, &e))),
                    None => m.envs_gone.push(id.clone()),
                }
                if let Some(k) = key {
                    m.tasks = r
                        .tasks_of(k)
                        .iter()
                        .map(|t| Arc::new(view::task(t)))
                        .collect();
                }
            }
            None => m.envs = r.envs().iter().map(|e| Arc::new(view::env(r, e))).collect(),
        }
        // After a lost connection the browser comes back within a second.
        json_event("snapshot", &m).retry(RECONNECT)
    }

    /// The page's environment key (None: the list page, or not in the roster yet).
    fn key(&self) -> Option<&EnvKey> {
        self.page.as_ref().and_then(|(_, k)| k.as_ref())
    }

    /// What of `batch` this page shows (None when nothing concerns it).
    fn update(&mut self, batch: &Batch) -> Option<SseEvent> {
        if batch.reset {
            return Some(self.snapshot());
        }
        // A page waiting for its environment: a snapshot once the roster has it.
        if let Some((id, None)) = &self.page {
            return batch.arrived.contains(id).then(|| self.snapshot());
        }
        let mut m = Message {
            leader: self.leader,
            ..Default::default()
        };
        let mut env = |k: &EnvKey, v: &Option<Arc<EnvView>>| match v {
            Some(v) => m.envs.push(v.clone()),
            None => m.envs_gone.push(k.to_string()),
        };
        match self.key() {
            None => batch.envs.iter().for_each(|(k, v)| env(k, v)),
            Some(k) => {
                if let Some(v) = batch.envs.get(k) {
                    env(k, v);
                }
                for (name, t) in batch.tasks.get(k).into_iter().flatten() {
                    match t {
                        Some(t) => m.tasks.push(t.clone()),
                        None => m.tasks_gone.push(name.clone()),
                    }
                }
            }
        }
        let nothing = m.envs.is_empty()
            && m.envs_gone.is_empty()
            && m.tasks.is_empty()
            && m.tasks_gone.is_empty();
        (!nothing).then(|| json_event("update", &m))
    }

    async fn next(&mut self) -> Option<SseEvent> {
        if self.done {
            return None;
        }
        if self.snapshot_due {
            self.snapshot_due = false;
            return Some(self.snapshot());
        }
        loop {
            let batch = tokio::select! {
                b = self.rx.recv() => b,
                _ = self.check.tick() => {
                    if self.ui.sessions.caller(&self.session).is_none() {
                        self.done = true;
                        return Some(SseEvent::default().event("expired").data("session ended"));
                    }
                    let leader = self.ui.bridge.is_leader();
                    if leader != self.leader {
                        self.leader = leader;
                        return Some(self.snapshot());
                    }
                    continue;
                }
            };
            match batch {
                Ok(b) => {
                    if let Some(ev) = self.update(&b) {
                        return Some(ev);
                    }
                }
                Err(RecvError::Lagged(_)) => return Some(self.snapshot()),
                Err(RecvError::Closed) => return None,
            }
        }
    }
}

fn json_event(kind: &str, m: &Message) -> SseEvent {
    SseEvent::default()
        .event(kind)
        .data(serde_json::to_string(m).unwrap_or_else(|_| "{}".into()))
}

/// The stream of one page (`env`: one environment's, with its tasks).
pub fn stream(
    ui: Arc<Ui>,
    session: String,
    env: Option<String>,
    slot: Slot,
) -> Sse<impl Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
    let feed = Feed {
        rx: ui.feed.subscribe(),
        leader: ui.bridge.is_leader(),
        ui,
        session,
        page: env.map(|id| (id, None)),
        snapshot_due: true,
        done: false,
        check: tokio::time::interval_at(tokio::time::Instant::now() + CHECK_EVERY, CHECK_EVERY),
        _slot: slot,
    };
    let s = futures::stream::unfold(
        feed,
        |mut f| async move { f.next().await.map(|ev| (Ok(ev), f)) },
    );
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

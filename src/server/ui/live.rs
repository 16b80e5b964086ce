//! The page's live feed: server-sent events fed by the roster's change stream.
//!
//! Each connection gets a `snapshot` first (so a reconnect resumes from the truth), then
//! `update`s that batch the changes of up to [`BATCH_WINDOW`]. A client too slow for the
//! roster's broadcast lags on its own receiver (it never holds up others) and gets a fresh
//! snapshot. Connections are bounded (slots.rs); a stream ends when its session does.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;
use tokio::sync::broadcast::{self, error::RecvError};

use super::Ui;
use super::slots::Slot;
use super::view::{self, EnvView, TaskView};
use crate::roster::{Change, EnvKey};

/// Changes that arrive this close together go out as one update.
const BATCH_WINDOW: Duration = Duration::from_millis(60);
/// At most this many changes per update.
const BATCH_MAX: usize = 4096;
/// How soon a browser reconnects after losing the stream.
const RECONNECT: Duration = Duration::from_secs(1);
/// How often the stream re-checks the session and the leader flag (not roster data).
const CHECK_EVERY: Duration = Duration::from_secs(2);

#[derive(Serialize, Default)]
struct Message {
    leader: bool,
    /// Environments (whole list in a snapshot; changed ones in an update).
    envs: Vec<EnvView>,
    /// Keys of environments gone.
    envs_gone: Vec<String>,
    /// Tasks of the watched environment (all in a snapshot; changed ones in an update).
    tasks: Vec<TaskView>,
    tasks_gone: Vec<String>,
}

struct Feed {
    ui: Arc<Ui>,
    session: String,
    /// The environment page's environment id (None: the list, without tasks), and its key
    /// once the roster holds it (a page opened right after a create may come first).
    page: Option<(String, Option<EnvKey>)>,
    rx: broadcast::Receiver<Change>,
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
                    Some(e) => m.envs.push(view::env(r, &e)),
                    None => m.envs_gone.push(id.clone()),
                }
                if let Some(k) = key {
                    m.tasks = r.tasks_of(k).iter().map(|t| view::task(t)).collect();
                }
            }
            None => m.envs = r.envs().iter().map(|e| view::env(r, e)).collect(),
        }
        // After a lost connection the browser comes back within a second.
        json_event("snapshot", &m).retry(RECONNECT)
    }

    /// The page's environment key (None: the list page, or not in the roster yet).
    fn key(&self) -> Option<&EnvKey> {
        self.page.as_ref().and_then(|(_, k)| k.as_ref())
    }

    /// Folds a batch of changes into one update (None when none concerns this page).
    fn update(&mut self, batch: Vec<Change>) -> Option<SseEvent> {
        // A page waiting for its environment: a snapshot once the roster has it.
        if let Some((id, None)) = &self.page {
            let arrived = batch.iter().any(|c| match c {
                Change::EnvApplied(e) => &*e.id == id || &*e.key.name == id,
                Change::Reset(_) => true,
                _ => false,
            });
            return arrived.then(|| self.snapshot());
        }
        let r = &self.ui.bridge.roster;
        let mut touched: BTreeSet<EnvKey> = BTreeSet::new();
        let mut m = Message {
            leader: self.leader,
            ..Default::default()
        };
        let list = self.page.is_none();
        let mine = |k: &EnvKey| list || self.key() == Some(k);
        let mut tasks: std::collections::BTreeMap<String, Option<TaskView>> = Default::default();
        for c in batch {
            match c {
                Change::EnvApplied(e) if mine(&e.key) => {
                    touched.insert(e.key.clone());
                }
                Change::EnvDeleted(k) if mine(&k) => {
                    touched.insert(k);
                }
                Change::TaskApplied(t) if mine(&t.env) => {
                    touched.insert(t.env.clone());
                    if !list {
                        tasks.insert(t.name.to_string(), Some(view::task(&t)));
                    }
                }
                Change::TaskDeleted { env, name } if mine(&env) => {
                    touched.insert(env);
                    if !list {
                        tasks.insert(name.to_string(), None);
                    }
                }
                // A relist: the whole view again.
                Change::Reset(_) => return Some(self.snapshot()),
                _ => {}
            }
        }
        if touched.is_empty() {
            return None;
        }
        for k in touched {
            match r.env(&k) {
                Some(e) => m.envs.push(view::env(r, &e)),
                None => m.envs_gone.push(k.to_string()),
            }
        }
        for (name, t) in tasks {
            match t {
                Some(t) => m.tasks.push(t),
                None => m.tasks_gone.push(name),
            }
        }
        Some(json_event("update", &m))
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
            let first = tokio::select! {
                c = self.rx.recv() => c,
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
            let mut batch = match first {
                Ok(c) => vec![c],
                Err(RecvError::Lagged(_)) => return Some(self.snapshot()),
                Err(RecvError::Closed) => return None,
            };
            let until = tokio::time::Instant::now() + BATCH_WINDOW;
            while batch.len() < BATCH_MAX {
                match tokio::time::timeout_at(until, self.rx.recv()).await {
                    Ok(Ok(c)) => batch.push(c),
                    Ok(Err(RecvError::Lagged(_))) => return Some(self.snapshot()),
                    Ok(Err(RecvError::Closed)) | Err(_) => break,
                }
            }
            if let Some(ev) = self.update(batch) {
                return Some(ev);
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
        rx: ui.bridge.roster.subscribe(),
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

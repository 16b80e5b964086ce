//! The one producer of the dashboard's live changes. It follows the roster's change stream,
//! gathers the changes of up to [`BATCH_WINDOW`] into one [`Batch`], and builds each changed
//! environment's and task's view ONCE for every open page; each page's stream (live.rs) then
//! only picks what it shows. Nobody watching: nothing is built.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};

use super::view::{self, EnvView, TaskView};
use crate::roster::{Change, EnvKey, Roster};

/// Changes that arrive this close together go out as one batch.
pub const BATCH_WINDOW: Duration = Duration::from_millis(60);
/// At most this many changes per batch.
const BATCH_MAX: usize = 4096;
/// Batches a page's stream may fall behind before it is given a fresh snapshot instead
/// (about 4 s of changes at full rate; the views are shared, so this is not per page).
pub const DEPTH: usize = 64;

/// What changed in one window, with the views already built.
#[derive(Default)]
pub struct Batch {
    /// A relist, or the producer fell behind the roster: every page re-reads its whole view.
    pub reset: bool,
    /// Environments changed (their view) or gone (None).
    pub envs: BTreeMap<EnvKey, Option<Arc<EnvView>>>,
    /// Tasks changed (their row) or gone (None), by environment, then name.
    pub tasks: BTreeMap<EnvKey, BTreeMap<String, Option<Arc<TaskView>>>>,
    /// Ids and names of the environments written in this window (a page opened before its
    /// environment reached the roster waits for one of them).
    pub arrived: BTreeSet<String>,
}

/// Starts the producer; pages subscribe to the sender. It ends with the roster.
pub fn start(roster: &Arc<Roster>) -> broadcast::Sender<Arc<Batch>> {
    let (tx, _) = broadcast::channel(DEPTH);
    let changes = roster.subscribe();
    tokio::spawn(produce(Arc::downgrade(roster), changes, tx.clone()));
    tx
}

async fn produce(
    roster: Weak<Roster>,
    mut changes: broadcast::Receiver<Change>,
    tx: broadcast::Sender<Arc<Batch>>,
) {
    loop {
        let (batch, reset) = match changes.recv().await {
            Ok(c) => gather(c, &mut changes).await,
            Err(RecvError::Lagged(_)) => (Vec::new(), true),
            Err(RecvError::Closed) => return,
        };
        if tx.receiver_count() == 0 {
            continue;
        }
        let Some(roster) = roster.upgrade() else {
            return;
        };
        let _ = tx.send(Arc::new(build(&roster, batch, reset)));
    }
}

/// `first` and what follows it within the window; whether the roster's stream was lost
/// meanwhile (a reset).
async fn gather(first: Change, changes: &mut broadcast::Receiver<Change>) -> (Vec<Change>, bool) {
    let mut batch = vec![first];
    let until = tokio::time::Instant::now() + BATCH_WINDOW;
    while batch.len() < BATCH_MAX {
        match tokio::time::timeout_at(until, changes.recv()).await {
            Ok(Ok(c)) => batch.push(c),
            Ok(Err(RecvError::Lagged(_))) => return (batch, true),
            Ok(Err(RecvError::Closed)) | Err(_) => break,
        }
    }
    (batch, false)
}

/// The views of what `changes` touched, as the roster holds them now.
pub fn build(r: &Roster, changes: Vec<Change>, reset: bool) -> Batch {
    let mut b = Batch {
        reset,
        ..Batch::default()
    };
    if reset {
        return b;
    }
    let mut touched: BTreeSet<EnvKey> = BTreeSet::new();
    for c in changes {
        match c {
            Change::EnvApplied(e) => {
                b.arrived.insert(e.id.to_string());
                b.arrived.insert(e.key.name.to_string());
                touched.insert(e.key.clone());
            }
            Change::EnvDeleted(k) => {
                touched.insert(k);
            }
            Change::TaskApplied(t) => {
                touched.insert(t.env.clone());
                b.tasks
                    .entry(t.env.clone())
                    .or_default()
                    .insert(t.name.to_string(), Some(Arc::new(view::task(&t))));
            }
            Change::TaskDeleted { env, name } => {
                b.tasks
                    .entry(env.clone())
                    .or_default()
                    .insert(name.to_string(), None);
                touched.insert(env);
            }
            Change::Reset(_) => {
                return Batch {
                    reset: true,
                    ..Batch::default()
                };
            }
        }
    }
    // An environment's view counts its tasks: built once here, not once per page.
    for k in touched {
        let v = r.env(&k).map(|e| Arc::new(view::env(r, &e)));
        b.envs.insert(k, v);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(key: &EnvKey, id: &str) -> crate::roster::EnvRecord {
        crate::roster::EnvRecord {
            id: id.into(),
            workflow: "w".into(),
            tasks: 1,
            ..crate::roster::EnvRecord::bare(key.clone())
        }
    }

    async fn next(page: &mut broadcast::Receiver<Arc<Batch>>) -> Arc<Batch> {
        tokio::time::timeout(Duration::from_secs(5), page.recv())
            .await
            .expect("a batch within 5 s")
            .expect("open")
    }

    #[tokio::test]
    async fn a_batch_carries_the_views_every_page_shares() {
        let r = Arc::new(Roster::new());
        let tx = start(&r);
        let (mut one, mut two) = (tx.subscribe(), tx.subscribe());
        let key = EnvKey::new("ns", "e");
        r.apply_env(env(&key, "e-id"));
        let (a, b) = (next(&mut one).await, next(&mut two).await);
        assert!(Arc::ptr_eq(&a, &b), "one batch for both pages");
        assert!(!a.reset);
        assert!(a.arrived.contains("e-id") && a.arrived.contains("e"));
        assert_eq!(a.envs[&key].as_ref().expect("its view").id, "e-id");
        // The roster forgets it: the batch says so.
        r.delete_env(&key);
        assert!(next(&mut one).await.envs[&key].is_none(), "gone");
    }

    #[test]
    fn a_relist_is_a_reset_for_every_page() {
        let r = Roster::new();
        let b = build(
            &r,
            vec![
                Change::EnvDeleted(EnvKey::new("ns", "x")),
                Change::Reset(crate::roster::Kind::Tasks),
            ],
            false,
        );
        assert!(b.reset && b.envs.is_empty());
    }
}

//! The in-memory roster: every environment and task the daemon knows, fed by the watches.
//!
//! Plain data (no Kubernetes types), in the manner of kubert's index: `apply`, `delete` and
//! `reset` per kind. `reset` replaces a kind's whole view at once (what was not re-listed is
//! gone). Every change is broadcast (WatchEvents) and bumps a version that waiters re-check
//! on (see [`wait`]).

mod intern;
mod record;
pub mod wait;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::SystemTime;

use dashmap::DashMap;
use tokio::sync::{broadcast, watch};

pub use intern::{Interner, Str};
pub use record::{EnvKey, EnvRecord, Failure, Observed, Phase, TaskRecord};
pub use wait::{Outcome, Progress};

use crate::state::State;

/// One change of the roster, as WatchEvents streams it.
#[derive(Clone, Debug)]
pub enum Change {
    EnvApplied(Arc<EnvRecord>),
    EnvDeleted(EnvKey),
    TaskApplied(Arc<TaskRecord>),
    TaskDeleted {
        env: EnvKey,
        name: Str,
    },
    /// A relist replaced the view of one kind; readers should re-read it.
    Reset(Kind),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Environments,
    Tasks,
}

/// Counts for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sizes {
    pub environments: usize,
    pub tasks: usize,
}

pub struct Roster {
    envs: DashMap<EnvKey, Arc<EnvRecord>>,
    /// Tasks grouped by their environment (tasks may arrive before their environment).
    tasks: DashMap<EnvKey, HashMap<Str, Arc<TaskRecord>>>,
    task_count: AtomicU64,
    interner: Interner,
    /// Taken for writing only by `reset`, so that a reader never sees half a relist.
    gate: RwLock<()>,
    changes: broadcast::Sender<Change>,
    version: watch::Sender<u64>,
}

impl Default for Roster {
    fn default() -> Self {
        Self::new()
    }
}

impl Roster {
    pub fn new() -> Self {
        let (changes, _) = broadcast::channel(8192);
        Roster {
            envs: DashMap::new(),
            tasks: DashMap::new(),
            task_count: AtomicU64::new(0),
            interner: Interner::default(),
            gate: RwLock::new(()),
            changes,
            version: watch::Sender::new(0),
        }
    }

    /// Shared strings for building records (node, class, namespace, phases, ids).
    pub fn intern(&self, s: &str) -> Str {
        self.interner.get(s)
    }

    pub fn interner(&self) -> &Interner {
        &self.interner
    }

    fn read(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, change: Change) {
        // No receivers is fine: nobody watches.
        let _ = self.changes.send(change);
        self.version.send_modify(|v| *v += 1);
    }

    /// Changes from now on (WatchEvents). A receiver that lags gets `Lagged` and should re-read.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// A counter bumped on every change: waiters re-evaluate when it moves.
    pub fn version(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    // ---- environments ----

    /// Insert or update one environment. Returns false when nothing changed.
    pub fn apply_env(&self, mut rec: EnvRecord) -> bool {
        let _g = self.read();
        if let Some(old) = self.envs.get(&rec.key)
            && old.same_content(&rec)
        {
            return false;
        }
        rec.changed_at = SystemTime::now();
        let rec = Arc::new(rec);
        self.envs.insert(rec.key.clone(), rec.clone());
        drop(_g);
        self.publish(Change::EnvApplied(rec));
        true
    }

    pub fn delete_env(&self, key: &EnvKey) -> bool {
        let _g = self.read();
        let removed = self.envs.remove(key).is_some();
        drop(_g);
        if removed {
            self.publish(Change::EnvDeleted(key.clone()));
        }
        removed
    }

    /// Replace every environment with `recs` (a relist): what is not in `recs` is gone.
    pub fn reset_envs(&self, recs: Vec<EnvRecord>) {
        let g = self.write();
        let mut next: HashMap<EnvKey, EnvRecord> =
            recs.into_iter().map(|r| (r.key.clone(), r)).collect();
        self.envs.retain(|k, old| match next.remove(k) {
            Some(mut new) => {
                if !old.same_content(&new) {
                    new.changed_at = SystemTime::now();
                    *old = Arc::new(new);
                }
                true
            }
            None => false,
        });
        let now = SystemTime::now();
        for (k, mut r) in next {
            r.changed_at = now;
            self.envs.insert(k, Arc::new(r));
        }
        drop(g);
        self.publish(Change::Reset(Kind::Environments));
    }

    pub fn env(&self, key: &EnvKey) -> Option<Arc<EnvRecord>> {
        let _g = self.read();
        self.envs.get(key).map(|r| r.clone())
    }

    /// Environments whose spec.id or name is `id_or_name` (any namespace).
    pub fn find_env(&self, id_or_name: &str) -> Vec<Arc<EnvRecord>> {
        let _g = self.read();
        let mut found: Vec<_> = self
            .envs
            .iter()
            .filter(|e| &*e.id == id_or_name || &*e.key.name == id_or_name)
            .map(|e| e.clone())
            .collect();
        found.sort_by(|a, b| a.key.cmp(&b.key));
        found
    }

    /// All environments, sorted by namespace and name.
    pub fn envs(&self) -> Vec<Arc<EnvRecord>> {
        let _g = self.read();
        let mut all: Vec<_> = self.envs.iter().map(|e| e.clone()).collect();
        all.sort_by(|a, b| a.key.cmp(&b.key));
        all
    }

    // ---- tasks ----

    /// Insert or update one task. Returns false when nothing changed.
    pub fn apply_task(&self, mut rec: TaskRecord) -> bool {
        let g = self.read();
        let mut group = self.tasks.entry(rec.env.clone()).or_default();
        if let Some(old) = group.get(&rec.name)
            && old.same_content(&rec)
        {
            return false;
        }
        rec.changed_at = SystemTime::now();
        let rec = Arc::new(rec);
        if group.insert(rec.name.clone(), rec.clone()).is_none() {
            self.task_count.fetch_add(1, Ordering::Relaxed);
        }
        drop(group);
        drop(g);
        self.publish(Change::TaskApplied(rec));
        true
    }

    pub fn delete_task(&self, env: &EnvKey, name: &str) -> bool {
        let g = self.read();
        let mut removed = false;
        let mut empty = false;
        if let Some(mut group) = self.tasks.get_mut(env) {
            removed = group.remove(name).is_some();
            empty = group.is_empty();
        }
        if empty {
            self.tasks.remove_if(env, |_, g| g.is_empty());
        }
        drop(g);
        if removed {
            self.task_count.fetch_sub(1, Ordering::Relaxed);
            self.publish(Change::TaskDeleted {
                env: env.clone(),
                name: self.intern(name),
            });
        }
        removed
    }

    /// Replace every task with `recs` (a relist): what is not in `recs` is gone.
    pub fn reset_tasks(&self, recs: Vec<TaskRecord>) {
        let g = self.write();
        let mut next: HashMap<EnvKey, HashMap<Str, TaskRecord>> = HashMap::new();
        for r in recs {
            next.entry(r.env.clone())
                .or_default()
                .insert(r.name.clone(), r);
        }
        let now = SystemTime::now();
        let mut count = 0u64;
        self.tasks.retain(|env, group| {
            let Some(mut fresh) = next.remove(env) else {
                return false;
            };
            group.retain(|name, old| match fresh.remove(name) {
                Some(mut new) => {
                    if !old.same_content(&new) {
                        new.changed_at = now;
                        *old = Arc::new(new);
                    }
                    true
                }
                None => false,
            });
            for (name, mut r) in fresh {
                r.changed_at = now;
                group.insert(name, Arc::new(r));
            }
            count += group.len() as u64;
            !group.is_empty()
        });
        for (env, group) in next {
            count += group.len() as u64;
            let group = group
                .into_iter()
                .map(|(n, mut r)| {
                    r.changed_at = now;
                    (n, Arc::new(r))
                })
                .collect();
            self.tasks.insert(env, group);
        }
        self.task_count.store(count, Ordering::Relaxed);
        drop(g);
        self.interner.prune();
        self.publish(Change::Reset(Kind::Tasks));
    }

    /// The tasks of one environment, sorted by name.
    pub fn tasks_of(&self, env: &EnvKey) -> Vec<Arc<TaskRecord>> {
        let _g = self.read();
        let mut v: Vec<_> = self
            .tasks
            .get(env)
            .map(|g| g.values().cloned().collect())
            .unwrap_or_default();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn task(&self, env: &EnvKey, name: &str) -> Option<Arc<TaskRecord>> {
        let _g = self.read();
        self.tasks.get(env).and_then(|g| g.get(name).cloned())
    }

    /// Runs `f` over the tasks of `env` without copying them.
    pub fn with_tasks<R>(
        &self,
        env: &EnvKey,
        f: impl FnOnce(&mut dyn Iterator<Item = &TaskRecord>) -> R,
    ) -> R {
        let _g = self.read();
        match self.tasks.get(env) {
            Some(group) => f(&mut group.values().map(|a| &**a)),
            None => f(&mut std::iter::empty()),
        }
    }

    /// Ports in use per node by every task in the roster, except those of `except`.
    pub fn ports_in_use(&self, except: Option<&EnvKey>) -> BTreeMap<String, BTreeSet<u16>> {
        let _g = self.read();
        let mut used: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
        for group in self.tasks.iter() {
            if Some(group.key()) == except {
                continue;
            }
            for t in group.values() {
                used.entry(t.node.to_string())
                    .or_default()
                    .extend(t.ports.iter().copied());
            }
        }
        used
    }

    pub fn sizes(&self) -> Sizes {
        Sizes {
            environments: self.envs.len(),
            tasks: self.task_count.load(Ordering::Relaxed) as usize,
        }
    }

    /// Tasks of `env` per state.
    pub fn counts(&self, env: &EnvKey) -> BTreeMap<State, u32> {
        self.with_tasks(env, |it| {
            let mut m = BTreeMap::new();
            for t in it {
                *m.entry(t.state).or_insert(0) += 1;
            }
            m
        })
    }

    /// Approximate heap bytes of the task side (records, maps, interned strings).
    pub fn task_heap_bytes(&self) -> usize {
        let _g = self.read();
        let slot = std::mem::size_of::<(Str, Arc<TaskRecord>)>() + 1;
        let mut total = self.interner.heap_bytes();
        for group in self.tasks.iter() {
            total += group.capacity() * slot
                + std::mem::size_of::<(EnvKey, HashMap<Str, Arc<TaskRecord>>)>();
            total += group.values().map(|t| t.own_heap_bytes()).sum::<usize>();
        }
        total
    }
}

#[cfg(test)]
mod tests;

//! Tasks by environment: fed by the one Task watch (apply, delete, and a relist that replaces
//! everything), so that an Environment's reconcile reads its own tasks instead of scanning
//! every Task in the store. Plain data behind one lock; unit-tested by feeding it events.

use std::sync::RwLock;

use kube::ResourceExt;
use kube::runtime::watcher;

use super::watch_index::{Groups, Index, Relisting};
use crate::crd::Task;

/// (namespace, Environment name).
type EnvOf = (String, String);

#[derive(Default)]
pub struct TaskIndex {
    inner: RwLock<Relisting<Inner>>,
}

#[derive(Default)]
struct Inner {
    /// (namespace, task) by (namespace, environment).
    by_env: Groups<EnvOf, (String, String)>,
}

impl Index for Inner {
    type Object = Task;
    /// (namespace, task, environment).
    type Entry = (String, String, String);

    fn entry(t: &Task) -> Self::Entry {
        (
            t.namespace().unwrap_or_default(),
            t.name_any(),
            t.spec.environment.clone(),
        )
    }

    fn apply(&mut self, (ns, name, env): Self::Entry) {
        self.by_env.set((ns.clone(), name), Some((ns, env)));
    }

    fn delete(&mut self, t: &Task) {
        let task = (t.namespace().unwrap_or_default(), t.name_any());
        self.by_env.remove(&task);
    }

    fn clear(&mut self) {
        self.by_env.clear();
    }
}

impl TaskIndex {
    /// Takes one event of the Task watch.
    pub fn observe(&self, ev: &watcher::Event<Task>) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.observe(ev);
    }

    /// The names of the tasks of `env` in `namespace`, sorted.
    pub fn names(&self, namespace: &str, env: &str) -> Vec<String> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner
            .index
            .by_env
            .members(&(namespace.to_string(), env.to_string()))
            .map(|(_, name)| name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::TaskSpec;

    fn task(ns: &str, name: &str, env: &str) -> Task {
        let mut t = Task::new(
            name,
            TaskSpec {
                environment: env.into(),
                task: Default::default(),
                transition: None,
            },
        );
        t.metadata.namespace = Some(ns.into());
        t
    }

    #[test]
    fn apply_delete_and_relist() {
        let ix = TaskIndex::default();
        ix.observe(&watcher::Event::Apply(task("a", "t1", "e1")));
        ix.observe(&watcher::Event::Apply(task("a", "t2", "e1")));
        ix.observe(&watcher::Event::Apply(task("b", "t1", "e1")));
        assert_eq!(ix.names("a", "e1"), ["t1", "t2"]);
        assert_eq!(ix.names("b", "e1"), ["t1"]);
        // Moved to another environment (a spec change): counted once, under the new one.
        ix.observe(&watcher::Event::Apply(task("a", "t2", "e2")));
        assert_eq!(ix.names("a", "e1"), ["t1"]);
        assert_eq!(ix.names("a", "e2"), ["t2"]);
        ix.observe(&watcher::Event::Delete(task("a", "t1", "e1")));
        assert!(ix.names("a", "e1").is_empty());
        // A relist replaces everything at its end; until then the old view stands.
        ix.observe(&watcher::Event::Init);
        ix.observe(&watcher::Event::InitApply(task("c", "t9", "e9")));
        assert_eq!(ix.names("a", "e2"), ["t2"]);
        assert!(ix.names("c", "e9").is_empty());
        ix.observe(&watcher::Event::InitDone);
        assert!(ix.names("a", "e2").is_empty());
        assert!(ix.names("b", "e1").is_empty());
        assert_eq!(ix.names("c", "e9"), ["t9"]);
    }
}

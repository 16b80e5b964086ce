//! What an Environment reconcile pays to read its own Tasks from the operator's stores
//! (`Ctx::tasks_of`): the task index's keys looked up in the watch store, against the way
//! before (ed4204e), which copied each name out of the index and built a key per task from
//! it. Both over the same store and index, in the same run. Printed figures, no cluster.
//!
//! Run: `cargo bench --bench task_reads`. BENCH_TASKS sets the environment's tasks (default
//! 10,000; 10 to 1,000,000); a second environment of a tenth of that shares the store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envbridge::crd::{Task, TaskSpec};
use envbridge::operator::task_index::TaskIndex;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;

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

/// The read as it was: names copied out of the index, a key built from each.
fn by_name(index: &TaskIndex, store: &Store<Task>, ns: &str, env: &str) -> Vec<Arc<Task>> {
    index
        .names(ns, env)
        .iter()
        .filter_map(|n| store.get(&ObjectRef::new(n).within(ns)))
        .collect()
}

/// The read as it is (`Ctx::tasks_of`).
fn by_key(index: &TaskIndex, store: &Store<Task>, ns: &str, env: &str) -> Vec<Arc<Task>> {
    let mut tasks = Vec::new();
    index.each(ns, env, |key| tasks.extend(store.get(key)));
    tasks
}

/// Best of `rounds` timings of `read`, per task, in ns; checks it read `want` tasks.
fn time(rounds: usize, want: usize, read: impl Fn() -> Vec<Arc<Task>>) -> f64 {
    let mut best = Duration::MAX;
    for _ in 0..rounds {
        let t0 = Instant::now();
        let got = read();
        best = best.min(t0.elapsed());
        assert_eq!(got.len(), want, "a read lost tasks");
    }
    best.as_nanos() as f64 / want as f64
}

fn main() {
    let n: usize = std::env::var("BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| (10..=1_000_000).contains(n))
        .unwrap_or(10_000);
    let (store, mut writer) = reflector::store::<Task>();
    let index = TaskIndex::default();
    for (env, count) in [("e1", n), ("e2", n / 10)] {
        for i in 0..count {
            let ev = watcher::Event::Apply(task("ns", &format!("{env}-readout-flp{i:05}-0"), env));
            writer.apply_watcher_event(&ev);
            index.observe(&ev);
        }
    }
    let rounds = (2_000_000 / n).clamp(5, 200);
    // Alternated, twice, so that neither gets a warmer cache or a quieter moment alone.
    let mut old = f64::MAX;
    let mut new = f64::MAX;
    for _ in 0..2 {
        old = old.min(time(rounds, n, || by_name(&index, &store, "ns", "e1")));
        new = new.min(time(rounds, n, || by_key(&index, &store, "ns", "e1")));
    }
    println!(
        "task_reads: one environment's {n} tasks read from a store of {} (best of {rounds} reads, twice each)",
        n + n / 10
    );
    println!(
        "  by name (before ed4204e): {old:.0} ns a task, {:.2} ms a read",
        old * n as f64 / 1e6
    );
    println!(
        "  by key (the index's store keys): {new:.0} ns a task, {:.2} ms a read",
        new * n as f64 / 1e6
    );
    println!(
        "{}",
        serde_json::json!({"bench": "task_reads", "tasks": n, "by_name_ns": old.round(), "by_key_ns": new.round(), "ratio": ((new / old) * 100.0).round() / 100.0})
    );
}

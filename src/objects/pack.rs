//! The packer: tasks grouped by node into TaskSets under a byte budget, each named by its
//! index and the content hash (BLAKE3) of the bytes written here, and the Environment naming
//! them.

use std::collections::BTreeMap;
use std::ops::Range;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::Objects;
use crate::crd::{Environment, EnvironmentSpec, HookRef, TaskSet, TaskSetRef, TaskSetSpec, labels};
use crate::model::TaskRef;
use crate::model::digest::{json_digest, serialize_into};
use crate::plan::Plan;
use crate::state::State;

/// The tasks of a list of TaskSets in order, with a known length.
#[derive(Clone)]
pub(super) struct Tasks<'a> {
    sets: &'a [TaskSet],
    set: usize,
    at: usize,
    left: usize,
}

impl<'a> Tasks<'a> {
    pub(super) fn over(sets: &'a [TaskSet]) -> Self {
        Tasks {
            sets,
            set: 0,
            at: 0,
            left: sets.iter().map(|s| s.spec.tasks.len()).sum(),
        }
    }
}

impl<'a> Iterator for Tasks<'a> {
    type Item = &'a TaskRef;

    fn next(&mut self) -> Option<&'a TaskRef> {
        while let Some(s) = self.sets.get(self.set) {
            if let Some(t) = s.spec.tasks.get(self.at) {
                self.at += 1;
                self.left -= 1;
                return Some(t);
            }
            (self.set, self.at) = (self.set + 1, 0);
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Tasks<'_> {}

fn meta(name: &str, namespace: Option<&str>, env_name: &str) -> ObjectMeta {
    let mut l = BTreeMap::new();
    l.insert(labels::MANAGED_BY.to_string(), labels::MANAGER.to_string());
    l.insert(labels::ENVIRONMENT.to_string(), env_name.to_string());
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(l),
        ..ObjectMeta::default()
    }
}

/// Splits the tasks into TaskSets of at most `budget` bytes of task JSON (a node's tasks stay
/// together unless they alone exceed the budget) and builds the Environment. The tasks come
/// sorted by node (`plan::build` sorts them; any order packs, with more sets).
/// `parallel`: a second thread may serialize part of the tasks (the objects are the same).
pub fn from_plan(
    mut plan: Plan,
    namespace: Option<&str>,
    budget: usize,
    parallel: bool,
) -> Objects {
    let env_name = plan.environment_name.clone();
    let tasks = &plan.tasks;
    let runs: Vec<Range<usize>> = node_runs(tasks).collect();
    let groups = pack(tasks, &runs, budget, parallel);
    let nodes = runs.len();
    let total = tasks.len();
    // The tasks move into their sets in order (the groups are consecutive ranges).
    let mut moved = std::mem::take(&mut plan.tasks).into_iter();
    let mut task_sets = Vec::with_capacity(groups.len());
    let mut refs = Vec::with_capacity(groups.len());
    for (idx, (range, digest)) in groups.into_iter().enumerate() {
        // The content hash in the name: a changed render writes new sets, never edits old ones.
        let name = format!("{env_name}-{idx:04}-{}", &digest[..10]);
        let group: Vec<TaskRef> = moved.by_ref().take(range.len()).collect();
        refs.push(TaskSetRef {
            name: name.clone(),
            blake3: digest,
            tasks: u32::try_from(group.len()).unwrap_or(u32::MAX),
        });
        let mut ts = TaskSet::new(
            &name,
            TaskSetSpec {
                environment: env_name.clone(),
                tasks: group,
            },
        );
        ts.metadata = meta(&name, namespace, &env_name);
        task_sets.push(ts);
    }
    let hooks = plan
        .hooks
        .iter()
        .map(|h| HookRef {
            path: h.path.clone(),
            func: h.func.clone(),
            plugin: h.plugin.clone(),
            function: h.function.clone(),
            arguments: h.arguments.clone(),
            trigger: h.trigger.clone(),
            r#await: h.r#await.clone(),
            critical: h.critical,
            timeout_seconds: h.timeout_seconds,
            variables: h.variables.clone(),
            endpoint: None,
        })
        .collect();
    let spec = EnvironmentSpec {
        id: plan.environment_id.clone(),
        workflow: plan.workflow.clone(),
        nodes: u32::try_from(nodes).unwrap_or(u32::MAX),
        tasks: u32::try_from(total).unwrap_or(u32::MAX),
        task_sets: refs,
        hooks,
        desired_state: State::Standby,
        transition: None,
        description: None,
        variables: Default::default(),
        run_variables: Default::default(),
    };
    let mut environment = Environment::new(&env_name, spec);
    environment.metadata = meta(&env_name, namespace, &env_name);
    Objects {
        environment,
        task_sets,
        ports: plan.ports,
    }
}

/// The sets: each one's task range and the BLAKE3 of its JSON. `runs` are the tasks' node
/// runs ([`node_runs`]); with `parallel`, a second thread helps.
fn pack(
    tasks: &[TaskRef],
    runs: &[Range<usize>],
    budget: usize,
    parallel: bool,
) -> Vec<(Range<usize>, String)> {
    // Each task is serialized once: its size decides the packing, and its bytes go on to the
    // open set's JSON array, hashed when the set closes. The first half of the nodes goes
    // through a small reused buffer, a node at a time; meanwhile a second thread serializes
    // the other half, which the packer then reads. The packing itself stays sequential, so
    // the sets are the same whatever runs where.
    let split = match runs.iter().find(|r| r.start >= tasks.len() / 2) {
        Some(r) if parallel => r.start,
        _ => tasks.len(),
    };
    let second_half = || {
        let mut json = Vec::new();
        let mut spans = Vec::with_capacity(tasks.len() - split);
        serialize_into(&tasks[split..], &mut json, &mut spans);
        (json, spans)
    };
    std::thread::scope(|scope| {
        let mut later = (split < tasks.len()).then(|| scope.spawn(second_half));
        let mut packer = Packer::new(budget);
        let mut node_json: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut spans: Vec<Range<usize>> = Vec::new();
        let mut serialized = None;
        for run in runs {
            if run.start < split {
                node_json.clear();
                spans.clear();
                serialize_into(&tasks[run.clone()], &mut node_json, &mut spans);
                packer.node(run.start, &node_json, &spans);
                continue;
            }
            if serialized.is_none() {
                // The thread only serializes; should it ever fail, its part is done here.
                let joined = later.take().and_then(|h| h.join().ok());
                serialized = Some(joined.unwrap_or_else(second_half));
            }
            if let Some((json, spans)) = &serialized {
                packer.node(run.start, json, &spans[run.start - split..run.end - split]);
            }
        }
        packer.finish(tasks.len())
    })
}

/// The index ranges of consecutive tasks on one node.
fn node_runs(tasks: &[TaskRef]) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut at = 0;
    tasks.chunk_by(|a, b| a.node == b.node).map(move |c| {
        let run = at..at + c.len();
        at = run.end;
        run
    })
}

/// Packs serialized tasks, node by node, into sets of at most `budget` bytes: a set closes
/// before a node that does not fit, and inside a node only when the node alone exceeds the
/// budget. Each set's bytes are `[a,b,...]`, exactly what serde_json writes for its tasks.
struct Packer {
    budget: usize,
    /// Each set's task range and BLAKE3.
    groups: Vec<(Range<usize>, String)>,
    set_json: Vec<u8>,
    start: usize,
    size: usize,
}

impl Packer {
    fn new(budget: usize) -> Self {
        let mut set_json = Vec::with_capacity(budget + 64 * 1024);
        set_json.push(b'[');
        Packer {
            budget,
            groups: Vec::new(),
            set_json,
            start: 0,
            size: 0,
        }
    }

    /// The tasks of one node, the first at index `first`: their JSON is `json[span]` each.
    fn node(&mut self, first: usize, json: &[u8], spans: &[Range<usize>]) {
        let node_size: usize = spans.iter().map(|r| r.len() + 1).sum();
        if self.start < first && self.size + node_size > self.budget {
            self.close(first);
        }
        for (k, r) in (first..).zip(spans) {
            let s = r.len() + 1;
            if self.start < k && self.size + s > self.budget {
                self.close(k);
            }
            if self.start < k {
                self.set_json.push(b',');
            }
            self.set_json.extend_from_slice(&json[r.clone()]);
            self.size += s;
        }
    }

    /// Closes the open set before task `end`.
    fn close(&mut self, end: usize) {
        self.set_json.push(b']');
        self.groups
            .push((self.start..end, json_digest(&self.set_json)));
        self.set_json.clear();
        self.set_json.push(b'[');
        (self.start, self.size) = (end, 0);
    }

    fn finish(mut self, total: usize) -> Vec<(Range<usize>, String)> {
        if self.start < total {
            self.close(total);
        }
        self.groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use crate::model::digest::tasks_digest;

    /// Tasks on `nodes` nodes (node n holds n % 4 + 1 tasks), of uneven sizes.
    fn plan(nodes: usize) -> Plan {
        let mut tasks = Vec::new();
        for n in 0..nodes {
            for k in 0..(n % 4 + 1) {
                tasks.push(TaskRef {
                    name: format!("t-{n}-{k}"),
                    node: format!("node{n:03}"),
                    path: format!("w.host-{n}.t{k}"),
                    args: vec!["x".repeat(40 * ((n * 7 + k * 13) % 11)).into()],
                    ..TaskRef::default()
                });
            }
        }
        Plan {
            environment_id: "E".into(),
            environment_name: "e".into(),
            workflow: "w".into(),
            tasks,
            hooks: Vec::new(),
            ports: BTreeMap::new(),
        }
    }

    #[test]
    fn tasks_serialize_as_serde_json_writes_them() {
        // The bytes the packer hashes are what serde_json (and so the apiserver's reader)
        // would write: a TaskSet read back hashes the same.
        // Every ASCII character (controls, quote, backslash, DEL), multi-byte UTF-8, long and
        // empty strings, in every kind of field.
        let ascii: String = (0u8..128).map(char::from).collect();
        let texts = [
            ascii.clone(),
            "é ü — 中文 😀 \u{2028}\u{2029}".to_string(),
            format!("{ascii}{}", "x".repeat(300)),
            String::new(),
            "a\"b\\c/d".to_string(),
        ];
        let mut tasks = Vec::new();
        for (i, s) in texts.iter().enumerate() {
            let a: std::sync::Arc<str> = s.as_str().into();
            tasks.push(TaskRef {
                name: s.clone(),
                node: s.clone(),
                command: s.clone(),
                shell: i % 2 == 0,
                user: (i % 2 == 1).then(|| s.clone()),
                control_port: u16::MAX - i as u16,
                timeout_seconds: Some(u32::MAX - i as u32),
                env: vec![crate::model::EnvVar {
                    name: a.clone(),
                    value: a.clone(),
                }],
                args: vec![a.clone(), "".into()],
                channels: [(a.clone(), a.clone()), ("k".into(), a)].into(),
                trigger: Some(s.clone()),
                ..TaskRef::default()
            });
        }
        tasks.extend(plan(12).tasks);
        let mut json = Vec::new();
        let mut spans = Vec::new();
        serialize_into(&tasks, &mut json, &mut spans);
        for (t, r) in tasks.iter().zip(&spans) {
            assert_eq!(
                String::from_utf8_lossy(&json[r.clone()]),
                String::from_utf8_lossy(&serde_json::to_vec(t).unwrap())
            );
        }
    }

    #[test]
    fn a_second_thread_changes_no_set() {
        let p = plan(1_200);
        let runs: Vec<Range<usize>> = node_runs(&p.tasks).collect();
        assert_eq!(runs.len(), 1_200);
        for budget in [1, 700, 4000, 64 * 1024, 1 << 20] {
            let alone = pack(&p.tasks, &runs, budget, false);
            let helped = pack(&p.tasks, &runs, budget, true);
            assert_eq!(helped, alone, "budget {budget}");
            let covered: usize = alone.iter().map(|(r, _)| r.len()).sum();
            assert_eq!(covered, p.tasks.len(), "budget {budget}");
        }
    }

    #[test]
    fn sets_keep_order_respect_the_budget_keep_nodes_together_and_name_their_hash() {
        let p = plan(40);
        let sizes: BTreeMap<&str, usize> = p
            .tasks
            .iter()
            .map(|t| (t.name.as_str(), serde_json::to_vec(t).unwrap().len() + 1))
            .collect();
        let largest = sizes.values().max().copied().unwrap();
        for budget in [1, 200, 700, 1500, 4000, 1 << 20] {
            let r = from_plan(p.clone(), None, budget, false);
            let names: Vec<&str> = r.tasks().map(|t| t.name.as_str()).collect();
            let want: Vec<&str> = p.tasks.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, want, "budget {budget}: order");
            assert_eq!(r.environment.spec.task_sets.len(), r.task_sets.len());
            let mut node_sets: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
            for (i, (ts, rf)) in r
                .task_sets
                .iter()
                .zip(&r.environment.spec.task_sets)
                .enumerate()
            {
                let json = serde_json::to_vec(&ts.spec.tasks).unwrap();
                assert!(
                    json.len() <= budget + 1 || ts.spec.tasks.len() == 1,
                    "budget {budget}: set {i} holds {} bytes in {} tasks",
                    json.len(),
                    ts.spec.tasks.len()
                );
                assert_eq!(rf.blake3, tasks_digest(&ts.spec.tasks), "budget {budget}");
                assert!(rf.name.ends_with(&rf.blake3[..10]));
                assert_eq!(rf.tasks as usize, ts.spec.tasks.len());
                for t in &ts.spec.tasks {
                    node_sets.entry(&t.node).or_default().insert(i);
                }
            }
            // A node spans sets only when its tasks alone exceed the budget.
            for (node, sets) in node_sets {
                let node_size: usize = p
                    .tasks
                    .iter()
                    .filter(|t| t.node == node)
                    .map(|t| sizes[t.name.as_str()])
                    .sum();
                assert!(
                    sets.len() == 1 || node_size > budget,
                    "budget {budget}: node {node} ({node_size} bytes) split over {sets:?}"
                );
            }
            if budget >= largest * 12 {
                assert!(
                    r.task_sets.len() < p.tasks.len() / 4,
                    "budget {budget}: sets are filled"
                );
            }
        }
    }
}

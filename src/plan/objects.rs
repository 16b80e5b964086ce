//! The one adapter from the pure plan to the CRD types: TaskSets (grouped by node, each under
//! a byte budget) and the Environment naming them with their content hash (BLAKE3).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Plan, TaskRef};
use crate::crd::{
    Environment, EnvironmentSpec, HookRef, TaskSet, TaskSetRef, TaskSetSpec, labels,
    tasks_digest_of_pieces,
};
use crate::state::State;

/// The objects to apply, in order: every TaskSet, then the Environment.
#[derive(Clone, Debug)]
pub struct Rendered {
    pub environment: Environment,
    pub task_sets: Vec<TaskSet>,
    /// Ports taken per node (control and TCP), for keeping later environments disjoint.
    pub ports: BTreeMap<String, std::collections::BTreeSet<u16>>,
}

impl Rendered {
    /// Every task, sorted by node then role path (the `-o tasks` view reads this): the TaskSets
    /// hold them in that order, so this is a view over them, not a second copy.
    pub fn tasks(&self) -> impl ExactSizeIterator<Item = &TaskRef> + Clone {
        Tasks {
            sets: &self.task_sets,
            set: 0,
            at: 0,
            left: self.task_sets.iter().map(|s| s.spec.tasks.len()).sum(),
        }
    }

    /// The objects as JSON values, TaskSets first.
    pub fn to_json_values(&self) -> Vec<serde_json::Value> {
        let mut out: Vec<serde_json::Value> = self
            .task_sets
            .iter()
            .filter_map(|ts| serde_json::to_value(ts).ok())
            .collect();
        if let Ok(v) = serde_json::to_value(&self.environment) {
            out.push(v);
        }
        out
    }
}

/// The tasks of a list of TaskSets in order, with a known length.
#[derive(Clone)]
struct Tasks<'a> {
    sets: &'a [TaskSet],
    set: usize,
    at: usize,
    left: usize,
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
/// together unless they alone exceed the budget) and builds the Environment.
pub fn objects(mut plan: Plan, namespace: Option<&str>, budget: usize) -> Rendered {
    let env_name = plan.environment_name.clone();
    // Each task is serialized once: its size decides the packing, and a set's JSON array is the
    // concatenation (`[a,b,...]` is exactly what serde_json writes for the Vec), hashed as is.
    // All into one buffer: one allocation instead of one per task.
    let mut buf: Vec<u8> = Vec::with_capacity(plan.tasks.len() * 1024);
    let mut spans = Vec::with_capacity(plan.tasks.len());
    for t in &plan.tasks {
        let start = buf.len();
        if serde_json::to_writer(&mut buf, t).is_err() {
            buf.truncate(start);
        }
        spans.push(start..buf.len());
    }
    let json: Vec<&[u8]> = spans.into_iter().map(|r| &buf[r]).collect();
    let mut groups: Vec<std::ops::Range<usize>> = Vec::new();
    let (mut start, mut size) = (0usize, 0usize);
    let tasks = &plan.tasks;
    let mut i = 0;
    while i < tasks.len() {
        let node = &tasks[i].node;
        let end = tasks[i..]
            .iter()
            .position(|t| &t.node != node)
            .map_or(tasks.len(), |p| i + p);
        let node_size: usize = json[i..end].iter().map(|j| j.len() + 1).sum();
        if start < i && size + node_size > budget {
            groups.push(start..i);
            (start, size) = (i, 0);
        }
        for (k, j) in json.iter().enumerate().take(end).skip(i) {
            let s = j.len() + 1;
            if start < k && size + s > budget {
                groups.push(start..k);
                (start, size) = (k, 0);
            }
            size += s;
        }
        i = end;
    }
    if start < tasks.len() {
        groups.push(start..tasks.len());
    }
    let nodes = tasks
        .iter()
        .map(|t| t.node.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let total = tasks.len();
    // The tasks move into their sets in order (the groups are consecutive ranges).
    let mut moved = std::mem::take(&mut plan.tasks).into_iter();
    let mut task_sets = Vec::with_capacity(groups.len());
    let mut refs = Vec::with_capacity(groups.len());
    for (idx, range) in groups.into_iter().enumerate() {
        let digest = tasks_digest_of_pieces(json[range.clone()].iter().copied());
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
            trigger: h.trigger.clone(),
            r#await: h.r#await.clone(),
            critical: h.critical,
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
    };
    let mut environment = Environment::new(&env_name, spec);
    environment.metadata = meta(&env_name, namespace, &env_name);
    Rendered {
        environment,
        task_sets,
        ports: plan.ports,
    }
}

//! The objects one environment consists of, and how tasks are packed into TaskSets.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::ObjectMeta;

use crate::crd::{
    Environment, EnvironmentSpec, TaskSet, TaskSetRef, TaskSetSpec, labels, tasks_digest,
};
use crate::plan::TaskRef;
use crate::state::State;

/// TaskSets stay far below etcd's 1.5 MiB limit (a task reference is ~1-1.5 KB).
pub const TASKS_PER_SET: usize = 200;

/// What gets applied for one environment: TaskSets first, then the Environment naming them.
#[derive(Clone, Debug)]
pub struct Objects {
    pub environment: Environment,
    pub task_sets: Vec<TaskSet>,
}

impl Objects {
    pub fn name(&self) -> String {
        self.environment.metadata.name.clone().unwrap_or_default()
    }

    pub fn tasks(&self) -> impl Iterator<Item = &TaskRef> {
        self.task_sets.iter().flat_map(|s| s.spec.tasks.iter())
    }

    /// Ports each node's tasks would occupy.
    pub fn ports_by_node(&self) -> BTreeMap<String, BTreeSet<u16>> {
        let mut m: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
        for t in self.tasks() {
            m.entry(t.node.clone())
                .or_default()
                .extend(super::convert::task_ports(t));
        }
        m
    }

    /// Sets the namespace and the labels envbridge filters on, on every object.
    pub fn place(&mut self, namespace: &str) {
        let env = self.name();
        let stamp = |meta: &mut ObjectMeta| {
            meta.namespace = Some(namespace.to_string());
            let l = meta.labels.get_or_insert_with(BTreeMap::new);
            l.insert(labels::MANAGED_BY.into(), labels::MANAGER.into());
            l.insert(labels::ENVIRONMENT.into(), env.clone());
        };
        stamp(&mut self.environment.metadata);
        for s in &mut self.task_sets {
            stamp(&mut s.metadata);
        }
    }
}

/// Packs task references into TaskSets (named by content hash) and the Environment naming them.
pub fn pack(env_name: &str, env_id: &str, workflow: &str, tasks: Vec<TaskRef>) -> Objects {
    let nodes: BTreeSet<&str> = tasks.iter().map(|t| t.node.as_str()).collect();
    let nodes = nodes.len() as u32;
    let total = tasks.len() as u32;
    let task_sets: Vec<TaskSet> = tasks
        .chunks(TASKS_PER_SET)
        .map(|chunk| task_set(env_name, chunk.to_vec()))
        .collect();
    let environment = environment(env_name, env_id, workflow, nodes, total, &task_sets);
    Objects {
        environment,
        task_sets,
    }
}

pub fn task_set(env_name: &str, tasks: Vec<TaskRef>) -> TaskSet {
    let sha = tasks_digest(&tasks);
    let mut ts = TaskSet::new(
        &format!("{env_name}-{}", &sha[..10]),
        TaskSetSpec {
            environment: env_name.into(),
            tasks,
        },
    );
    ts.metadata.annotations = Some(BTreeMap::from([("envbridge.dev/blake3".to_string(), sha)]));
    ts
}

pub fn set_ref(ts: &TaskSet) -> TaskSetRef {
    TaskSetRef {
        name: ts.metadata.name.clone().unwrap_or_default(),
        blake3: tasks_digest(&ts.spec.tasks),
        tasks: ts.spec.tasks.len() as u32,
    }
}

pub fn environment(
    name: &str,
    id: &str,
    workflow: &str,
    nodes: u32,
    tasks: u32,
    sets: &[TaskSet],
) -> Environment {
    Environment::new(
        name,
        EnvironmentSpec {
            id: id.into(),
            workflow: workflow.into(),
            nodes,
            tasks,
            task_sets: sets.iter().map(set_ref).collect(),
            hooks: vec![],
            desired_state: State::Standby,
            transition: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(i: usize) -> TaskRef {
        TaskRef {
            name: format!("e-t{i}"),
            node: format!("flp{:03}", i % 3),
            control_port: 47100,
            ..TaskRef::default()
        }
    }

    #[test]
    fn packing_splits_and_hashes() {
        let objs = pack("e", "e", "wf", (0..450).map(t).collect());
        assert_eq!(objs.task_sets.len(), 3);
        assert_eq!(objs.environment.spec.tasks, 450);
        assert_eq!(objs.environment.spec.nodes, 3);
        let refs = &objs.environment.spec.task_sets;
        assert_eq!(refs.iter().map(|r| r.tasks).sum::<u32>(), 450);
        assert_eq!(refs[0].blake3, tasks_digest(&objs.task_sets[0].spec.tasks));
        assert_ne!(refs[0].name, refs[1].name);
        // Same input, same names: re-applying is idempotent.
        let again = pack("e", "e", "wf", (0..450).map(t).collect());
        assert_eq!(again.environment.spec, objs.environment.spec);
    }
}

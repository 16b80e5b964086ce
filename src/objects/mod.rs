//! The edge from the pure plan to the cluster's objects: task references packed into TaskSets
//! (one packer, [`pack`]: names, content hashes, sizes) and the Environment naming them.
//! Render, deploy and kill all go through it, so an environment keeps one naming scheme for
//! its whole life.

mod pack;

use std::collections::{BTreeMap, BTreeSet};

use kube::api::ObjectMeta;

use crate::crd::{Environment, TaskSet, labels};
use crate::model::TaskRef;
use crate::plan::{self, Plan, RenderError, RenderRequest};

pub use pack::from_plan;

/// What gets applied for one environment: TaskSets first, then the Environment naming them.
#[derive(Clone, Debug)]
pub struct Objects {
    pub environment: Environment,
    pub task_sets: Vec<TaskSet>,
    /// Ports each node's tasks take (control and TCP), as the plan allocated them.
    pub ports: BTreeMap<String, BTreeSet<u16>>,
}

impl Objects {
    pub fn name(&self) -> String {
        self.environment.metadata.name.clone().unwrap_or_default()
    }

    /// Every task, in the sets' order (sorted by node then role path for a render; the
    /// `-o tasks` view reads this): a view over the sets, not a second copy.
    pub fn tasks(&self) -> impl ExactSizeIterator<Item = &TaskRef> + Clone {
        pack::Tasks::over(&self.task_sets)
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

    /// Sets the namespace and the labels envbridge filters on, on every object: the operator
    /// `shard` that reconciles them among those.
    pub fn place(&mut self, namespace: &str, shard: Option<&str>) {
        let env = self.name();
        let stamp = |meta: &mut ObjectMeta| {
            meta.namespace = Some(namespace.to_string());
            let l = meta.labels.get_or_insert_with(BTreeMap::new);
            l.insert(labels::MANAGED_BY.into(), labels::MANAGER.into());
            l.insert(labels::ENVIRONMENT.into(), env.clone());
            crate::crd::shard::stamp(l, shard);
        };
        stamp(&mut self.environment.metadata);
        for s in &mut self.task_sets {
            stamp(&mut s.metadata);
        }
    }
}

/// Renders a workflow into the objects to apply.
pub fn render(req: &RenderRequest) -> Result<Objects, RenderError> {
    let (plan, parallel) = plan::build_sized(req)?;
    Ok(from_plan(
        plan,
        req.namespace.as_deref(),
        req.task_set_budget,
        parallel,
    ))
}

/// Task references that come from no render (a kill's remaining tasks, tests), packed the
/// render's way (default budget); their ports are read off the references.
pub fn pack(env_name: &str, env_id: &str, workflow: &str, tasks: Vec<TaskRef>) -> Objects {
    let mut ports: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    for t in &tasks {
        ports.entry(t.node.clone()).or_default().extend(t.ports());
    }
    let plan = Plan {
        environment_id: env_id.to_string(),
        environment_name: env_name.to_string(),
        workflow: workflow.to_string(),
        tasks,
        hooks: Vec::new(),
        ports,
    };
    from_plan(plan, None, plan::DEFAULT_TASK_SET_BUDGET, false)
}

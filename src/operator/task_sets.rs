//! Environment -> its task references (from verified TaskSets) -> the Task objects. Pure.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::names::{task_annotations, task_labels};
use crate::crd::{Environment, Task, TaskSet, TaskSpec};
use crate::plan::TaskRef;

/// Put on every Task by the environment controller: the task controller removes it once the
/// task's Pod and Service are gone.
pub const TASK_FINALIZER: &str = "envbridge.dev/task-cleanup";
/// Put on every Environment: removed once all its Tasks (and their Pods, Services) are gone.
pub const ENV_FINALIZER: &str = "envbridge.dev/environment-cleanup";

/// Why the operator does not act on an environment yet (it never acts on a partial set).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetProblem {
    #[error("TaskSet {0:?} not found (yet)")]
    Missing(String),
    #[error("TaskSet {name:?} has content hash {got}, the Environment expects {want}")]
    HashMismatch {
        name: String,
        want: String,
        got: String,
    },
    #[error("TaskSet {name:?} belongs to environment {owner:?}")]
    WrongEnvironment { name: String, owner: String },
    #[error("task {task:?} appears twice (TaskSet {set:?})")]
    Duplicate { task: String, set: String },
    #[error("the TaskSets hold {got} tasks, the Environment expects {want}")]
    Count { want: u32, got: usize },
}

/// All task references of `env`, in TaskSet order, once every named set is present and
/// matches its hash. `lookup(name)` finds a TaskSet in the environment's namespace;
/// `hash(set)` returns its `tasks_digest` (callers may cache it per resourceVersion).
pub fn collect_tasks<L, H, S>(
    env: &Environment,
    lookup: L,
    hash: H,
) -> Result<Vec<TaskRef>, SetProblem>
where
    L: Fn(&str) -> Option<S>,
    S: std::ops::Deref<Target = TaskSet>,
    H: Fn(&TaskSet) -> String,
{
    let env_name = env.name_any();
    let mut sets = Vec::with_capacity(env.spec.task_sets.len());
    for r in &env.spec.task_sets {
        let set = lookup(&r.name).ok_or_else(|| SetProblem::Missing(r.name.clone()))?;
        if set.spec.environment != env_name {
            return Err(SetProblem::WrongEnvironment {
                name: r.name.clone(),
                owner: set.spec.environment.clone(),
            });
        }
        let got = hash(&set);
        if !got.eq_ignore_ascii_case(&r.blake3) {
            return Err(SetProblem::HashMismatch {
                name: r.name.clone(),
                want: r.blake3.clone(),
                got,
            });
        }
        sets.push(set);
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (set, r) in sets.iter().zip(&env.spec.task_sets) {
        for t in &set.spec.tasks {
            if !seen.insert(t.name.as_str()) {
                return Err(SetProblem::Duplicate {
                    task: t.name.clone(),
                    set: r.name.clone(),
                });
            }
            out.push(t.clone());
        }
    }
    if env.spec.tasks != 0 && out.len() != env.spec.tasks as usize {
        return Err(SetProblem::Count {
            want: env.spec.tasks,
            got: out.len(),
        });
    }
    Ok(out)
}

/// The Task object for one reference: same namespace, owned by the environment, labelled,
/// carrying the environment's current transition.
pub fn build_task(env: &Environment, tref: &TaskRef) -> Task {
    let env_name = env.name_any();
    Task {
        metadata: ObjectMeta {
            name: Some(tref.name.clone()),
            namespace: env.namespace(),
            labels: Some(task_labels(&env_name, tref)),
            annotations: Some(task_annotations(tref)),
            owner_references: env.controller_owner_ref(&()).map(|o| vec![o]),
            finalizers: Some(vec![TASK_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: TaskSpec {
            environment: env_name,
            task: tref.clone(),
            transition: env.spec.transition.clone(),
        },
        status: None,
    }
}

/// True when `existing` already is what `build_task` gives (no write needed).
pub fn task_up_to_date(existing: &Task, want: &Task) -> bool {
    existing.spec == want.spec
        && existing.metadata.labels == want.metadata.labels
        && existing.finalizers().iter().any(|f| f == TASK_FINALIZER)
        && existing
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == want.owner_references().first().map(|w| &w.uid))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::crd::{EnvironmentSpec, TaskSetRef, TaskSetSpec, TransitionRequest};
    use crate::model::digest::tasks_digest;
    use crate::state::Event;

    fn tref(name: &str) -> TaskRef {
        TaskRef {
            name: name.into(),
            node: "flp001".into(),
            class: "readout".into(),
            ..Default::default()
        }
    }

    fn set(name: &str, env: &str, tasks: Vec<TaskRef>) -> TaskSet {
        TaskSet::new(
            name,
            TaskSetSpec {
                environment: env.into(),
                tasks,
            },
        )
    }

    fn env_with(sets: &[&TaskSet], count: u32) -> Environment {
        let mut e = Environment::new(
            "e1",
            EnvironmentSpec {
                id: "e1".into(),
                tasks: count,
                task_sets: sets
                    .iter()
                    .map(|s| TaskSetRef {
                        name: s.name_any(),
                        blake3: tasks_digest(&s.spec.tasks),
                        tasks: s.spec.tasks.len() as u32,
                    })
                    .collect(),
                ..Default::default()
            },
        );
        e.metadata.namespace = Some("ns".into());
        e.metadata.uid = Some("env-uid".into());
        e
    }

    fn run(env: &Environment, sets: &[TaskSet]) -> Result<Vec<TaskRef>, SetProblem> {
        let by_name: HashMap<String, &TaskSet> = sets.iter().map(|s| (s.name_any(), s)).collect();
        collect_tasks(
            env,
            |n| by_name.get(n).copied(),
            |s| tasks_digest(&s.spec.tasks),
        )
    }

    #[test]
    fn complete_sets_give_all_tasks_in_order() {
        let a = set("a", "e1", vec![tref("t1"), tref("t2")]);
        let b = set("b", "e1", vec![tref("t3")]);
        let env = env_with(&[&a, &b], 3);
        let names: Vec<String> = run(&env, &[b.clone(), a.clone()])
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["t1", "t2", "t3"]);
    }

    #[test]
    fn partial_or_altered_sets_are_not_acted_on() {
        let a = set("a", "e1", vec![tref("t1")]);
        let b = set("b", "e1", vec![tref("t2")]);
        let env = env_with(&[&a, &b], 2);
        assert_eq!(
            run(&env, std::slice::from_ref(&a)),
            Err(SetProblem::Missing("b".into()))
        );
        let altered = set("b", "e1", vec![tref("t2"), tref("t9")]);
        assert!(matches!(
            run(&env, &[a.clone(), altered]),
            Err(SetProblem::HashMismatch { .. })
        ));
        let other = set("b", "e2", vec![tref("t2")]);
        assert!(matches!(
            run(&env, &[a.clone(), other]),
            Err(SetProblem::WrongEnvironment { .. })
        ));
        let dup = set("b", "e1", vec![tref("t1")]);
        let env = env_with(&[&a, &dup], 2);
        assert!(matches!(
            run(&env, &[a, dup]),
            Err(SetProblem::Duplicate { .. })
        ));
    }

    #[test]
    fn tasks_carry_owner_labels_finalizer_and_transition() {
        let a = set("a", "e1", vec![tref("t1")]);
        let mut env = env_with(&[&a], 1);
        env.spec.transition = Some(TransitionRequest {
            id: "x1".into(),
            event: Event::Configure,
            arguments: Default::default(),
        });
        let t = build_task(&env, &tref("t1"));
        assert_eq!(t.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(t.owner_references()[0].uid, "env-uid");
        assert_eq!(t.labels()["envbridge.dev/environment"], "e1");
        assert_eq!(t.labels()["app.kubernetes.io/managed-by"], "envbridge");
        assert_eq!(t.spec.transition.as_ref().unwrap().id, "x1");
        assert!(task_up_to_date(&t, &t));
        let mut changed = t.clone();
        changed.spec.transition = None;
        assert!(!task_up_to_date(&changed, &t));
    }
}

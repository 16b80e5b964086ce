//! Environment -> its task references (from verified TaskSets) -> the Task objects. Pure.

use std::collections::HashSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::names::{task_annotations, task_labels};
use super::task_patch::update_patch;
use crate::crd::{Environment, Task, TaskSet, TaskSpec, TransitionRequest};
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

/// An environment's verified TaskSets, held (not copied): its task references are borrowed
/// from them, so a reconcile of 10,000 tasks does not clone 10,000 references.
#[derive(Debug)]
pub struct Collected<S> {
    sets: Vec<S>,
}

impl<S: std::ops::Deref<Target = TaskSet>> Collected<S> {
    /// All task references, in TaskSet order.
    pub fn refs(&self) -> Vec<&TaskRef> {
        self.sets.iter().flat_map(|s| s.spec.tasks.iter()).collect()
    }
}

/// The TaskSets of `env`, once every named set is present and matches its hash and they
/// hold each task once, as many as the Environment says. `lookup(name)` finds a TaskSet in
/// the environment's namespace; `hash(set)` returns its `tasks_digest` (callers may cache it
/// per resourceVersion).
pub fn collect_tasks<L, H, S>(
    env: &Environment,
    lookup: L,
    hash: H,
) -> Result<Collected<S>, SetProblem>
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
    let mut seen = HashSet::new();
    for (set, r) in sets.iter().zip(&env.spec.task_sets) {
        for t in &set.spec.tasks {
            if !seen.insert(t.name.as_str()) {
                return Err(SetProblem::Duplicate {
                    task: t.name.clone(),
                    set: r.name.clone(),
                });
            }
        }
    }
    if env.spec.tasks != 0 && seen.len() != env.spec.tasks as usize {
        return Err(SetProblem::Count {
            want: env.spec.tasks,
            got: seen.len(),
        });
    }
    drop(seen);
    Ok(Collected { sets })
}

/// The Task object for one reference: same namespace, owned by the environment, labelled,
/// carrying the environment's current transition.
pub fn build_task(env: &Environment, tref: &TaskRef) -> Task {
    let env_name = env.name_any();
    Task {
        metadata: ObjectMeta {
            name: Some(tref.name.clone()),
            namespace: env.namespace(),
            labels: Some(task_labels(
                &env_name,
                tref,
                crate::crd::shard::of(env.labels()),
            )),
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
    existing.spec == want.spec && same_metadata(existing, want)
}

/// The labels, the finalizer and the owner `build_task` gives are there.
fn same_metadata(existing: &Task, want: &Task) -> bool {
    existing.metadata.labels == want.metadata.labels
        && existing.finalizers().iter().any(|f| f == TASK_FINALIZER)
        && existing
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == want.owner_references().first().map(|w| &w.uid))
}

/// What an Environment reconcile writes to its Tasks.
#[derive(Debug, Default)]
pub struct TaskWrites {
    /// Tasks not there (yet): created whole.
    pub create: Vec<Task>,
    /// Tasks that differ otherwise: by name, the merge patch that makes them what they
    /// should be (`task_patch::update_patch`).
    pub update: Vec<(String, serde_json::Value)>,
    /// Tasks that differ only by the transition they are asked (every other field, label,
    /// finalizer and owner as wanted): that one field is written (a JSON patch, far lighter
    /// for the apiserver than the whole Task), by name.
    pub transition: Vec<(String, TransitionRequest)>,
    /// Tasks of the environment that no reference names any more (a new render).
    pub delete: Vec<String>,
}

/// Whether `existing` is `want` but for a transition `want` asks (the one field to write).
fn only_transition_differs(existing: &Task, want: &Task) -> bool {
    want.spec.transition.is_some()
        && existing.spec.transition != want.spec.transition
        && existing.spec.environment == want.spec.environment
        && existing.spec.task == want.spec.task
        && same_metadata(existing, want)
}

/// Decides the writes from each reference's wanted Task beside the stored one, and the
/// environment's stored Tasks: a Task is written when it differs, or when it is missing and
/// the environment's Tasks were never created (a killed task stays gone); one being deleted
/// is left alone. `wanted` is consumed one Task at a time: only those to create are kept.
pub fn task_writes<'a>(
    wanted: impl IntoIterator<Item = (Task, Option<&'a Task>)>,
    mine: &[&Task],
    created_before: bool,
) -> TaskWrites {
    let mut names = HashSet::new();
    let mut create = Vec::new();
    let mut update = Vec::new();
    let mut transition = Vec::new();
    for (want, existing) in wanted {
        names.insert(want.name_any());
        match existing {
            Some(t) if t.metadata.deletion_timestamp.is_some() => {}
            Some(t) if task_up_to_date(t, &want) => {}
            Some(t) if only_transition_differs(t, &want) => {
                if let Some(req) = want.spec.transition {
                    transition.push((t.name_any(), req));
                }
            }
            Some(t) => update.push((t.name_any(), update_patch(t, &want))),
            None if created_before => {}
            None => create.push(want),
        }
    }
    let delete = mine
        .iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none())
        .map(|t| t.name_any())
        .filter(|n| !names.contains(n))
        .collect();
    TaskWrites {
        create,
        update,
        transition,
        delete,
    }
}

/// What to do with a Task that a create found there (409) though the store did not show it
/// as this environment's.
#[derive(Debug)]
pub enum Found {
    /// Ours (or no one's, then adopted, as the apply used to): these writes (none when it is
    /// already as wanted) make it the wanted Task.
    Write(TaskWrites),
    /// Still being deleted: it is created once gone.
    Going,
    /// Controlled by another object (`kind/name`): not this environment's to take.
    Taken { owner: String },
}

/// Decides [`Found`] for `existing`, read after a create of `want` was refused as a conflict.
pub fn found_task(existing: &Task, want: Task) -> Found {
    if existing.metadata.deletion_timestamp.is_some() {
        return Found::Going;
    }
    let mine = want.owner_references().first().map(|o| o.uid.clone());
    if let Some(other) = existing
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && Some(&o.uid) != mine.as_ref())
    {
        return Found::Taken {
            owner: format!("{}/{}", other.kind, other.name),
        };
    }
    Found::Write(task_writes([(want, Some(existing))], &[existing], true))
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
        .map(|c| c.refs().into_iter().cloned().collect())
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

    #[test]
    fn writes_what_differs_creates_once_and_deletes_what_no_reference_names() {
        let env = env_with(&[], 0);
        let r = |n: &str| TaskRef {
            name: n.into(),
            node: "flp001".into(),
            ..TaskRef::default()
        };
        let same = build_task(&env, &r("same"));
        let mut changed = build_task(&env, &r("changed"));
        changed.spec.task.command = "old".into();
        let mut going = build_task(&env, &r("going"));
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        let orphan = build_task(&env, &r("orphan"));
        let wanted = |refs: &[&str]| -> Vec<(Task, Option<&Task>)> {
            refs.iter()
                .map(|n| {
                    let existing = [&same, &changed, &going, &orphan]
                        .into_iter()
                        .find(|t| t.name_any() == *n);
                    (build_task(&env, &r(n)), existing)
                })
                .collect()
        };
        let mine = [&same, &changed, &going, &orphan];
        let w = task_writes(wanted(&["same", "changed", "going", "new"]), &mine, false);
        let created: Vec<String> = w.create.iter().map(|t| t.name_any()).collect();
        assert_eq!(created, ["new"]);
        let updated: Vec<&str> = w.update.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(updated, ["changed"]);
        assert_eq!(w.delete, ["orphan"]);
        // Created before: a missing Task (killed) stays gone.
        let w = task_writes(wanted(&["same", "new"]), &mine, true);
        assert!(w.create.is_empty() && w.update.is_empty());
        assert_eq!(w.delete, ["changed", "orphan"]);

        // A new transition alone is that one field's write; with anything else, the whole.
        let req = TransitionRequest {
            id: "t2".into(),
            event: Event::Configure,
            arguments: Default::default(),
        };
        let mut asked = build_task(&env, &r("same"));
        asked.spec.transition = Some(req.clone());
        let w = task_writes(vec![(asked.clone(), Some(&same))], &mine, true);
        assert!(w.update.is_empty(), "{:?}", w.update);
        assert_eq!(w.transition, [("same".to_string(), req.clone())]);
        let mut asked_and_changed = asked.clone();
        asked_and_changed.spec.task.class = "other".into();
        let w = task_writes(vec![(asked_and_changed, Some(&same))], &mine, true);
        assert!(w.transition.is_empty());
        assert_eq!(w.update.len(), 1);
        // Already asked: nothing to write.
        let w = task_writes(vec![(asked.clone(), Some(&asked))], &mine, true);
        assert!(w.update.is_empty() && w.transition.is_empty());
    }

    #[test]
    fn a_task_found_by_a_refused_create_is_made_ours_unless_going_or_taken() {
        let env = env_with(&[], 0);
        let mut r = tref("t1");
        r.command = "new".into();
        let want = build_task(&env, &r);
        assert!(matches!(
            found_task(&want, want.clone()),
            Found::Write(w) if w.create.is_empty() && w.update.is_empty() && w.transition.is_empty()
        ));
        // Another render's Task, or one made by hand without an owner: one merge patch.
        let mut stale = want.clone();
        stale.spec.task.command = "old".into();
        stale.metadata.owner_references = None;
        match found_task(&stale, want.clone()) {
            Found::Write(w) => {
                assert!(w.create.is_empty() && w.delete.is_empty());
                assert_eq!(w.update.len(), 1);
                let patch = &w.update[0].1;
                assert_eq!(patch["spec"]["task"]["command"], "new");
                assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "env-uid");
            }
            other => panic!("{other:?}"),
        }
        let mut going = want.clone();
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert!(matches!(found_task(&going, want.clone()), Found::Going));
        let mut taken = want.clone();
        let owner = &mut taken.metadata.owner_references.as_mut().unwrap()[0];
        owner.uid = "other-uid".into();
        owner.name = "e9".into();
        match found_task(&taken, want.clone()) {
            Found::Taken { owner } => assert_eq!(owner, "Environment/e9"),
            other => panic!("{other:?}"),
        }
        // Owned by another object, but not as its controller: ours to take.
        taken.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false);
        assert!(matches!(found_task(&taken, want), Found::Write(w) if w.update.len() == 1));
    }
}

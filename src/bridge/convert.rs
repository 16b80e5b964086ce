//! Cluster objects -> roster records (the only place that knows both shapes).

use std::time::SystemTime;

use kube::ResourceExt;

use crate::crd::{Environment, Task, TransitionPhase};
use crate::roster::{EnvKey, EnvRecord, Failure, Observed, Phase, Roster, TaskRecord};
use crate::state::State;

pub fn phase(p: TransitionPhase) -> Phase {
    match p {
        TransitionPhase::Running => Phase::Running,
        TransitionPhase::Succeeded => Phase::Succeeded,
        TransitionPhase::Failed => Phase::Failed,
    }
}

pub fn env_key(env: &Environment) -> EnvKey {
    EnvKey::new(
        env.namespace().as_deref().unwrap_or_default(),
        &env.name_any(),
    )
}

pub fn env_record(r: &Roster, env: &Environment) -> EnvRecord {
    let status = env.status.as_ref();
    let failing: Vec<Failure> = status
        .map(|s| {
            s.failing_tasks
                .iter()
                .map(|f| Failure {
                    task: f.name.as_str().into(),
                    node: r.intern(&f.node),
                    path: f.path.as_str().into(),
                    critical: f.critical,
                    message: f.message.as_str().into(),
                })
                .collect()
        })
        .unwrap_or_default();
    // A status written before `failingCritical` existed: its listed critical tasks.
    let failing_critical = status
        .and_then(|s| s.failing_critical)
        .unwrap_or_else(|| failing.iter().filter(|f| f.critical).count() as u32);
    EnvRecord {
        key: EnvKey {
            namespace: r.intern(env.namespace().as_deref().unwrap_or_default()),
            name: r.intern(&env.name_any()),
        },
        id: r.intern(&env.spec.id),
        workflow: r.intern(&env.spec.workflow),
        nodes: env.spec.nodes,
        tasks: env.spec.tasks,
        desired: env.spec.desired_state,
        state: status.and_then(|s| s.state),
        requested: env
            .spec
            .transition
            .as_ref()
            .map(|t| (r.intern(&t.id), t.event)),
        observed: status
            .and_then(|s| s.transition.as_ref())
            .map(|t| Observed {
                id: r.intern(&t.id),
                event: t.event,
                phase: phase(t.phase),
                message: (!t.message.is_empty()).then(|| t.message.as_str().into()),
            }),
        counts: status.map(|s| s.counts.clone()).unwrap_or_default(),
        failing_critical,
        failing,
        deleting: env.metadata.deletion_timestamp.is_some(),
        // Unique per run: not interned.
        run_number: env
            .spec
            .transition
            .as_ref()
            .and_then(|t| t.run_number())
            .map(Into::into),
        description: env.spec.description.as_deref().map(Into::into),
        variables: std::sync::Arc::new(env.spec.variables.clone()),
        run_variables: std::sync::Arc::new(env.spec.run_variables.clone()),
        created_at: env
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| SystemTime::from(t.0))
            .unwrap_or(SystemTime::UNIX_EPOCH),
        changed_at: SystemTime::UNIX_EPOCH,
    }
}

/// The roster key of the environment a Task belongs to.
pub fn task_env_key(r: &Roster, task: &Task) -> EnvKey {
    EnvKey {
        namespace: r.intern(task.namespace().as_deref().unwrap_or_default()),
        name: r.intern(&task.spec.environment),
    }
}

pub fn task_record(r: &Roster, task: &Task) -> TaskRecord {
    let status = task.status.as_ref();
    let t = &task.spec.task;
    TaskRecord {
        name: task.name_any().into(),
        env: task_env_key(r, task),
        node: r.intern(&t.node),
        class: r.intern(&t.class),
        path: t.path.as_str().into(),
        critical: t.critical,
        state: status.and_then(|s| s.state).unwrap_or(State::Deploying),
        pod_phase: r
            .interner()
            .opt(status.and_then(|s| s.pod_phase.as_deref())),
        pod_ip: r.interner().opt(status.and_then(|s| s.pod_ip.as_deref())),
        message: status
            .and_then(|s| s.message.as_deref())
            .filter(|m| !m.is_empty())
            .map(Into::into),
        transition: status
            .and_then(|s| s.transition.as_ref())
            .map(|tr| (r.intern(&tr.id), phase(tr.phase))),
        ports: t.ports().into(),
        control_port: t.control_port,
        pid: status.and_then(|s| s.pid).unwrap_or(0),
        deleting: task.metadata.deletion_timestamp.is_some(),
        changed_at: SystemTime::UNIX_EPOCH,
    }
}

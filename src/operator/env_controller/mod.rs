//! Environment controller: verified TaskSets -> one Task per task reference; task states ->
//! Environment status; Events on state changes; a finalizer that leaves nothing behind.
//! Here the reconcile; the rest in `writes` (Task writes and their progress), `status` (the
//! summary, its writes and Events), `gate` (hooks and calls a transition waits for) and
//! `finalize`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::{Api, Resource, ResourceExt};
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use super::context::Ctx;
use super::task_sets::{ENV_FINALIZER, SetProblem, build_task, collect_tasks, task_writes};
use super::{Error, Result};
use super::{calls, status_pace};
use crate::crd::{Environment, Task, TaskSet};
use crate::model::digest::tasks_digest;
use crate::plan::ControlMode;
use crate::state::State;

use finalize::finalize;
use gate::{DeployCalls, deploy_calls, gated_transition, hook_gate};
pub use status::set_condition;
use status::{own_tasks, publish_changes, summarize, write_status};
use writes::{Progress, write_tasks};

mod finalize;
mod gate;
mod status;
mod writes;

pub const COND_SETS: &str = "TaskSetsVerified";
pub const COND_CREATED: &str = "TasksCreated";

pub async fn reconcile(env: Arc<Environment>, ctx: Arc<Ctx>) -> Result<Action> {
    ctx.listed().await;
    let api: Api<Environment> =
        Api::namespaced(ctx.client.clone(), &env.namespace().unwrap_or_default());
    // kube's helper adds the finalizer if missing and removes it once `finalize` succeeds.
    finalizer(&api, ENV_FINALIZER, env.clone(), |ev| async {
        match ev {
            finalizer::Event::Apply(e) => apply(e, &ctx, &api).await,
            finalizer::Event::Cleanup(e) => finalize(&e, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::from_finalizer(env.as_ref(), e))
}

/// A live Environment: its Tasks written from its TaskSets, its status aggregated.
async fn apply(env: Arc<Environment>, ctx: &Ctx, api: &Api<Environment>) -> Result<Action> {
    let ns = env.namespace().unwrap_or_default();
    let name = env.name_any();

    let old = env.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let generation = env.metadata.generation;
    let sets = collect_tasks(
        &env,
        |set| ctx.task_sets.get(&reflector_ref::<TaskSet>(set, &ns)),
        |set| cached_hash(ctx, set),
    );
    let sets = match sets {
        Ok(sets) => sets,
        Err(problem) => {
            set_condition(
                &mut status.conditions,
                COND_SETS,
                false,
                reason_of(&problem),
                &problem.to_string(),
                generation,
            );
            write_status(ctx, api, &env, &old, status).await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };
    // Borrowed from the stored TaskSets (not copied).
    let refs = sets.refs();
    let msg = format!(
        "{} tasks in {} TaskSets",
        refs.len(),
        env.spec.task_sets.len()
    );
    set_condition(
        &mut status.conditions,
        COND_SETS,
        true,
        "Verified",
        &msg,
        generation,
    );

    let digest = sets_digest(&env);
    let created_before = status
        .conditions
        .iter()
        .any(|c| c.type_ == COND_CREATED && c.status == "True" && c.message.ends_with(&digest));
    let env_uid = env.uid().unwrap_or_default();
    // This environment's Tasks as stored (by the index), owned by this very Environment.
    let own = || own_tasks(ctx, &env);

    // The calls triggered before the deployment run, and those awaited there end, before the
    // first Tasks are written; a critical one that failed stops the deployment, named.
    if !created_before && env.spec.transition.is_none() {
        match deploy_calls(ctx, &env, calls::DeployStep::Before) {
            DeployCalls::Pending => return Ok(Action::requeue(Duration::from_millis(200))),
            DeployCalls::Failed(failing) => {
                status.state = Some(State::Error);
                let critical = failing.iter().filter(|f| f.critical).count() as u32;
                status.failing_critical = (critical > 0).then_some(critical);
                status.failing_tasks = failing;
                write_status(ctx, api, &env, &old, status).await?;
                return Ok(Action::await_change());
            }
            DeployCalls::Done => {}
        }
    }

    // With hook tasks the Tasks' transitions are gated step by step (see `hooks`): looked
    // at on every reconcile, not only when the generation changes.
    let has_hooks = refs.iter().any(|r| r.control_mode == ControlMode::Hook)
        || env.spec.hooks.iter().any(|h| h.trigger.is_some());
    let gate = match (&env.spec.transition, has_hooks) {
        (Some(req), true) => {
            let now = own();
            let (gate, start, calls) = hook_gate(ctx, &env, req, &refs, &now);
            for i in calls {
                ctx.calls
                    .start(&env_uid, &env.spec.id, req, &env.spec.hooks[i]);
            }
            Some((req, (gate, start)))
        }
        _ => None,
    };
    if old.observed_generation != generation || !created_before || gate.is_some() {
        if let Some(req) = &env.spec.transition {
            debug!(target: "envbridge::hops", hop = "operator_seen", transition = %req.id, env = %name);
        }
        let stored = own();
        let by_name: HashMap<String, &Task> =
            stored.iter().map(|t| (t.name_any(), t.as_ref())).collect();
        // Built one at a time as `task_writes` compares them (not all 10,000 at once).
        let wanted = refs.iter().map(|r| {
            let mut want = build_task(&env, r);
            let existing = by_name.get(&r.name).copied();
            if let Some((req, (gate, start))) = &gate {
                want.spec.transition = gated_transition(r, existing, req, gate, start);
            }
            (want, existing)
        });
        let mine_now: Vec<&Task> = stored.iter().map(|t| t.as_ref()).collect();
        let writes = task_writes(wanted, &mine_now, created_before);
        // A long write (a transition reaching thousands of Tasks) stops now and then to
        // write the status: the first Tasks' failures show while the last are written.
        let progress = Progress {
            ctx,
            api,
            env: &env,
            refs: &refs,
            has_hooks,
            status: &status,
            shown: old.clone(),
        };
        match write_tasks(ctx, &ns, &name, writes, progress).await {
            // Told in the status, where the shifter looks; the reconcile fails (counted and
            // logged as `taken`) and looks again after `retry_after`.
            Err(e @ Error::Taken { .. }) => {
                let msg = e.to_string();
                set_condition(
                    &mut status.conditions,
                    COND_CREATED,
                    false,
                    "NameTaken",
                    &msg,
                    generation,
                );
                write_status(ctx, api, &env, &old, status).await?;
                return Err(e);
            }
            r => r?,
        }
        if let Some(req) = &env.spec.transition {
            debug!(target: "envbridge::hops", hop = "tasks_written", transition = %req.id, env = %name);
        }
        let msg = format!("{} tasks created from TaskSets {digest}", refs.len());
        set_condition(
            &mut status.conditions,
            COND_CREATED,
            true,
            "Created",
            &msg,
            generation,
        );
        status.observed_generation = generation;
    }

    summarize(ctx, &env, &refs, &own(), has_hooks, &mut status);
    let since_last = ctx.status_written.get(&env_uid).map(|t| t.elapsed());
    let window = status_pace::window(
        Duration::from_millis(ctx.args.status_debounce_ms),
        refs.len(),
    );
    if let Some(wait) = status_pace::hold(&old, &status, since_last, window) {
        return Ok(Action::requeue(wait));
    }
    if status != old {
        let settled = status
            .transition
            .as_ref()
            .filter(|t| t.phase != crate::crd::TransitionPhase::Running)
            .filter(|t| old.transition.as_ref() != Some(*t))
            .map(|t| t.id.clone());
        write_status(ctx, api, &env, &old, status.clone()).await?;
        ctx.status_written
            .insert(env_uid.clone(), std::time::Instant::now());
        if let Some(id) = settled {
            debug!(target: "envbridge::hops", hop = "outcome_written", transition = %id, env = %name);
        }
    }
    // After the status: the outcome is not held up by the Events that tell it.
    publish_changes(ctx, &env, &old, &status).await;
    // A call in flight ends without any watch event: look again soon.
    if let Some(req) = &env.spec.transition
        && ctx.calls.any_running(&env_uid, &req.id)
    {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

pub fn error_policy(env: Arc<Environment>, err: &Error, _ctx: Arc<Ctx>) -> Action {
    if matches!(err, Error::Pending { .. }) {
        debug!(env = %env.name_any(), %err);
    } else {
        warn!(env = %env.name_any(), error = %err, "environment reconcile failed, retrying");
    }
    Action::requeue(err.retry_after())
}

fn reflector_ref<K: Resource<DynamicType = ()>>(
    name: &str,
    ns: &str,
) -> kube::runtime::reflector::ObjectRef<K> {
    kube::runtime::reflector::ObjectRef::new(name).within(ns)
}

fn cached_hash(ctx: &Ctx, set: &TaskSet) -> String {
    let uid = set.uid().unwrap_or_default();
    let rv = set.resource_version().unwrap_or_default();
    if let Some(hit) = ctx.set_hashes.get(&uid)
        && hit.0 == rv
    {
        return hit.1.clone();
    }
    let h = tasks_digest(&set.spec.tasks);
    ctx.set_hashes.insert(uid, (rv, h.clone()));
    h
}

/// Identifies the environment's set of TaskSets (what "created" refers to).
fn sets_digest(env: &Environment) -> String {
    let mut h = Sha256::new();
    for r in &env.spec.task_sets {
        h.update(r.name.as_bytes());
        h.update(b"/");
        h.update(r.blake3.as_bytes());
        h.update(b"\n");
    }
    hex::encode(&h.finalize()[..6])
}

fn reason_of(p: &SetProblem) -> &'static str {
    match p {
        SetProblem::Missing(_) => "TaskSetMissing",
        SetProblem::HashMismatch { .. } => "HashMismatch",
        SetProblem::WrongEnvironment { .. } => "WrongEnvironment",
        SetProblem::Duplicate { .. } => "DuplicateTask",
        SetProblem::Count { .. } => "TaskCountMismatch",
    }
}

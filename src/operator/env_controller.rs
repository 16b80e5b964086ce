//! Environment controller: verified TaskSets -> one Task per task reference; task states ->
//! Environment status; Events on state changes; a finalizer that leaves nothing behind.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KEvent, EventType};
use kube::runtime::finalizer::{self, finalizer};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use super::aggregate::aggregate;
use super::context::{Ctx, TASK_DELETION};
use super::stored_pod::StoredPod;
use super::stored_service::StoredService;
use super::task_sets::{
    ENV_FINALIZER, SetProblem, TaskWrites, build_task, collect_tasks, task_writes,
};
use super::{Error, FIELD_MANAGER, Result, delete_ignore_missing};
use super::{calls, hooks, status_pace};
use crate::crd::{
    Environment, EnvironmentStatus, Task, TaskSet, TransitionPhase, TransitionRequest,
    TransitionStatus,
};
use crate::model::digest::tasks_digest;
use crate::model::label::label_value;
use crate::plan::{ControlMode, TaskRef};
use crate::state::State;
use std::collections::{HashMap, HashSet};

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
        write_tasks(ctx, &ns, &name, writes, progress).await?;
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

/// The environment's status from its Tasks as stored (the operator's aggregation, the one
/// owner of a transition's outcome) and its deployment calls.
fn summarize(
    ctx: &Ctx,
    env: &Environment,
    refs: &[&TaskRef],
    tasks: &[Arc<Task>],
    has_hooks: bool,
    status: &mut EnvironmentStatus,
) {
    let task_refs: Vec<&Task> = tasks.iter().map(|t| t.as_ref()).collect();
    // Every referenced task counts: one not (yet) in the store is DEPLOYING, so a lagging
    // store never makes the environment look complete early.
    let expected = refs
        .iter()
        .filter(|r| r.control_mode != ControlMode::Hook)
        .count();
    let agg = aggregate(
        env.spec.desired_state,
        env.spec.transition.as_ref(),
        &task_refs,
        expected,
    );
    status.state = Some(agg.state);
    status.counts = agg.counts;
    status.ready = Some(agg.ready);
    status.failing_tasks = agg.failing_tasks;
    status.failing_count = (agg.failing_count > 0).then_some(agg.failing_count as u32);
    // Once deployed (every task STANDBY, no transition asked yet): the calls after it; and
    // whatever a deployment call said (a critical failure makes the environment ERROR).
    if env.spec.transition.is_none() && agg.state == State::Standby {
        let _ = deploy_calls(ctx, env, calls::DeployStep::After);
    }
    let failed_calls = deploy_failures(ctx, env);
    let critical_calls = failed_calls.iter().filter(|f| f.critical).count();
    if critical_calls > 0 {
        status.state = Some(State::Error);
    }
    let critical = agg.failing_critical + critical_calls;
    status.failing_critical = (critical > 0).then_some(critical as u32);
    status.failing_tasks.extend(failed_calls);
    status.transition = match &env.spec.transition {
        Some(req) if has_hooks => {
            let (gate, _, _) = hook_gate(ctx, env, req, refs, tasks);
            Some(hook_transition_status(req, &gate.outcome))
        }
        _ => agg.transition,
    };
}

/// The environment's Tasks as stored (by the index), owned by this very Environment.
fn own_tasks(ctx: &Ctx, env: &Environment) -> Vec<Arc<Task>> {
    let uid = env.uid().unwrap_or_default();
    ctx.tasks_of(&env.namespace().unwrap_or_default(), &env.name_any())
        .into_iter()
        .filter(|t| t.owner_references().iter().any(|o| o.uid == uid))
        .collect()
}

/// What a long write of Tasks shows meanwhile: the status so far, summarized again from
/// the Tasks as they stand.
struct Progress<'a> {
    ctx: &'a Ctx,
    api: &'a Api<Environment>,
    env: &'a Environment,
    refs: &'a [&'a TaskRef],
    has_hooks: bool,
    status: &'a EnvironmentStatus,
    /// The status last written.
    shown: EnvironmentStatus,
}

impl Progress<'_> {
    async fn show(&mut self) -> Result<()> {
        let mut now = self.status.clone();
        let tasks = own_tasks(self.ctx, self.env);
        summarize(
            self.ctx,
            self.env,
            self.refs,
            &tasks,
            self.has_hooks,
            &mut now,
        );
        write_status(self.ctx, self.api, self.env, &self.shown, now.clone()).await?;
        self.shown = now;
        Ok(())
    }
}

/// How often a long write of Tasks stops to show its progress (`write_tasks`).
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// One write of a Task.
enum TaskWrite {
    /// The whole Task, server-side applied.
    Apply(Box<Task>),
    /// Its transition alone: that one field, replaced whole (its arguments are exactly the
    /// transition's own), by the same field manager: far lighter for the apiserver.
    Transition(String, TransitionRequest),
}

async fn write_task(api: Api<Task>, ns: String, w: TaskWrite) -> Result<()> {
    match w {
        TaskWrite::Apply(t) => {
            let tname = t.name_any();
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            api.patch(&tname, &pp, &Patch::Apply(&*t))
                .await
                .map(|_| ())
                .map_err(|e| Error::kube("apply", "Task", &ns, &tname, e))
        }
        TaskWrite::Transition(tname, req) => {
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..PatchParams::default()
            };
            let patch = json_patch::Patch(vec![json_patch::PatchOperation::Add(
                json_patch::AddOperation {
                    path: json_patch::jsonptr::PointerBuf::from_tokens(["spec", "transition"]),
                    value: serde_json::to_value(&req).unwrap_or_default(),
                },
            )]);
            api.patch(&tname, &pp, &Patch::<()>::Json(patch))
                .await
                .map(|_| ())
                .map_err(|e| Error::kube("patch", "Task", &ns, &tname, e))
        }
    }
}

/// Writes (server-side apply, a few at once) and deletes what `task_writes` decided,
/// showing `progress` every [`PROGRESS_EVERY`] (or the environment's progress window, when
/// longer) while the writes go on.
async fn write_tasks(
    ctx: &Ctx,
    ns: &str,
    env: &str,
    writes: TaskWrites,
    mut progress: Progress<'_>,
) -> Result<()> {
    let TaskWrites {
        apply: writes,
        transition,
        delete: stale,
    } = writes;
    let total = writes.len() + transition.len();
    let task_api: Api<Task> = Api::namespaced(ctx.client.clone(), ns);
    let writes = writes
        .into_iter()
        .map(|t| TaskWrite::Apply(Box::new(t)))
        .chain(
            transition
                .into_iter()
                .map(|(n, r)| TaskWrite::Transition(n, r)),
        );
    let mut pending = stream::iter(writes)
        .map(|w| write_task(task_api.clone(), ns.to_string(), w))
        .buffer_unordered(ctx.args.apply_concurrency.max(1));
    // No more often than the environment's progress window: at 10,000 Tasks, a write every
    // 500 ms was ~250 status writes per transition.
    let every = PROGRESS_EVERY.max(status_pace::window(
        Duration::from_millis(ctx.args.status_debounce_ms),
        total,
    ));
    let start = tokio::time::Instant::now() + every;
    let mut tick = tokio::time::interval_at(start, every);
    loop {
        tokio::select! {
            written = pending.next() => match written {
                Some(r) => {
                    r?;
                }
                None => break,
            },
            _ = tick.tick() => progress.show().await?,
        }
    }
    for t in &stale {
        delete_ignore_missing(&task_api, t, "Task", ns).await?;
    }
    if total > 0 || !stale.is_empty() {
        info!(env = %env, namespace = %ns, applied = total, deleted = stale.len(), "tasks written");
    }
    Ok(())
}

/// The hook gate of transition `req` from the environment's Tasks as stored and its calls
/// as they stand: the gate, the names of the hook tasks to start now, and the calls to send
/// now (indices into `spec.hooks`).
fn hook_gate(
    ctx: &Ctx,
    env: &Environment,
    req: &TransitionRequest,
    refs: &[&TaskRef],
    tasks: &[Arc<Task>],
) -> (hooks::Gate, HashSet<String>, Vec<usize>) {
    let by_name: HashMap<&str, &Task> = tasks
        .iter()
        .filter_map(|t| t.metadata.name.as_deref().map(|n| (n, t.as_ref())))
        .collect();
    let hook_refs: Vec<&TaskRef> = refs
        .iter()
        .copied()
        .filter(|r| r.control_mode == ControlMode::Hook)
        .collect();
    let env_uid = env.uid().unwrap_or_default();
    let mut list: Vec<hooks::Hook> = hook_refs
        .iter()
        .map(|r| hooks::Hook {
            kind: "hook task",
            name: &r.name,
            trigger: r.trigger.as_deref().unwrap_or(""),
            await_: r.r#await.as_deref(),
            critical: r.critical,
            run: hook_run(by_name.get(r.name.as_str()).copied(), req),
        })
        .collect();
    let first_call = list.len();
    list.extend(env.spec.hooks.iter().map(|c| hooks::Hook {
        kind: "call",
        name: &c.path,
        trigger: c.trigger.as_deref().unwrap_or(""),
        await_: c.r#await.as_deref(),
        critical: c.critical,
        run: ctx.calls.run_of(&env_uid, &req.id, &c.path),
    }));
    // The non-hook tasks' part of the transition, as the aggregate sees it.
    let plain: Vec<&Task> = by_name.values().copied().collect();
    let expected = refs.len() - hook_refs.len();
    let tasks_tr = aggregate(env.spec.desired_state, Some(req), &plain, expected).transition;
    let tasks = match tasks_tr {
        Some(t) if t.phase == TransitionPhase::Succeeded => hooks::Tasks::Succeeded,
        Some(t) if t.phase == TransitionPhase::Failed => hooks::Tasks::Failed(t.message),
        Some(t) => hooks::Tasks::Waiting(t.message),
        None => hooks::Tasks::Waiting(String::new()),
    };
    let gate = hooks::gate(req.event, &list, &tasks);
    let start = gate
        .start
        .iter()
        .filter(|i| **i < first_call)
        .map(|i| list[*i].name.to_string())
        .collect();
    let calls = gate
        .start
        .iter()
        .filter(|i| **i >= first_call)
        .map(|i| i - first_call)
        .collect();
    (gate, start, calls)
}

/// Where the deployment's calls of one step stand.
enum DeployCalls {
    /// Some awaited at this step are still in flight.
    Pending,
    /// Critical ones failed (as failing entries of the status, named by the call's path).
    Failed(Vec<crate::crd::FailingTask>),
    Done,
}

/// Sends the calls of deployment step `step` (once) and tells whether those awaited at it have
/// ended. A call is awaited at its `await` (default: its trigger).
fn deploy_calls(ctx: &Ctx, env: &Environment, step: calls::DeployStep) -> DeployCalls {
    let uid = env.uid().unwrap_or_default();
    let mut pending = false;
    for c in &env.spec.hooks {
        let trigger = c.trigger.as_deref().unwrap_or("");
        if calls::deploy_step(trigger) != Some(step) {
            continue;
        }
        if ctx.calls.run_of(&uid, calls::DEPLOY, &c.path) == hooks::Run::Idle {
            ctx.calls.start_at(calls::DEPLOY, &uid, &env.spec.id, c);
        }
        let awaited = calls::deploy_step(c.r#await.as_deref().unwrap_or(trigger)) == Some(step);
        if awaited && ctx.calls.run_of(&uid, calls::DEPLOY, &c.path) == hooks::Run::Started {
            pending = true;
        }
    }
    let failed: Vec<_> = deploy_failures(ctx, env)
        .into_iter()
        .filter(|f| f.critical)
        .collect();
    match (pending, failed.is_empty()) {
        (true, _) => DeployCalls::Pending,
        (false, false) => DeployCalls::Failed(failed),
        (false, true) => DeployCalls::Done,
    }
}

/// The deployment's calls that failed, as failing entries (node empty: a call is no task).
fn deploy_failures(ctx: &Ctx, env: &Environment) -> Vec<crate::crd::FailingTask> {
    let uid = env.uid().unwrap_or_default();
    env.spec
        .hooks
        .iter()
        .filter_map(|c| match ctx.calls.run_of(&uid, calls::DEPLOY, &c.path) {
            hooks::Run::Failed(why) => Some(crate::crd::FailingTask {
                name: format!("call {}", c.path),
                node: String::new(),
                path: c.path.clone(),
                critical: c.critical,
                message: format!("{} at deployment: {why}", c.func),
            }),
            _ => None,
        })
        .collect()
}

/// Where hook task `t` stands in transition `req`: its status answered the id (ended), or
/// its spec carries the id (started), or neither.
fn hook_run(t: Option<&Task>, req: &TransitionRequest) -> hooks::Run {
    let Some(t) = t else {
        return hooks::Run::Idle;
    };
    let answered = t
        .status
        .as_ref()
        .and_then(|s| s.transition.as_ref())
        .filter(|tr| tr.id == req.id);
    match answered {
        Some(tr) if tr.phase == TransitionPhase::Failed => hooks::Run::Failed(tr.message.clone()),
        Some(tr) if tr.phase == TransitionPhase::Succeeded => hooks::Run::Succeeded,
        _ if t.spec.transition.as_ref().is_some_and(|x| x.id == req.id) => hooks::Run::Started,
        _ => hooks::Run::Idle,
    }
}

/// The transition a Task gets under the hook gate: once given it stays; plain tasks get it
/// when the gate releases them; hooks when the gate starts them, or at once when the
/// transition does not trigger them (they answer it without running).
fn gated_transition(
    r: &TaskRef,
    existing: Option<&Task>,
    req: &TransitionRequest,
    gate: &hooks::Gate,
    start: &HashSet<String>,
) -> Option<TransitionRequest> {
    let had = existing.and_then(|t| t.spec.transition.clone());
    let give = had.as_ref().is_some_and(|h| h.id == req.id)
        || if r.control_mode == ControlMode::Hook {
            start.contains(&r.name)
                || !hooks::in_transition(r.trigger.as_deref().unwrap_or(""), req.event)
        } else {
            gate.release_tasks
        };
    if give { Some(req.clone()) } else { had }
}

fn hook_transition_status(req: &TransitionRequest, outcome: &hooks::Outcome) -> TransitionStatus {
    let (phase, message) = match outcome {
        hooks::Outcome::Running(m) => (TransitionPhase::Running, m.clone()),
        hooks::Outcome::Succeeded { warnings } if warnings.is_empty() => {
            (TransitionPhase::Succeeded, String::new())
        }
        hooks::Outcome::Succeeded { warnings } => (
            TransitionPhase::Succeeded,
            format!("warning: {}", warnings.join("; ")),
        ),
        hooks::Outcome::Failed(m) => (TransitionPhase::Failed, m.clone()),
    };
    TransitionStatus {
        id: req.id.clone(),
        event: req.event,
        phase,
        message,
    }
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

/// Sets a condition; its lastTransitionTime changes only when its status does (no spinning).
pub fn set_condition(
    conds: &mut Vec<Condition>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let status = if ok { "True" } else { "False" };
    let time = match conds.iter().find(|c| c.type_ == type_) {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(jiff::Timestamp::now()),
    };
    let cond = Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: time,
    };
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(slot) => *slot = cond,
        None => conds.push(cond),
    }
}

/// Writes status (server-side apply) only when it differs from what is stored.
async fn write_status(
    ctx: &Ctx,
    api: &Api<Environment>,
    env: &Environment,
    old: &EnvironmentStatus,
    status: EnvironmentStatus,
) -> Result<()> {
    if &status == old {
        return Ok(());
    }
    let name = env.name_any();
    let patch =
        json!({"apiVersion": crate::crd::API_VERSION, "kind": "Environment", "status": status});
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let _ = ctx;
    api.patch_status(&name, &pp, &Patch::Apply(&patch))
        .await
        .map_err(|e| {
            Error::kube(
                "patch status of",
                "Environment",
                &env.namespace().unwrap_or_default(),
                &name,
                e,
            )
        })?;
    Ok(())
}

async fn publish_changes(
    ctx: &Ctx,
    env: &Environment,
    old: &EnvironmentStatus,
    new: &EnvironmentStatus,
) {
    let reference = env.object_ref(&());
    for (type_, reason, note) in status_events(old, new) {
        let ev = KEvent {
            type_,
            reason,
            note: Some(super::bounded::head(&note, 1000).to_string()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
            warn!(env = %env.name_any(), error = %e, "could not publish event");
        }
    }
}

/// The Events a status change deserves. The recorder folds events of equal reason into one
/// series, so the reason names the new state (`StateStandby`) or the transition outcome
/// (`ConfigureSucceeded`).
pub fn status_events(
    old: &EnvironmentStatus,
    new: &EnvironmentStatus,
) -> Vec<(EventType, String, String)> {
    let mut events = Vec::new();
    if old.state != new.state
        && let Some(state) = new.state
    {
        let from = old
            .state
            .map(|s| s.to_string())
            .unwrap_or_else(|| "none".into());
        let ready = new.ready.clone().unwrap_or_default();
        let reason = format!("State{}", pascal(state.as_str()));
        if state == State::Error {
            let names: Vec<String> = new
                .failing_tasks
                .iter()
                .filter(|f| f.critical)
                .map(|f| format!("{} ({})", f.name, f.message))
                .collect();
            events.push((
                EventType::Warning,
                reason,
                format!("{from} -> ERROR: {}", names.join("; ")),
            ));
        } else {
            events.push((
                EventType::Normal,
                reason,
                format!("{from} -> {state} (ready {ready})"),
            ));
        }
    }
    if let Some(tr) = &new.transition
        && old.transition.as_ref().map(|o| (&o.id, o.phase)) != Some((&tr.id, tr.phase))
    {
        use crate::crd::TransitionPhase::*;
        let (ty, outcome) = match tr.phase {
            Running => (EventType::Normal, "Running"),
            // Non-critical hook tasks failed: a warning.
            Succeeded if !tr.message.is_empty() => (EventType::Warning, "SucceededWithWarnings"),
            Succeeded => (EventType::Normal, "Succeeded"),
            Failed => (EventType::Warning, "Failed"),
        };
        let reason = format!("{}{outcome}", pascal(tr.event.as_str()));
        let note = if tr.message.is_empty() {
            format!("{} {}", tr.event, tr.id)
        } else {
            format!("{} {}: {}", tr.event, tr.id, tr.message)
        };
        events.push((ty, reason, note));
    }
    events
}

/// `GO_ERROR` -> `GoError`.
fn pascal(s: &str) -> String {
    s.split('_')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + &c.as_str().to_ascii_lowercase(),
                None => String::new(),
            }
        })
        .collect()
}

/// Deletes the environment's Tasks and waits until they, their Pods and Services are gone.
async fn finalize(env: &Environment, ctx: &Ctx) -> Result<Action> {
    let ns = env.namespace().unwrap_or_default();
    let name = env.name_any();
    // The calls triggered at DESTROY first (each bounded by its timeout); their failures are
    // reported, the destruction goes on.
    let uid = env.uid().unwrap_or_default();
    let at_destroy = env.spec.hooks.iter().filter(|c| {
        c.trigger
            .as_deref()
            .is_some_and(|t| hooks::parse_moment("trigger", t) == Ok(hooks::Moment::Destroy))
    });
    for c in at_destroy {
        match ctx.calls.run_of(&uid, calls::DESTROY, &c.path) {
            hooks::Run::Idle => ctx.calls.start_at(calls::DESTROY, &uid, &env.spec.id, c),
            hooks::Run::Failed(why) => {
                warn!(env = %name, call = %c.path, error = %why, "call at DESTROY failed")
            }
            _ => {}
        }
    }
    if ctx.calls.any_running(&uid, calls::DESTROY) {
        return Err(Error::Pending {
            what: format!("environment {ns}/{name}: calls at DESTROY running"),
            after: Duration::from_millis(200),
        });
    }
    let env_label = label_value(&name);
    let tasks: Vec<Arc<Task>> = ctx.tasks_of(&ns, &name);
    let task_api: Api<Task> = Api::namespaced(ctx.client.clone(), &ns);
    // Each Task deleted once: one whose deletion the store does not show yet (lag) is not
    // sent again at every reconcile.
    let to_delete: Vec<(String, String)> = tasks
        .iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none())
        .map(|t| (t.name_any(), t.uid().unwrap_or_default()))
        .filter(|(_, uid)| ctx.awaiting_store(TASK_DELETION, uid).is_none())
        .collect();
    stream::iter(to_delete)
        .map(|(t, uid)| {
            let api = task_api.clone();
            let ns = ns.clone();
            async move {
                delete_ignore_missing(&api, &t, "Task", &ns).await?;
                ctx.requested
                    .insert((TASK_DELETION, uid), std::time::Instant::now());
                Ok::<_, Error>(())
            }
        })
        .buffer_unordered(ctx.args.apply_concurrency.max(1))
        .try_for_each(|_| async { Ok(()) })
        .await?;
    let pods = ctx
        .pods
        .state()
        .iter()
        .filter(|p: &&Arc<StoredPod>| {
            p.namespace().as_deref() == Some(ns.as_str())
                && p.environment.as_deref() == Some(env_label.as_str())
        })
        .count();
    let svcs = ctx
        .services
        .state()
        .iter()
        .filter(|s: &&Arc<StoredService>| {
            s.namespace().as_deref() == Some(ns.as_str())
                && s.environment.as_deref() == Some(env_label.as_str())
        })
        .count();
    if !tasks.is_empty() || pods > 0 || svcs > 0 {
        info!(env = %name, tasks = tasks.len(), pods, services = svcs, "waiting for the environment's objects to go");
        return Err(Error::Pending {
            what: format!("environment {ns}/{name}: its objects going"),
            after: Duration::from_millis(500),
        });
    }
    ctx.calls.forget(&uid);
    ctx.status_written.remove(&uid);
    info!(env = %name, namespace = %ns, "environment cleaned up");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{FailingTask, TransitionPhase, TransitionStatus};
    use crate::state::Event;

    #[test]
    fn events_name_the_new_state_and_the_transition_outcome() {
        let old = EnvironmentStatus {
            state: Some(State::Mixed),
            ..Default::default()
        };
        let new = EnvironmentStatus {
            state: Some(State::Error),
            failing_tasks: vec![FailingTask {
                name: "t1".into(),
                critical: true,
                message: "boom".into(),
                ..Default::default()
            }],
            transition: Some(TransitionStatus {
                id: "x".into(),
                event: Event::GoError,
                phase: TransitionPhase::Failed,
                message: "m".into(),
            }),
            ..Default::default()
        };
        let ev = status_events(&old, &new);
        assert_eq!(ev[0].1, "StateError");
        assert_eq!(ev[0].2, "MIXED -> ERROR: t1 (boom)");
        assert_eq!(
            (ev[1].0, ev[1].1.as_str(), ev[1].2.as_str()),
            (EventType::Warning, "GoErrorFailed", "GO_ERROR x: m")
        );
        assert!(status_events(&new, &new).is_empty());
        let mut cond = Vec::new();
        set_condition(&mut cond, "A", true, "R", "m", Some(1));
        let t0 = cond[0].last_transition_time.clone();
        set_condition(&mut cond, "A", true, "R2", "m2", Some(2));
        assert_eq!(
            cond[0].last_transition_time, t0,
            "time kept while the status holds"
        );
        assert_eq!(cond[0].reason, "R2");
    }

    #[test]
    fn gated_transitions_are_given_once_and_kept() {
        let req = |id: &str| TransitionRequest {
            id: id.into(),
            event: Event::Configure,
            arguments: Default::default(),
        };
        let plain = TaskRef {
            name: "a".into(),
            ..Default::default()
        };
        let hook = TaskRef {
            name: "h".into(),
            control_mode: ControlMode::Hook,
            trigger: Some("before_CONFIGURE".into()),
            ..Default::default()
        };
        let held = hooks::Gate {
            start: vec![0],
            release_tasks: false,
            outcome: hooks::Outcome::Running(String::new()),
        };
        let start = HashSet::from(["h".to_string()]);
        let with = |tr: Option<TransitionRequest>| {
            let mut t = Task::new("a", Default::default());
            t.spec.transition = tr;
            t
        };
        let old = with(Some(req("old")));
        // Held back: the plain task keeps what it had; the started hook gets it.
        assert_eq!(
            gated_transition(&plain, Some(&old), &req("new"), &held, &start),
            Some(req("old"))
        );
        assert_eq!(
            gated_transition(&plain, None, &req("new"), &held, &start),
            None
        );
        assert_eq!(
            gated_transition(&hook, Some(&old), &req("new"), &held, &start),
            Some(req("new"))
        );
        assert_eq!(
            gated_transition(&hook, Some(&old), &req("new"), &held, &HashSet::new()),
            Some(req("old"))
        );
        // Once given, never taken back; released tasks get it.
        let given = with(Some(req("new")));
        assert_eq!(
            gated_transition(&plain, Some(&given), &req("new"), &held, &start),
            Some(req("new"))
        );
        let released = hooks::Gate {
            release_tasks: true,
            ..held.clone()
        };
        assert_eq!(
            gated_transition(&plain, Some(&old), &req("new"), &released, &start),
            Some(req("new"))
        );
        // A hook this transition does not trigger answers it at once.
        let start_hook = TaskRef {
            trigger: Some("before_START_ACTIVITY".into()),
            ..hook.clone()
        };
        assert_eq!(
            gated_transition(&start_hook, Some(&old), &req("new"), &held, &HashSet::new()),
            Some(req("new"))
        );
        let outcome = hooks::Outcome::Succeeded {
            warnings: vec!["hook task h: x".into()],
        };
        let st = hook_transition_status(&req("new"), &outcome);
        assert_eq!(
            (st.phase, st.message.as_str()),
            (TransitionPhase::Succeeded, "warning: hook task h: x")
        );
    }
}

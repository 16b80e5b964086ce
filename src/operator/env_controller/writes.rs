//! Writing an Environment's Tasks (applies, transition patches, deletes), a few at once,
//! with its progress shown while they go on.

use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use tracing::info;

use super::status::{own_tasks, summarize, write_status};
use crate::crd::{Environment, EnvironmentStatus, Task, TransitionRequest};
use crate::operator::context::Ctx;
use crate::operator::status_pace;
use crate::operator::task_patch::transition_patch;
use crate::operator::task_sets::{Found, TaskWrites, found_task};
use crate::operator::{Error, FIELD_MANAGER, Result, delete_ignore_missing, unread};
use crate::plan::TaskRef;

/// What a long write of Tasks shows meanwhile: the status so far, summarized again from
/// the Tasks as they stand.
pub(super) struct Progress<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) api: &'a Api<Environment>,
    pub(super) env: &'a Environment,
    pub(super) refs: &'a [&'a TaskRef],
    pub(super) has_hooks: bool,
    pub(super) status: &'a EnvironmentStatus,
    /// The status last written.
    pub(super) shown: EnvironmentStatus,
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
pub(super) const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// One write of a Task.
pub(super) enum TaskWrite {
    /// A new Task, created whole.
    Create(Box<Task>),
    /// A merge patch of an existing Task (`task_patch::update_patch`).
    Update(String, serde_json::Value),
    /// Its transition alone (`task_patch::transition_patch`).
    Transition(String, TransitionRequest),
}

pub(super) async fn write_task(api: Api<Task>, ns: String, w: TaskWrite) -> Result<()> {
    match w {
        TaskWrite::Create(t) => {
            let pp = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            match unread::create(&api, &pp, &t).await {
                Ok(()) => Ok(()),
                // There already, though the store did not show it as ours: made the wanted
                // Task now, since this reconcile will not compare it again.
                Err(kube::Error::Api(s)) if s.code == 409 => found(&api, &ns, *t).await,
                Err(e) => Err(Error::kube("create", "Task", &ns, &t.name_any(), e)),
            }
        }
        TaskWrite::Update(tname, patch) => update(&api, &ns, &tname, &patch).await,
        TaskWrite::Transition(tname, req) => transition(&api, &ns, &tname, &req).await,
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

async fn update(api: &Api<Task>, ns: &str, tname: &str, patch: &serde_json::Value) -> Result<()> {
    unread::patch(api, tname, &patch_params(), &Patch::Merge(patch))
        .await
        .map_err(|e| Error::kube("patch", "Task", ns, tname, e))
}

async fn transition(api: &Api<Task>, ns: &str, tname: &str, req: &TransitionRequest) -> Result<()> {
    let patch = Patch::<()>::Json(transition_patch(req));
    unread::patch(api, tname, &patch_params(), &patch)
        .await
        .map_err(|e| Error::kube("patch", "Task", ns, tname, e))
}

/// A create of `want` refused as a conflict: the Task there is read and, as `found_task`
/// decides, made the wanted one, waited for (still being deleted) or refused (another's).
async fn found(api: &Api<Task>, ns: &str, want: Task) -> Result<()> {
    let tname = want.name_any();
    let existing = match api.get_opt(&tname).await {
        Ok(Some(t)) => t,
        // Gone between the create and the read: the reconcile comes back to create it.
        Ok(None) => return Err(going(ns, &tname)),
        Err(e) => return Err(Error::kube("get", "Task", ns, &tname, e)),
    };
    match found_task(&existing, want) {
        Found::Write(w) => {
            if let Some((_, patch)) = w.update.first() {
                update(api, ns, &tname, patch).await?;
            } else if let Some((_, req)) = w.transition.first() {
                transition(api, ns, &tname, req).await?;
            }
            Ok(())
        }
        Found::Going => Err(going(ns, &tname)),
        Found::Taken { owner } => Err(Error::Taken {
            ns: ns.into(),
            name: tname,
            owner,
        }),
    }
}

/// The reconcile fails and comes back soon: its Tasks are not all created yet.
fn going(ns: &str, tname: &str) -> Error {
    Error::Pending {
        what: format!("Task {ns}/{tname}: an earlier Task of that name is being deleted"),
        after: Duration::from_millis(500),
    }
}

/// Writes (creates and patches, a few at once) and deletes what `task_writes` decided,
/// showing `progress` every [`PROGRESS_EVERY`] (or the environment's progress window, when
/// longer) while the writes go on.
pub(super) async fn write_tasks(
    ctx: &Ctx,
    ns: &str,
    env: &str,
    writes: TaskWrites,
    mut progress: Progress<'_>,
) -> Result<()> {
    let TaskWrites {
        create,
        update,
        transition,
        delete: stale,
    } = writes;
    let total = create.len() + update.len() + transition.len();
    let task_api: Api<Task> = Api::namespaced(ctx.client.clone(), ns);
    let writes = create
        .into_iter()
        .map(|t| TaskWrite::Create(Box::new(t)))
        .chain(update.into_iter().map(|(n, p)| TaskWrite::Update(n, p)))
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
    // One Task's name taken or still going leaves the others to be written; told after.
    let mut held = None;
    loop {
        tokio::select! {
            written = pending.next() => match written {
                Some(Err(e @ (Error::Taken { .. } | Error::Pending { .. }))) => {
                    held.get_or_insert(e);
                }
                Some(r) => r?,
                None => break,
            },
            _ = tick.tick() => progress.show().await?,
        }
    }
    for t in &stale {
        delete_ignore_missing(&task_api, t, "Task", ns).await?;
    }
    if total > 0 || !stale.is_empty() {
        info!(env = %env, namespace = %ns, written = total, deleted = stale.len(), "tasks written");
    }
    held.map_or(Ok(()), Err)
}

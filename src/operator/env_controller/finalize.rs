//! A deleted Environment: its Tasks deleted, then its pods and Services awaited until none
//! is left.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use crate::crd::{Environment, Task};
use crate::model::label::label_value;
use crate::operator::context::{Ctx, TASK_DELETION};
use crate::operator::stored_pod::StoredPod;
use crate::operator::stored_service::StoredService;
use crate::operator::{Error, Result, delete_ignore_missing};
use crate::operator::{calls, hooks};

/// Deletes the environment's Tasks and waits until they, their Pods and Services are gone.
pub(super) async fn finalize(env: &Environment, ctx: &Ctx) -> Result<Action> {
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
    // Every Task event of the teardown brings a pass here. Once the store shows each Task's
    // deletion, a pass counts what is left by the index: reading every Task, Pod and Service
    // of the environment at each of 10,000 events made the teardown's work grow with the
    // square of its tasks.
    let left = ctx.task_index.counts(&ns, &name);
    if left.deleting < left.stored {
        delete_tasks(ctx, &ns, &name).await?;
    }
    if left.stored > 0 {
        // Once a reconcile while they go: debug, not info.
        debug!(env = %name, tasks = left.stored, deleting = left.deleting, "waiting for the environment's tasks to go");
        return Err(Error::Pending {
            what: format!("environment {ns}/{name}: its tasks going"),
            after: Duration::from_millis(500),
        });
    }
    // No Task left, so none of their pods and Services either (a Task's own finalizer waits
    // for them); one labelled with the environment all the same (a Task's finalizer removed
    // by hand) is waited for.
    let env_label = label_value(&name);
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
    if pods > 0 || svcs > 0 {
        debug!(env = %name, pods, services = svcs, "waiting for the environment's objects to go");
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

/// Deletes the environment's Tasks the store does not show deleted yet, each once: one
/// deleted moments ago whose deletion the store does not show yet (lag) is not sent again.
async fn delete_tasks(ctx: &Ctx, ns: &str, env: &str) -> Result<()> {
    let task_api: Api<Task> = Api::namespaced(ctx.client.clone(), ns);
    let to_delete: Vec<(String, String)> = ctx
        .tasks_of(ns, env)
        .iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none())
        .map(|t| (t.name_any(), t.uid().unwrap_or_default()))
        .filter(|(_, uid)| ctx.awaiting_store(TASK_DELETION, uid).is_none())
        .collect();
    stream::iter(to_delete)
        .map(|(t, uid)| {
            let api = task_api.clone();
            async move {
                delete_ignore_missing(&api, &t, "Task", ns).await?;
                ctx.requested
                    .insert((TASK_DELETION, uid), std::time::Instant::now());
                Ok::<_, Error>(())
            }
        })
        .buffer_unordered(ctx.args.apply_concurrency.max(1))
        .try_for_each(|_| async { Ok(()) })
        .await
}

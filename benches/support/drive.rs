//! Driving an Environment object straight (no daemon): its deployment, a transition asked
//! on its spec, and a wait on its status.

use std::collections::BTreeMap;
use std::time::Duration;

use envbridge::crd::{Environment, EnvironmentStatus, TransitionPhase, TransitionRequest};
use envbridge::plan::TaskRef;
use envbridge::state::{Event, State};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;

use super::Res;

/// How long a wait on an Environment's status may take.
pub const TIMEOUT: Duration = Duration::from_secs(900);

/// Writes the TaskSets of `refs` and the Environment `env`, and waits until every task is
/// up in STANDBY.
pub async fn deploy_standby(admin: &Client, ns: &str, env: &str, refs: &[TaskRef]) -> Res {
    envbridge::dev::fixtures::deploy(
        admin,
        ns,
        env,
        refs,
        envbridge::plan::DEFAULT_TASK_SET_BUDGET,
        "envbridge-bench",
    )
    .await?;
    let total = refs.len();
    wait_env(admin, ns, env, |s| {
        s.state == Some(State::Standby) && s.ready.as_deref() == Some(&format!("{total}/{total}"))
    })
    .await
}

/// Asks `env` for `event` (transition id `id`), without arguments.
pub async fn transition(admin: &Client, ns: &str, env: &str, id: &str, event: Event) -> Res {
    let req = TransitionRequest {
        id: id.into(),
        event,
        arguments: BTreeMap::new(),
    };
    let patch = json!({"spec": {"transition": req, "desiredState": event.target()}});
    Api::<Environment>::namespaced(admin.clone(), ns)
        .patch(env, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Asks `env` for `event` and waits until the transition `id` has succeeded.
pub async fn transition_succeeded(
    admin: &Client,
    ns: &str,
    env: &str,
    id: &str,
    event: Event,
) -> Res {
    transition(admin, ns, env, id, event).await?;
    wait_env(admin, ns, env, |s| {
        s.transition
            .as_ref()
            .is_some_and(|t| t.id == id && t.phase == TransitionPhase::Succeeded)
    })
    .await
}

/// Waits (at most [`TIMEOUT`]) until `env`'s status meets `cond`.
pub async fn wait_env(
    admin: &Client,
    ns: &str,
    env: &str,
    cond: impl Fn(&EnvironmentStatus) -> bool,
) -> Res {
    let api: Api<Environment> = Api::namespaced(admin.clone(), ns);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={env}"));
    let mut w = watcher(api, cfg).applied_objects().boxed();
    loop {
        let e = tokio::time::timeout(TIMEOUT, w.try_next())
            .await??
            .ok_or("environment watch ended")?;
        if cond(&e.status.unwrap_or_default()) {
            return Ok(());
        }
    }
}

//! What the cluster holds beyond the roster: the ports of every TaskSet (an environment whose
//! Tasks the operator has not written yet, e.g. while it is down, still holds its ports), and
//! TaskSets a crashed create left without their Environment (swept, with the namespaces of
//! `sweep_namespaces`).

use std::sync::Arc;

use kube::api::{Api, DeleteParams, ListParams};
use tokio_util::sync::CancellationToken;

use super::detectors::HostsHeld;
use super::error::{BridgeError, Result, is_not_found};
use super::{Bridge, TakenPorts};
use crate::crd::{Environment, TaskSet};
use crate::roster::EnvKey;

/// How often the leader looks for orphaned TaskSets.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

impl Bridge {
    fn task_sets_api(&self) -> Api<TaskSet> {
        match &self.cfg.watch_namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// Ports that the TaskSets in the cluster hold, per node, and the environment holding each
    /// node, except environment `except`'s.
    pub async fn task_set_ports(&self, except: &EnvKey) -> Result<(TakenPorts, HostsHeld)> {
        let sets = self
            .task_sets_api()
            .list(&ListParams::default())
            .await
            .map_err(BridgeError::kube("list TaskSets"))?;
        let mut taken = TakenPorts::new();
        let mut held = HostsHeld::new();
        for set in &sets.items {
            let ns = set.metadata.namespace.as_deref().unwrap_or("");
            if ns == &*except.namespace && set.spec.environment == *except.name {
                continue;
            }
            // Only an environment the roster knows, not being deleted, holds its hosts' detectors:
            // a TaskSet outlives its environment's teardown by the garbage collector's delay,
            // and an orphan of a crashed create holds nothing.
            let key = EnvKey::new(ns, &set.spec.environment);
            let live = self.roster.env(&key).is_some_and(|e| !e.deleting);
            for t in &set.spec.tasks {
                taken.entry(t.node.clone()).or_default().extend(t.ports());
                if live {
                    held.entry(t.node.clone())
                        .or_insert_with(|| key.to_string());
                }
            }
        }
        Ok((taken, held))
    }

    /// Deletes TaskSets whose Environment does not exist and that are older than the
    /// orphan grace (a create writes its TaskSets first; one that crashed before writing the
    /// Environment left them). Runs under the create lock: never races a create.
    pub async fn sweep_orphans(&self) -> Result<usize> {
        self.ensure_leader()?;
        let _one_at_a_time = self.create_lock.lock().await;
        let api = self.task_sets_api();
        let sets = api
            .list(&ListParams::default())
            .await
            .map_err(BridgeError::kube("list TaskSets"))?;
        let now = jiff::Timestamp::now();
        let mut swept = 0;
        for set in &sets.items {
            let (Some(ns), Some(name)) = (&set.metadata.namespace, &set.metadata.name) else {
                continue;
            };
            // Only where this daemon writes: another daemon's creates are not under our lock.
            if !self.cfg.owns_namespace(ns)
                || age(&set.metadata, now) < self.cfg.orphan_grace
                || set.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            let envs: Api<Environment> = Api::namespaced(self.client.clone(), ns);
            match envs.get_opt(&set.spec.environment).await {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => {
                    return Err(BridgeError::kube(format!(
                        "get Environment {ns}/{}",
                        set.spec.environment
                    ))(e));
                }
            }
            let sets_ns: Api<TaskSet> = Api::namespaced(self.client.clone(), ns);
            match sets_ns.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(BridgeError::kube(format!("delete TaskSet {ns}/{name}"))(e)),
            }
            tracing::warn!(namespace = %ns, taskset = %name, environment = %set.spec.environment, "swept a TaskSet without its Environment (a create that did not finish)");
            swept += 1;
        }
        Ok(swept)
    }

    /// Sweeps at once and then every few minutes while this replica leads: TaskSets, then
    /// the per-environment namespaces left behind.
    pub async fn run_sweeps(self: &Arc<Self>, stop: CancellationToken) {
        loop {
            if self.is_leader() && self.synced.all() {
                if let Err(e) = self.sweep_orphans().await {
                    tracing::warn!(error = %e, "sweeping orphaned TaskSets");
                }
                if let Err(e) = self.sweep_left_namespaces().await {
                    tracing::warn!(error = %e, "sweeping namespaces left behind");
                }
            }
            let wait = if self.synced.all() {
                SWEEP_EVERY
            } else {
                std::time::Duration::from_secs(1)
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// How old an object is (zero without a creation time, or one in the future).
pub(super) fn age(meta: &kube::api::ObjectMeta, now: jiff::Timestamp) -> std::time::Duration {
    meta.creation_timestamp
        .as_ref()
        .and_then(|t| std::time::Duration::try_from(now.duration_since(t.0)).ok())
        .unwrap_or_default()
}

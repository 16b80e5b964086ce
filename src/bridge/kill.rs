//! Killing one task and destroying a whole environment.
//!
//! A killed task is taken out of the environment's desired set (a new TaskSet without it, the
//! Environment re-pointed) before its Task object is deleted, so that the operator does not
//! bring it back; the call returns once the task has left the roster.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use tokio::time::Instant;

use super::error::{BridgeError, Result, is_not_found};
use super::objects::{set_ref, task_set};
use super::{Bridge, namespace};
use crate::crd::{Environment, Task, TaskSet, labels};
use crate::roster::EnvKey;

impl Bridge {
    /// Deletes one task for good; returns whether it left the roster within the timeout.
    pub async fn kill_task(
        &self,
        env: &str,
        task: &str,
        timeout: Option<Duration>,
    ) -> Result<bool> {
        self.ensure_leader()?;
        let rec = self.resolve(env)?;
        let key = rec.key.clone();
        if self.roster.task(&key, task).is_none() {
            return Err(BridgeError::TaskNotFound {
                env: key.to_string(),
                task: task.into(),
            });
        }
        self.drop_from_sets(&key, task).await?;
        let tasks: Api<Task> = Api::namespaced(self.client.clone(), &key.namespace);
        match tasks.delete(task, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                return Err(BridgeError::kube(format!(
                    "delete Task {}/{task}",
                    key.namespace
                ))(e));
            }
        }
        let deadline = Instant::now() + timeout.unwrap_or(self.cfg.kill_timeout);
        let gone = self
            .roster
            .wait_until(deadline, |r| r.task(&key, task).is_none())
            .await;
        tracing::info!(environment = %key, task, gone, "task killed");
        Ok(gone)
    }

    /// Rewrites the TaskSet holding `task` without it and points the Environment at the result.
    async fn drop_from_sets(&self, key: &EnvKey, task: &str) -> Result<()> {
        let envs: Api<Environment> = Api::namespaced(self.client.clone(), &key.namespace);
        let sets: Api<TaskSet> = Api::namespaced(self.client.clone(), &key.namespace);
        let env = envs
            .get(&key.name)
            .await
            .map_err(BridgeError::kube(format!("get Environment {key}")))?;
        let pp = PatchParams::apply(&self.cfg.field_manager).force();
        let mut refs = Vec::new();
        let mut stale = Vec::new();
        let mut nodes = BTreeSet::new();
        let mut total = 0u32;
        for r in &env.spec.task_sets {
            let ts = sets
                .get(&r.name)
                .await
                .map_err(BridgeError::kube(format!("get TaskSet {}", r.name)))?;
            if !ts.spec.tasks.iter().any(|t| t.name == task) {
                nodes.extend(ts.spec.tasks.iter().map(|t| t.node.clone()));
                total += ts.spec.tasks.len() as u32;
                refs.push(r.clone());
                continue;
            }
            stale.push(r.name.clone());
            let kept: Vec<_> = ts
                .spec
                .tasks
                .into_iter()
                .filter(|t| t.name != task)
                .collect();
            if kept.is_empty() {
                continue;
            }
            nodes.extend(kept.iter().map(|t| t.node.clone()));
            total += kept.len() as u32;
            let mut new = task_set(&key.name, kept);
            new.metadata.namespace = Some(key.namespace.to_string());
            new.metadata.labels = ts.metadata.labels.clone();
            let name = new.metadata.name.clone().unwrap_or_default();
            sets.patch(&name, &pp, &Patch::Apply(&new))
                .await
                .map_err(BridgeError::kube(format!("apply TaskSet {name}")))?;
            refs.push(set_ref(&new));
        }
        if stale.is_empty() {
            return Ok(()); // not in any set (already dropped by an earlier kill)
        }
        let patch = serde_json::json!({ "spec": { "taskSets": refs, "tasks": total, "nodes": nodes.len() } });
        let merge = PatchParams {
            field_manager: Some(self.cfg.field_manager.clone()),
            ..PatchParams::default()
        };
        envs.patch(&key.name, &merge, &Patch::Merge(&patch))
            .await
            .map_err(BridgeError::kube(format!("update task sets of {key}")))?;
        for name in stale.iter().filter(|s| !refs.iter().any(|r| &r.name == *s)) {
            if let Err(e) = sets.delete(name, &DeleteParams::background()).await
                && !is_not_found(&e)
            {
                tracing::warn!(taskset = name, error = %e, "could not delete replaced TaskSet");
            }
        }
        Ok(())
    }

    /// Deletes an environment (the operator's finalizer removes its Tasks and Pods). With
    /// `wait`, returns once its Tasks and Pods are gone (true) or the timeout passed (false).
    /// Its own namespace, when it has one, is deleted last and not waited for.
    pub async fn destroy(&self, env: &str, wait: bool, timeout: Option<Duration>) -> Result<bool> {
        self.ensure_leader()?;
        let rec = self.resolve(env)?;
        let key = rec.key.clone();
        let ns = key.namespace.to_string();
        let envs: Api<Environment> = Api::namespaced(self.client.clone(), &ns);
        match envs.delete(&key.name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(BridgeError::kube(format!("delete Environment {key}"))(e)),
        }
        let by_env = ListParams::default().labels(&format!("{}={}", labels::ENVIRONMENT, key.name));
        let sets: Api<TaskSet> = Api::namespaced(self.client.clone(), &ns);
        if let Err(e) = sets
            .delete_collection(&DeleteParams::background(), &by_env)
            .await
        {
            tracing::warn!(environment = %key, error = %e, "could not delete TaskSets");
        }
        self.reserved.remove(&key);
        let mut gone = true;
        if wait {
            let deadline = Instant::now() + timeout.unwrap_or(self.cfg.destroy_timeout);
            gone = self
                .roster
                .wait_until(deadline, |r| {
                    r.env(&key).is_none() && r.tasks_of(&key).is_empty()
                })
                .await;
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            while gone {
                match pods.list_metadata(&by_env.clone().limit(1)).await {
                    Ok(l) if l.items.is_empty() => break,
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "pod list failed"),
                }
                if Instant::now() >= deadline {
                    gone = false;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if self.cfg.per_env_namespace() {
            namespace::delete(&self.client, &ns, &key.name).await?;
        }
        tracing::info!(environment = %key, gone, "environment destroyed");
        Ok(gone)
    }
}

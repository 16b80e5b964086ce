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

    /// Re-packs the environment's tasks without `task` (the render's packer: sets before it
    /// keep their names, the rest are written anew), points the Environment at the result and
    /// deletes the sets it no longer names. An environment packed under an older scheme is
    /// re-packed under the one scheme.
    async fn drop_from_sets(&self, key: &EnvKey, task: &str) -> Result<()> {
        let envs: Api<Environment> = Api::namespaced(self.client.clone(), &key.namespace);
        let sets: Api<TaskSet> = Api::namespaced(self.client.clone(), &key.namespace);
        let env = envs
            .get(&key.name)
            .await
            .map_err(BridgeError::kube(format!("get Environment {key}")))?;
        let mut kept = Vec::new();
        let mut found = false;
        for r in &env.spec.task_sets {
            let ts = sets
                .get(&r.name)
                .await
                .map_err(BridgeError::kube(format!("get TaskSet {}", r.name)))?;
            for t in ts.spec.tasks {
                if t.name == task {
                    found = true;
                } else {
                    kept.push(t);
                }
            }
        }
        if !found {
            return Ok(()); // not in any set (already dropped by an earlier kill)
        }
        let mut objs = crate::objects::pack(&key.name, &env.spec.id, &env.spec.workflow, kept);
        // The re-packed sets stay in the environment's shard, whoever created it.
        objs.place(
            &key.namespace,
            crate::crd::shard::of(kube::ResourceExt::labels(&env)),
        );
        let old: BTreeSet<&str> = env.spec.task_sets.iter().map(|r| r.name.as_str()).collect();
        let pp = PatchParams::apply(&self.cfg.field_manager).force();
        for ts in &objs.task_sets {
            let name = ts.metadata.name.clone().unwrap_or_default();
            if old.contains(name.as_str()) {
                continue; // same index, same content: already there
            }
            self.ensure_leader()?;
            sets.patch(&name, &pp, &Patch::Apply(ts))
                .await
                .map_err(BridgeError::kube(format!("apply TaskSet {name}")))?;
        }
        let spec = &objs.environment.spec;
        let patch = serde_json::json!({ "spec": {
            "taskSets": spec.task_sets, "tasks": spec.tasks, "nodes": spec.nodes } });
        let merge = PatchParams {
            field_manager: Some(self.cfg.field_manager.clone()),
            ..PatchParams::default()
        };
        self.ensure_leader()?;
        envs.patch(&key.name, &merge, &Patch::Merge(&patch))
            .await
            .map_err(BridgeError::kube(format!("update task sets of {key}")))?;
        let now: BTreeSet<&str> = spec.task_sets.iter().map(|r| r.name.as_str()).collect();
        for name in old.difference(&now) {
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
        let rec = match self.resolve(env) {
            Err(BridgeError::NotFound(_)) if self.cfg.per_env_namespace() => {
                return self.destroy_leftover(env).await;
            }
            found => found?,
        };
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

    /// A destroy of an environment already gone, whose own namespace may be left: the
    /// destroy that deleted the Environment ends by deleting it, and its daemon may have been
    /// killed while it waited (fault run seed 1207, round 8); the caller's retry finds no
    /// Environment. The namespace goes now if it is ours and the cluster shows no Environment
    /// in it (the roster may lag: the cluster is asked); NotFound otherwise, as before.
    async fn destroy_leftover(&self, env: &str) -> Result<bool> {
        let (ns, name) = match env.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => {
                let name = crate::plan::names::environment_name(env);
                (self.cfg.namespace_for(&name), name)
            }
        };
        // Not while a create (of this very environment, maybe) prepares its namespace.
        let _no_create = self.create_lock.lock().await;
        let envs: Api<Environment> = Api::namespaced(self.client.clone(), &ns);
        let held = match envs.list_metadata(&ListParams::default().limit(1)).await {
            Ok(held) => held,
            // No such namespace name can exist (an id no environment ever had).
            Err(kube::Error::Api(s)) if (400..500).contains(&s.code) => {
                return Err(BridgeError::NotFound(env.into()));
            }
            Err(e) => return Err(BridgeError::kube(format!("list Environments in {ns}"))(e)),
        };
        if !held.items.is_empty() || !namespace::delete(&self.client, &ns, &name).await? {
            return Err(BridgeError::NotFound(env.into()));
        }
        tracing::info!(environment = %env, namespace = %ns, "environment already gone: its namespace deleted");
        Ok(true)
    }
}

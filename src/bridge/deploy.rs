//! CreateEnvironment: resolve the id, render, validate, prepare the namespace, then apply
//! TaskSets before the Environment naming them (server-side apply, named field manager).
//!
//! Idempotent: the environment's name derives from its id, and the id from the request's
//! idempotency key (or an explicit id); a retried create finds the existing Environment and
//! returns it instead of making a second one.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::error::{BridgeError, Result, is_not_found};
use super::{Bridge, CreateSpec, caller, namespace, validate};
use crate::crd::{Environment, TaskSet};
use crate::objects::Objects;
use crate::roster::EnvKey;

/// TaskSets written at once by a create.
const TASK_SET_WRITES: usize = 8;

/// The outcome of a create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    pub id: String,
    pub namespace: String,
    pub name: String,
    pub nodes: u32,
    pub tasks: u32,
    /// False when the environment already existed (a retried create).
    pub created: bool,
}

/// An environment id: the explicit one, else derived from the idempotency key, else random.
/// Lowercase base32 so that it is a valid object and namespace name.
pub fn environment_id(spec: &CreateSpec) -> Result<String> {
    if let Some(id) = spec.env_id.as_deref().filter(|s| !s.is_empty()) {
        if !validate::dns_label(id) || id.len() > 40 {
            return Err(BridgeError::Invalid(vec![format!(
                "environment id {id:?} must be lowercase alphanumerics and '-', at most 40 characters"
            )]));
        }
        return Ok(id.to_string());
    }
    let seed = match spec.idempotency_key.as_deref().filter(|s| !s.is_empty()) {
        Some(key) => Sha256::digest(key.as_bytes()).to_vec(),
        None => uuid::Uuid::new_v4().as_bytes().to_vec(),
    };
    Ok(format!("e{}", base32(&seed[..8])))
}

fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = String::new();
    for b in bytes {
        bits = (bits << 8) | u32::from(*b);
        n += 8;
        while n >= 5 {
            n -= 5;
            out.push(ALPHABET[((bits >> n) & 31) as usize] as char);
        }
    }
    out
}

/// The most a create's variables may weigh in all: they are kept on the Environment.
const MAX_VARIABLES_BYTES: usize = 256 * 1024;

impl Bridge {
    /// Renders and applies a new environment (see the module doc).
    pub async fn create(&self, spec: &CreateSpec) -> Result<Created> {
        self.ensure_leader()?;
        let id = environment_id(spec)?;
        let size: usize = spec.variables.iter().map(|(k, v)| k.len() + v.len()).sum();
        if size > MAX_VARIABLES_BYTES {
            return Err(BridgeError::Invalid(vec![format!(
                "variables: {size} bytes in all, at most {MAX_VARIABLES_BYTES} (they are kept on the Environment object)"
            )]));
        }
        let description = self.check_caller_vars(spec)?;
        let name = crate::plan::names::environment_name(&id);
        let ns = self.cfg.namespace_for(&name);
        let _one_at_a_time = self.create_lock.lock().await;

        let envs: Api<Environment> = Api::namespaced(self.client.clone(), &ns);
        if let Some(existing) = self.existing(&envs, &name).await? {
            return Ok(created_from(&existing, &ns, false));
        }
        let key = EnvKey::new(&ns, &name);
        // The roster's ports, and those of every TaskSet in the cluster: an environment whose
        // Tasks the operator has not written (it may be down) holds its ports all the same.
        let mut taken = self.taken_ports(Some(&key));
        let (in_sets, held) = self.task_set_ports(&key).await?;
        for (node, ports) in in_sets {
            taken.entry(node).or_default().extend(ports);
        }
        let mut objs = self.render_bounded(spec, &id, &taken).await?;
        self.check_caller_render(spec, &id, &taken, &objs).await?;
        self.check_detectors(&objs, held)?;
        // The caller's variables stay on the Environment: the anchor's clients show them.
        objs.environment.spec.variables = spec.variables.clone();
        objs.environment.spec.description = description;
        self.apply(objs, &ns, &taken).await
    }

    /// One environment per detector (`bridge::detectors`), over the store's inventory; a
    /// store that does not load was already reported by the render.
    fn check_detectors(&self, objs: &Objects, mut held: super::detectors::HostsHeld) -> Result<()> {
        let Ok(store) = self.store() else {
            return Ok(());
        };
        let me = objs.name();
        // Besides the TaskSets: the roster's live tasks, and environments created here whose
        // Tasks the roster does not show yet.
        for e in self.roster.envs() {
            if e.deleting || *e.key.name == *me {
                continue;
            }
            for t in self.roster.tasks_of(&e.key) {
                held.entry(t.node.to_string())
                    .or_insert_with(|| e.key.to_string());
            }
        }
        for r in self.reserved.iter() {
            if *r.key().name != *me {
                for node in r.value().keys() {
                    held.entry(node.clone())
                        .or_insert_with(|| r.key().to_string());
                }
            }
        }
        let hosts: std::collections::BTreeSet<&str> =
            objs.tasks().map(|t| t.node.as_str()).collect();
        super::detectors::check(hosts, &held, |h| store.detector_for_host(h).ok())
    }

    /// What a caller asked, before anything is rendered: only `hosts`, the workflow's public
    /// variables (with fitting values) and the site's allow-list, within the hosts quota.
    fn check_caller_vars(&self, spec: &CreateSpec) -> Result<Option<String>> {
        let path = super::render::workflow_file(&self.cfg, &spec.workflow)?;
        let (declared, description) = match crate::workflow::load::load_workflow(&path) {
            Ok(wf) => (crate::workflow::public::declared(&wf), wf.description),
            // The render reports a workflow that does not load, with its location.
            Err(_) => (Vec::new(), None),
        };
        // The site's allow-listed variables are an admin's.
        let mut policy = self.cfg.caller.clone();
        if !spec.site_variables {
            policy.allowed.clear();
        }
        let problems = caller::check(&policy, &spec.workflow, &declared, &spec.variables);
        if problems.is_empty() {
            Ok(description)
        } else {
            Err(BridgeError::Invalid(problems))
        }
    }

    /// What the render of a caller's request gives: within the tasks quota, no caller value
    /// with shell syntax in a shell command line, commands and TaskTemplates unchanged by
    /// the caller's public variables, and every host on a Node carrying the host label.
    async fn check_caller_render(
        &self,
        spec: &CreateSpec,
        id: &str,
        taken: &super::TakenPorts,
        objs: &Objects,
    ) -> Result<()> {
        let tasks = || objs.task_sets.iter().flat_map(|s| s.spec.tasks.iter());
        let mut problems = Vec::new();
        let count = tasks().count();
        if count > self.cfg.caller.max_tasks {
            problems.push(format!(
                "the environment has {count} tasks; this site allows at most {} per environment",
                self.cfg.caller.max_tasks
            ));
        }
        problems.extend(caller::shell_problems(&spec.variables, tasks()));
        let public: Vec<&str> = spec
            .variables
            .keys()
            .map(String::as_str)
            .filter(|k| {
                *k != caller::HOSTS
                    && !(spec.site_variables && self.cfg.caller.allowed.contains(*k))
            })
            .collect();
        if !public.is_empty() {
            let mut base = spec.clone();
            base.variables.retain(|k, _| !public.contains(&k.as_str()));
            // A workflow that needs the public variable to render at all gives nothing to
            // compare with: its author declared it for callers.
            if let Ok(b) = self.render_bounded(&base, id, taken).await {
                let without = b.task_sets.iter().flat_map(|s| s.spec.tasks.iter());
                problems.extend(caller::command_changes(tasks(), without, &public));
            }
        }
        let labelled = self.labelled_hosts().await?;
        problems.extend(caller::unlabelled_hosts(tasks(), &labelled));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(BridgeError::Invalid(problems))
        }
    }

    /// The values of the host label on the cluster's Nodes (one metadata list).
    async fn labelled_hosts(&self) -> Result<std::collections::BTreeSet<String>> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let list = nodes
            .list_metadata(&kube::api::ListParams::default().labels(crate::crd::labels::HOST))
            .await
            .map_err(BridgeError::kube("list Nodes"))?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|n| n.metadata.labels?.get(crate::crd::labels::HOST).cloned())
            .collect())
    }

    /// Renders off the async runtime, within the render deadline: a runaway render is an
    /// error naming the deadline, and the daemon keeps answering meanwhile.
    async fn render_bounded(
        &self,
        spec: &CreateSpec,
        id: &str,
        taken: &super::TakenPorts,
    ) -> Result<Objects> {
        let renderer = self.renderer.clone();
        let (spec, id, taken) = (spec.clone(), id.to_string(), taken.clone());
        let deadline = self.cfg.render_deadline;
        let job = tokio::task::spawn_blocking(move || renderer(&spec, &id, &taken));
        match tokio::time::timeout(deadline, job).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(BridgeError::Render(format!("the render stopped: {e}"))),
            Err(_) => Err(BridgeError::Render(format!(
                "the render took longer than {deadline:?} and was abandoned (a runaway expression?)"
            ))),
        }
    }

    /// Validates and applies already-rendered objects in `ns` (creates the namespace when
    /// environments have their own). Nothing is written when validation fails.
    pub async fn apply(
        &self,
        mut objs: Objects,
        ns: &str,
        taken: &super::TakenPorts,
    ) -> Result<Created> {
        self.ensure_leader()?;
        let name = objs.name();
        let mut problems = validate::static_problems(&objs, ns, taken);
        let templates = validate::fetch_templates(&self.client, &objs).await?;
        problems.extend(validate::template_problems(&objs, &templates));
        if !problems.is_empty() {
            return Err(BridgeError::Invalid(problems));
        }
        if self.cfg.per_env_namespace() {
            let level = namespace::pod_security_level(templates.values().flatten());
            namespace::prepare(&self.client, &self.cfg, ns, &name, level).await?;
        } else {
            namespace::ensure_exists(&self.client, ns).await?;
        }
        namespace::grant_operator(&self.client, &self.cfg, ns).await?;
        objs.place(ns, self.cfg.shard.as_deref());
        let pp = PatchParams::apply(&self.cfg.field_manager).force();
        let sets: Api<TaskSet> = Api::namespaced(self.client.clone(), ns);
        // Independent objects: a few at once (a large environment has tens of TaskSets).
        // Each write checks the lease first: a replica that lost it stops writing at once,
        // mid-create (what it wrote is swept: `sweep`).
        let writes: Vec<_> = objs
            .task_sets
            .iter()
            .map(|ts| async {
                self.ensure_leader()?;
                apply_task_set(&sets, &pp, ts).await
            })
            .collect();
        futures::stream::iter(writes)
            .buffer_unordered(TASK_SET_WRITES)
            .try_collect::<Vec<_>>()
            .await?;
        if !self.cfg.hold_before_environment_write.is_zero() {
            tracing::warn!(hold = ?self.cfg.hold_before_environment_write, environment = name, "test hook: holding before the Environment write");
            tokio::time::sleep(self.cfg.hold_before_environment_write).await;
        }
        self.ensure_leader()?;
        let envs: Api<Environment> = Api::namespaced(self.client.clone(), ns);
        let env = envs
            .patch(&name, &pp, &Patch::Apply(&objs.environment))
            .await
            .map_err(BridgeError::kube(format!("apply Environment {ns}/{name}")))?;
        self.reserved
            .insert(EnvKey::new(ns, &name), objs.ports.clone());
        tracing::info!(
            namespace = ns,
            environment = name,
            tasks = env.spec.tasks,
            "environment applied"
        );
        Ok(created_from(&env, ns, true))
    }

    /// The live Environment of that name, if any. One being deleted is waited out first
    /// (destroy then re-create under the same name).
    async fn existing(&self, envs: &Api<Environment>, name: &str) -> Result<Option<Environment>> {
        let deadline = Instant::now() + self.cfg.destroy_timeout;
        loop {
            let got = match envs.get_opt(name).await {
                Ok(got) => got,
                Err(e) if is_not_found(&e) => None,
                Err(e) => return Err(BridgeError::kube(format!("get Environment {name}"))(e)),
            };
            match got {
                Some(env) if env.metadata.deletion_timestamp.is_some() => {
                    if Instant::now() >= deadline {
                        return Err(BridgeError::Timeout {
                            what: format!("environment {name} still being deleted"),
                            after: self.cfg.destroy_timeout,
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => return Ok(other),
            }
        }
    }
}

async fn apply_task_set(sets: &Api<TaskSet>, pp: &PatchParams, ts: &TaskSet) -> Result<()> {
    let name = ts.metadata.name.clone().unwrap_or_default();
    let ns = ts.metadata.namespace.clone().unwrap_or_default();
    sets.patch(&name, pp, &Patch::Apply(ts))
        .await
        .map_err(BridgeError::kube(format!("apply TaskSet {ns}/{name}")))?;
    Ok(())
}

fn created_from(env: &Environment, ns: &str, created: bool) -> Created {
    Created {
        id: env.spec.id.clone(),
        namespace: ns.to_string(),
        name: env.metadata.name.clone().unwrap_or_default(),
        nodes: env.spec.nodes,
        tasks: env.spec.tasks,
        created,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_deterministic_per_key_and_valid_names() {
        let k = |key: &str| CreateSpec {
            idempotency_key: Some(key.into()),
            ..CreateSpec::default()
        };
        let a = environment_id(&k("run-42")).unwrap();
        assert_eq!(a, environment_id(&k("run-42")).unwrap());
        assert_ne!(a, environment_id(&k("run-43")).unwrap());
        assert!(validate::dns_label(&a), "{a}");
        let r1 = environment_id(&CreateSpec::default()).unwrap();
        let r2 = environment_id(&CreateSpec::default()).unwrap();
        assert_ne!(r1, r2);
        let explicit = CreateSpec {
            env_id: Some("Bad".into()),
            ..CreateSpec::default()
        };
        assert!(matches!(
            environment_id(&explicit),
            Err(BridgeError::Invalid(_))
        ));
    }
}

//! Per-environment namespaces: Terminating -> wait for 404 -> create -> wait for Active.
//!
//! Each wait has its own timeout (a namespace whose pods have long grace periods can take
//! minutes to go). A namespace that exists, is not terminating and is not ours is an error.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use tokio::time::Instant;

use super::config::BridgeConfig;
use super::error::{BridgeError, Result, is_conflict, is_not_found};
use crate::crd::labels;

const POLL: Duration = Duration::from_millis(200);

pub(super) fn ours(ns: &Namespace, env_name: &str) -> bool {
    let l = ns.metadata.labels.as_ref();
    let get = |k: &str| l.and_then(|l| l.get(k)).map(String::as_str);
    get(labels::MANAGED_BY) == Some(labels::MANAGER) && get(labels::ENVIRONMENT) == Some(env_name)
}

pub(super) fn terminating(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_some()
        || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating")
}

fn active(ns: &Namespace) -> bool {
    ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Active")
}

/// Makes `name` an Active namespace owned by environment `env_name`.
pub async fn prepare(
    client: &kube::Client,
    cfg: &BridgeConfig,
    name: &str,
    env_name: &str,
    pod_security: &str,
) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let err = |message: String| BridgeError::Namespace {
        namespace: name.to_string(),
        message,
    };
    // A create can race with another writer; a few rounds settle it.
    for _ in 0..3 {
        match api
            .get_opt(name)
            .await
            .map_err(BridgeError::kube(format!("get namespace {name}")))?
        {
            Some(ns) if terminating(&ns) => {
                tracing::info!(
                    namespace = name,
                    "namespace terminating, waiting for it to be gone"
                );
                wait_gone(&api, name, cfg.namespace_gone_timeout).await?;
            }
            Some(ns) if ours(&ns, env_name) => {
                return wait_active(&api, name, cfg.namespace_active_timeout).await;
            }
            Some(_) => {
                return Err(err(format!(
                    "exists and does not belong to environment {env_name} (not labelled {}={}); use another name",
                    labels::ENVIRONMENT,
                    env_name
                )));
            }
            None => {}
        }
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(BTreeMap::from([
                    (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
                    (labels::ENVIRONMENT.to_string(), env_name.to_string()),
                    // Pod Security admission: exactly what the environment's templates need.
                    (PSA_ENFORCE.to_string(), pod_security.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => return wait_active(&api, name, cfg.namespace_active_timeout).await,
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(BridgeError::kube(format!("create namespace {name}"))(e)),
        }
    }
    Err(err("kept changing while being prepared".into()))
}

async fn wait_gone(api: &Api<Namespace>, name: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match api.get_opt(name).await {
            Ok(None) => return Ok(()),
            Ok(Some(_)) => {}
            Err(e) if is_not_found(&e) => return Ok(()),
            // The apiserver may be briefly away; keep trying until the deadline.
            Err(e) => tracing::debug!(namespace = name, error = %e, "namespace poll failed"),
        }
        if Instant::now() >= deadline {
            return Err(BridgeError::Timeout {
                what: format!("namespace {name} still terminating"),
                after: timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn wait_active(api: &Api<Namespace>, name: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match api.get_opt(name).await {
            Ok(Some(ns)) if active(&ns) => return Ok(()),
            Ok(_) => {}
            Err(e) => tracing::debug!(namespace = name, error = %e, "namespace poll failed"),
        }
        if Instant::now() >= deadline {
            return Err(BridgeError::Timeout {
                what: format!("namespace {name} not Active"),
                after: timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Deletes the namespace if it is ours and not going already (does not wait: a re-create
/// waits for it instead); true when it was deleted now.
pub async fn delete(client: &kube::Client, name: &str, env_name: &str) -> Result<bool> {
    let api: Api<Namespace> = Api::all(client.clone());
    match api
        .get_opt(name)
        .await
        .map_err(BridgeError::kube(format!("get namespace {name}")))?
    {
        Some(ns) if ours(&ns, env_name) && !terminating(&ns) => {
            // Exactly the namespace that was checked: a namespace re-created under the same
            // name in between (someone else's) has another uid and is not deleted.
            let mut dp = DeleteParams::background();
            dp.preconditions = Some(kube::api::Preconditions {
                uid: ns.metadata.uid.clone(),
                resource_version: None,
            });
            match api.delete(name, &dp).await {
                Ok(_) => Ok(true),
                Err(e) if is_not_found(&e) => Ok(false),
                // The uid precondition failed: not the namespace that was checked.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(BridgeError::kube(format!("delete namespace {name}"))(e)),
            }
        }
        _ => Ok(false),
    }
}

/// The fixed namespace of every environment: created when missing, used as it is otherwise.
pub async fn ensure_exists(client: &kube::Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    if api
        .get_opt(name)
        .await
        .map_err(BridgeError::kube(format!("get namespace {name}")))?
        .is_some()
    {
        return Ok(());
    }
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                labels::MANAGED_BY.to_string(),
                labels::MANAGER.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(e) if is_conflict(&e) => Ok(()),
        Err(e) => Err(BridgeError::kube(format!("create namespace {name}"))(e)),
    }
}

/// The ClusterRole that lets the operator write pods and services, granted per namespace.
pub const WORKLOADS_ROLE: &str = "envbridge-operator-workloads";

/// Grants the operator's ServiceAccount the workloads role in `ns` (a RoleBinding, applied):
/// the operator writes pods and services only where envbridge puts environments. A refusal
/// (the daemon may not bind the role) is logged: a site may grant it otherwise.
pub async fn grant_operator(client: &kube::Client, cfg: &BridgeConfig, ns: &str) -> Result<()> {
    use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
    let Some((sa_ns, sa)) = &cfg.operator_account else {
        return Ok(());
    };
    let rb = RoleBinding {
        metadata: ObjectMeta {
            name: Some(WORKLOADS_ROLE.to_string()),
            namespace: Some(ns.to_string()),
            labels: Some(BTreeMap::from([(
                labels::MANAGED_BY.to_string(),
                labels::MANAGER.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: WORKLOADS_ROLE.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.clone(),
            namespace: Some(sa_ns.clone()),
            ..Subject::default()
        }]),
    };
    let api: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    let pp = kube::api::PatchParams::apply(&cfg.field_manager).force();
    match api
        .patch(WORKLOADS_ROLE, &pp, &kube::api::Patch::Apply(&rb))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            tracing::warn!(namespace = ns, reason = %s.message, "could not grant the operator the workloads role here");
            Ok(())
        }
        Err(e) => Err(BridgeError::kube(format!(
            "apply RoleBinding {ns}/{WORKLOADS_ROLE}"
        ))(e)),
    }
}

/// Pod Security admission's enforcement label.
pub const PSA_ENFORCE: &str = "pod-security.kubernetes.io/enforce";

/// The Pod Security level a set of TaskTemplates needs: `privileged` when one uses the host's
/// network, IPC or PID namespaces, host paths or privileged containers; else `baseline`.
pub fn pod_security_level<'a>(
    templates: impl IntoIterator<Item = &'a crate::crd::TaskTemplateSpec>,
) -> &'static str {
    let privileged = templates.into_iter().any(|t| {
        let p = &t.pod;
        p.host_network == Some(true)
            || p.host_ipc == Some(true)
            || p.host_pid == Some(true)
            || p.volumes.iter().flatten().any(|v| v.host_path.is_some())
            || p.containers
                .iter()
                .chain(p.init_containers.iter().flatten())
                .any(|c| {
                    c.security_context
                        .as_ref()
                        .is_some_and(|s| s.privileged == Some(true))
                })
    });
    if privileged { "privileged" } else { "baseline" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_security_level_follows_the_templates() {
        let mut t = crate::crd::TaskTemplateSpec::default();
        assert_eq!(pod_security_level([&t]), "baseline");
        t.pod.host_network = Some(true);
        assert_eq!(pod_security_level([&t]), "privileged");
    }
}

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

fn ours(ns: &Namespace, env_name: &str) -> bool {
    let l = ns.metadata.labels.as_ref();
    let get = |k: &str| l.and_then(|l| l.get(k)).map(String::as_str);
    get(labels::MANAGED_BY) == Some(labels::MANAGER) && get(labels::ENVIRONMENT) == Some(env_name)
}

fn terminating(ns: &Namespace) -> bool {
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

/// Deletes the namespace if it is ours (does not wait: a re-create waits for it instead).
pub async fn delete(client: &kube::Client, name: &str, env_name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    match api
        .get_opt(name)
        .await
        .map_err(BridgeError::kube(format!("get namespace {name}")))?
    {
        Some(ns) if ours(&ns, env_name) && !terminating(&ns) => {
            match api.delete(name, &DeleteParams::background()).await {
                Ok(_) => Ok(()),
                Err(e) if is_not_found(&e) => Ok(()),
                Err(e) => Err(BridgeError::kube(format!("delete namespace {name}"))(e)),
            }
        }
        _ => Ok(()),
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

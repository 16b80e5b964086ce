//! Per-environment namespaces whose environment is gone and that nothing will delete: a
//! destroy killed after deleting the Environment (the namespace goes at its end) that no caller
//! retries, a create killed after preparing its namespace and before writing the Environment.
//! The leader deletes them with its TaskSet sweep.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};

use super::error::{BridgeError, Result};
use super::{Bridge, namespace, sweep};
use crate::crd::{Environment, labels};

/// The namespaces among `all` that may be left behind: an environment's own under `prefix`
/// (labelled as ours, named `prefix` + the environment of its label), not going already, and
/// at least `grace` old (a create writes its Environment just after preparing the namespace).
/// Each with its environment's name. Whether an Environment is still in one, the cluster says.
pub fn candidates(
    all: &[Namespace],
    prefix: &str,
    now: jiff::Timestamp,
    grace: Duration,
) -> Vec<(String, String)> {
    all.iter()
        .filter_map(|ns| {
            let name = ns.metadata.name.as_deref()?;
            let env = ns.metadata.labels.as_ref()?.get(labels::ENVIRONMENT)?;
            let own = name.strip_prefix(prefix) == Some(env.as_str())
                && namespace::ours(ns, env)
                && !namespace::terminating(ns);
            (own && sweep::age(&ns.metadata, now) >= grace).then(|| (name.into(), env.clone()))
        })
        .collect()
}

impl Bridge {
    /// Deletes this daemon's per-environment namespaces that hold no Environment and are older
    /// than the orphan grace. Under the create lock: never races a create of this daemon.
    pub async fn sweep_left_namespaces(&self) -> Result<usize> {
        let super::config::NamespaceMode::PerEnvironment { prefix } = &self.cfg.namespaces else {
            return Ok(0);
        };
        self.ensure_leader()?;
        let _one_at_a_time = self.create_lock.lock().await;
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ours = ListParams::default().labels(&format!(
            "{}={},{}",
            labels::MANAGED_BY,
            labels::MANAGER,
            labels::ENVIRONMENT
        ));
        let all = api
            .list(&ours)
            .await
            .map_err(BridgeError::kube("list namespaces"))?;
        let now = jiff::Timestamp::now();
        let mut swept = 0;
        for (ns, env) in candidates(&all.items, prefix, now, self.cfg.orphan_grace) {
            let envs: Api<Environment> = Api::namespaced(self.client.clone(), &ns);
            let held = envs
                .list_metadata(&ListParams::default().limit(1))
                .await
                .map_err(BridgeError::kube(format!("list Environments in {ns}")))?;
            if !held.items.is_empty() || !namespace::delete(&self.client, &ns, &env).await? {
                continue;
            }
            tracing::warn!(namespace = %ns, environment = %env, "swept a namespace without its Environment (a destroy or create that did not finish)");
            swept += 1;
        }
        Ok(swept)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    use super::*;

    const NOW: &str = "2026-12-07T12:00:00Z";

    fn ns(name: &str, env: Option<&str>, managed: bool, age_s: i64) -> Namespace {
        let mut l = BTreeMap::new();
        if managed {
            l.insert(labels::MANAGED_BY.to_string(), labels::MANAGER.to_string());
        }
        if let Some(e) = env {
            l.insert(labels::ENVIRONMENT.to_string(), e.to_string());
        }
        let now: jiff::Timestamp = NOW.parse().unwrap();
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(l),
                creation_timestamp: Some(Time(now - jiff::SignedDuration::from_secs(age_s))),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        }
    }

    fn pick(all: &[Namespace]) -> Vec<(String, String)> {
        candidates(all, "env-", NOW.parse().unwrap(), Duration::from_secs(120))
    }

    #[test]
    fn an_old_namespace_of_our_own_environment_is_a_candidate() {
        let all = [ns("env-a", Some("a"), true, 300)];
        assert_eq!(pick(&all), [("env-a".to_string(), "a".to_string())]);
    }

    #[test]
    fn a_young_namespace_is_left_to_the_create_making_it() {
        assert!(pick(&[ns("env-a", Some("a"), true, 119)]).is_empty());
    }

    #[test]
    fn another_prefix_name_or_owner_is_never_a_candidate() {
        let all = [
            // Another daemon's prefix, or a name that is not prefix + its environment.
            ns("other-a", Some("a"), true, 300),
            ns("env-b", Some("a"), true, 300),
            // Not labelled as envbridge's, or without its environment (a fixed namespace).
            ns("env-c", Some("c"), false, 300),
            ns("env-d", None, true, 300),
        ];
        assert!(pick(&all).is_empty(), "{:?}", pick(&all));
    }

    #[test]
    fn a_namespace_already_going_is_not_deleted_again() {
        let mut going = ns("env-a", Some("a"), true, 300);
        going.metadata.deletion_timestamp = going.metadata.creation_timestamp.clone();
        assert!(pick(&[going]).is_empty());
    }
}

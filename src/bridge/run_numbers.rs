//! Run numbers for START, from the site's source: a run-number service of the site (an
//! integration endpoint, asked once per run), else a counter kept in the cluster (a ConfigMap
//! holding the last number given), so that no number is given twice, across daemon restarts
//! and replicas too. Each counter step is a compare-and-swap on the ConfigMap's
//! resourceVersion; a conflict (another START at the same moment) reads again.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use super::Bridge;
use super::error::{BridgeError, Result, is_conflict, is_not_found};

/// The ConfigMap's default name (in envbridge's own namespace).
pub const DEFAULT_NAME: &str = "envbridge-run-numbers";
/// Its key: the last run number given.
pub const KEY: &str = "last";
/// Conflicting STARTs retried before giving up (each conflict means another got a number).
const ATTEMPTS: usize = 20;

/// The number after `last` (the ConfigMap's value), or an error naming what is wrong.
pub fn after(last: Option<&str>, at: &str) -> Result<u32> {
    let Some(text) = last else {
        return Ok(1);
    };
    let n: u32 = text.trim().parse().map_err(|_| {
        BridgeError::Invalid(vec![format!(
            "run numbers: ConfigMap {at} key {KEY:?} holds {text:?}, not a run number"
        )])
    })?;
    n.checked_add(1).ok_or_else(|| {
        BridgeError::Invalid(vec![format!(
            "run numbers: ConfigMap {at} is at the largest run number ({n})"
        )])
    })
}

/// Where run numbers come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The counter in ConfigMap (namespace, name).
    Counter(String, String),
    /// A site's run-number service: `POST {"function": "NewRunNumber", "environmentId": ID,
    /// "event": "START"}`, answered `{"runNumber": N}` (docs/o2control.md, "Run numbers").
    Service(String),
}

impl Default for Source {
    fn default() -> Self {
        Source::Counter("envbridge-system".into(), DEFAULT_NAME.into())
    }
}

impl std::str::FromStr for Source {
    type Err = String;

    /// `NAMESPACE/NAME` (the counter) or an `http://` URL (the site's service).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s.starts_with("http://") {
            return Ok(Source::Service(s.to_string()));
        }
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Source::Counter(ns.to_string(), name.to_string()))
            }
            _ => Err(format!(
                "`{s}` is neither NAMESPACE/NAME (a counter ConfigMap) nor an http:// URL (a run-number service)"
            )),
        }
    }
}

/// The run number in a run-number service's answer: `runNumber`, a number or its text,
/// from 1 to 2^32-1 (the anchor's run numbers are 32-bit).
pub fn from_answer(answer: &serde_json::Value, url: &str) -> Result<u32> {
    let n = match answer.get("runNumber") {
        Some(serde_json::Value::Number(n)) => n.as_u64(),
        Some(serde_json::Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    };
    n.filter(|n| (1..=u64::from(u32::MAX)).contains(n))
        .map(|n| n as u32)
        .ok_or_else(|| {
            BridgeError::Invalid(vec![format!(
                "run numbers: the answer of {url} holds no runNumber from 1 to {}: {}",
                u32::MAX,
                answer.to_string().chars().take(200).collect::<String>()
            )])
        })
}

impl Bridge {
    /// Takes the next run number from `source` for environment `env_id`'s START.
    pub async fn next_run_number(&self, source: &Source, env_id: &str) -> Result<u32> {
        self.ensure_leader()?;
        match source {
            Source::Counter(namespace, name) => next(&self.client, namespace, name).await,
            Source::Service(url) => {
                let body = serde_json::json!({
                    "function": "NewRunNumber",
                    "environmentId": env_id,
                    "event": "START",
                });
                let answer = tokio::time::timeout(
                    SERVICE_TIMEOUT,
                    self.endpoints.post(url, body.to_string().into_bytes()),
                )
                .await
                .map_err(|_| {
                    BridgeError::Invalid(vec![format!(
                        "run numbers: {url} did not answer within {} s",
                        SERVICE_TIMEOUT.as_secs()
                    )])
                })?
                .map_err(|why| BridgeError::Invalid(vec![format!("run numbers: {why}")]))?;
                from_answer(&answer, url)
            }
        }
    }
}

/// How long START waits for a run-number service.
const SERVICE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Takes the next run number from ConfigMap `namespace/name`: created (with its namespace,
/// when missing) at the first. The demo takes its runs' numbers here too, so that one
/// counter numbers every run of a plane.
pub async fn next(client: &kube::Client, namespace: &str, name: &str) -> Result<u32> {
    let at = format!("{namespace}/{name}");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut made_namespace = false;
    for _ in 0..ATTEMPTS {
        let current = api.get_opt(name).await.map_err(BridgeError::kube(format!(
            "read run numbers ConfigMap {at}"
        )))?;
        let written = match current {
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        namespace: Some(namespace.to_string()),
                        ..Default::default()
                    },
                    data: Some([(KEY.to_string(), "1".to_string())].into()),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm).await.map(|_| 1)
            }
            Some(mut cm) => {
                let last = cm.data.as_ref().and_then(|d| d.get(KEY)).cloned();
                let n = after(last.as_deref(), &at)?;
                cm.data
                    .get_or_insert_default()
                    .insert(KEY.to_string(), n.to_string());
                // The resourceVersion read above makes this a compare-and-swap.
                api.replace(name, &PostParams::default(), &cm)
                    .await
                    .map(|_| n)
            }
        };
        match written {
            Ok(n) => return Ok(n),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) if is_conflict(&e) => continue,
            // The counter's namespace is missing (a daemon outside the site's deployment,
            // the local plane): made once, then the create is tried again.
            Err(e) if is_not_found(&e) && !made_namespace => {
                super::namespace::ensure_exists(client, namespace)
                    .await
                    .map_err(|e| BridgeError::Namespace {
                        namespace: namespace.to_string(),
                        message: format!("run numbers ConfigMap {at}: {e}"),
                    })?;
                made_namespace = true;
            }
            Err(e) => {
                return Err(BridgeError::kube(format!(
                    "write run numbers ConfigMap {at}"
                ))(e));
            }
        }
    }
    Err(BridgeError::Timeout {
        what: format!("run numbers: {ATTEMPTS} conflicting writes of ConfigMap {at}"),
        after: std::time::Duration::ZERO,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_number_follows_the_last_and_bad_content_is_named() {
        assert_eq!(after(None, "ns/rn").unwrap(), 1);
        assert_eq!(after(Some("41"), "ns/rn").unwrap(), 42);
        assert_eq!(after(Some(" 7\n"), "ns/rn").unwrap(), 8);
        let e = after(Some("x"), "ns/rn").unwrap_err().to_string();
        assert!(e.contains("ns/rn") && e.contains("\"x\""), "{e}");
        let e = after(Some(&u32::MAX.to_string()), "ns/rn")
            .unwrap_err()
            .to_string();
        assert!(e.contains("largest"), "{e}");
    }

    #[test]
    fn a_source_is_a_counter_or_a_service_and_its_answer_is_checked() {
        assert_eq!(
            "ns/rn".parse::<Source>().unwrap(),
            Source::Counter("ns".into(), "rn".into())
        );
        assert_eq!(
            "http://127.0.0.1:9/runs".parse::<Source>().unwrap(),
            Source::Service("http://127.0.0.1:9/runs".into())
        );
        for bad in ["rn", "a/b/c", "/rn", "https://x/runs"] {
            assert!(bad.parse::<Source>().is_err(), "{bad}");
        }
        let url = "http://127.0.0.1:9/runs";
        assert_eq!(
            from_answer(&serde_json::json!({"runNumber": 7}), url).unwrap(),
            7
        );
        assert_eq!(
            from_answer(&serde_json::json!({"runNumber": "8"}), url).unwrap(),
            8
        );
        for bad in [
            serde_json::json!({}),
            serde_json::json!({"runNumber": 0}),
            serde_json::json!({"runNumber": 4294967296u64}),
            serde_json::json!({"runNumber": "x"}),
        ] {
            let e = from_answer(&bad, url).unwrap_err().to_string();
            assert!(e.contains(url) && e.contains("runNumber"), "{e}");
        }
    }
}

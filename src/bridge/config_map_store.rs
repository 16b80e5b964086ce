//! The daemon's configuration store from a ConfigMap read through the API (key
//! `config.yaml`): watched, so the next create sees a new version at once; a version that does
//! not parse is reported and the last good one kept, as is the last good one when the
//! ConfigMap is deleted. Environments already created are never touched.

use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::workflow::store::ConfigStore;

/// The key of the ConfigMap that holds the store.
pub const KEY: &str = "config.yaml";

/// The latest good store, or why there has never been one.
#[derive(Debug)]
pub struct SharedStore {
    name: String,
    current: RwLock<Result<Arc<ConfigStore>, String>>,
    /// Versions refused so far (they did not parse).
    rejected: std::sync::atomic::AtomicU64,
}

impl SharedStore {
    pub fn new(namespace: &str, name: &str) -> Arc<Self> {
        let name = format!("configmap {namespace}/{name}");
        Arc::new(SharedStore {
            current: RwLock::new(Err(format!("{name} not read yet"))),
            rejected: Default::default(),
            name,
        })
    }

    /// The store to render with.
    pub fn current(&self) -> Result<Arc<ConfigStore>, String> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How many versions were refused.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A new version of the ConfigMap: taken if it parses, else reported (the last good one
    /// stays). Returns whether it was taken.
    pub fn offer(&self, cm: &ConfigMap) -> bool {
        let text = cm.data.as_ref().and_then(|d| d.get(KEY));
        let parsed = match text {
            Some(t) => {
                ConfigStore::parse(&format!("{}:{KEY}", self.name), t).map_err(|e| e.to_string())
            }
            None => Err(format!("{} has no key {KEY}", self.name)),
        };
        let mut cur = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match parsed {
            Ok(s) => {
                tracing::info!(configmap = %self.name, "configuration store read");
                *cur = Ok(Arc::new(s));
                true
            }
            Err(e) => {
                self.rejected
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match cur.is_ok() {
                    true => {
                        tracing::error!(error = %e, "configuration store: new version rejected, the last good one stays in use")
                    }
                    false => {
                        tracing::error!(error = %e, "configuration store: no good version yet");
                        *cur = Err(e);
                    }
                }
                false
            }
        }
    }
}

/// Watches the ConfigMap until `stop`, feeding every version to `shared`.
pub async fn watch(
    client: Client,
    namespace: String,
    name: String,
    shared: Arc<SharedStore>,
    stop: CancellationToken,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, cfg)
        .backoff(crate::launch::watch_backoff::watch_backoff())
        .boxed();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            ev = events.next() => match ev {
                Some(Ok(Event::Apply(cm) | Event::InitApply(cm))) => { shared.offer(&cm); }
                Some(Ok(Event::Delete(_))) => tracing::warn!(configmap = %name, "configuration store ConfigMap deleted: the last good version stays in use"),
                Some(Ok(Event::Init | Event::InitDone)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "configuration store watch (retrying)"),
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn cm(text: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta::default(),
            data: text.map(|t| [(KEY.to_string(), t.to_string())].into()),
            ..Default::default()
        }
    }

    #[test]
    fn takes_good_versions_and_keeps_the_last_good_one() {
        let s = SharedStore::new("ns", "store");
        assert!(s.current().unwrap_err().contains("not read yet"));
        assert!(!s.offer(&cm(None)));
        assert!(s.current().unwrap_err().contains("no key config.yaml"));
        assert!(s.offer(&cm(Some(
            "o2:\n  runtime:\n    aliecs:\n      defaults:\n        a: b\n"
        ))));
        assert!(!s.offer(&cm(Some("o2: [\n"))));
        let cur = s.current().unwrap();
        assert_eq!(cur.defaults().get("a").unwrap().as_literal(), Some("b"));
        assert_eq!(s.rejected(), 2);
    }
}

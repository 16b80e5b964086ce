//! The cluster side: Environment -> Tasks -> Pods (+ headless Services), task control, status.
//!
//! Pure parts (no I/O, unit-tested): [`nodes`], [`args`], [`names`], [`pod`], [`service`],
//! [`pod_status`], [`task_sets`], [`aggregate`]. Kubernetes I/O: [`env_controller`],
//! [`task_controller`], [`runtime`] (watches, stores, leader election). See docs/operator.md.

pub mod aggregate;
pub mod args;
pub mod bounded;
pub mod calls;
pub mod config;
pub mod control_api;
pub mod env_controller;
pub mod hooks;
pub mod live;
pub mod names;
pub mod nodes;
pub mod pod;
pub mod pod_status;
pub mod pod_story;
pub mod requests;
pub mod runtime;
pub mod service;
pub mod task_controller;
pub mod task_sets;
pub mod transition_args;

pub use config::OperatorArgs;
pub use runtime::{run, run_cli};

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "envbridge-operator";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {kind} {ns}/{name}: {source}")]
    Kube {
        action: &'static str,
        kind: &'static str,
        ns: String,
        name: String,
        source: kube::Error,
    },
    #[error("leader election: {0}")]
    Lease(String),
    #[error("kubernetes client configuration: {0}")]
    Config(String),
    #[error("kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("leadership lost")]
    LeaseLost,
}

impl Error {
    pub fn kube(
        action: &'static str,
        kind: &'static str,
        ns: &str,
        name: &str,
        source: kube::Error,
    ) -> Self {
        Error::Kube {
            action,
            kind,
            ns: ns.to_string(),
            name: name.to_string(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Delete `name` (background propagation); an object already gone is success.
pub(crate) async fn delete_ignore_missing<K>(
    api: &kube::Api<K>,
    name: &str,
    kind: &'static str,
    ns: &str,
) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .delete(name, &kube::api::DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube("delete", kind, ns, name, e)),
    }
}

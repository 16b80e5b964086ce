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
pub mod context;
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
pub mod task_index;
pub mod task_sets;
pub mod task_step;
pub mod transition_args;
pub mod trim;

use std::time::Duration;

use kube::Resource;

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
    /// A cleanup that is not finished (objects still going, calls still running): the
    /// finalizer stays, the reconcile comes back after `after`.
    #[error("{what}: waiting")]
    Pending { what: String, after: Duration },
    #[error("finalizer {action} {ns}/{name}: {source}")]
    Finalizer {
        action: &'static str,
        ns: String,
        name: String,
        source: kube::Error,
    },
    #[error("finalizer: {0}")]
    FinalizerUse(String),
}

impl Error {
    /// The error of kube's `finalizer()` helper as one of ours: the reconcile's own errors
    /// pass through unchanged (a `Pending` cleanup keeps its retry delay).
    pub fn from_finalizer<K: Resource>(obj: &K, e: kube::runtime::finalizer::Error<Error>) -> Self {
        use kube::runtime::finalizer::Error as F;
        let (ns, name) = (
            obj.meta().namespace.clone().unwrap_or_default(),
            obj.meta().name.clone().unwrap_or_default(),
        );
        match e {
            F::ApplyFailed(e) | F::CleanupFailed(e) => e,
            F::AddFinalizer(source) => Error::Finalizer {
                action: "add",
                ns,
                name,
                source,
            },
            F::RemoveFinalizer(source) => Error::Finalizer {
                action: "remove",
                ns,
                name,
                source,
            },
            other => Error::FinalizerUse(other.to_string()),
        }
    }

    /// How soon to try again after this error.
    pub fn retry_after(&self) -> Duration {
        match self {
            Error::Pending { after, .. } => *after,
            _ => Duration::from_secs(2),
        }
    }

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

//! The cluster side: Environment -> Tasks -> Pods (+ headless Services), task control, status.
//!
//! Pure parts (no I/O, unit-tested): [`nodes`], [`args`], [`names`], [`pod`], [`service`],
//! [`pod_status`], [`task_sets`], [`aggregate`]. Kubernetes I/O: [`env_controller`],
//! [`task_controller`], [`runtime`] (watches, stores), [`leader`] (leader election), [`http`] (/metrics,
//! /healthz, /readyz; the families in [`metrics`]), [`cli`] (the process). See docs/operator.md.

pub mod aggregate;
pub mod args;
pub mod bounded;
pub mod calls;
pub mod cli;
pub mod config;
pub mod context;
pub mod control_api;
pub mod env_controller;
pub mod hooks;
pub mod http;
pub mod leader;
pub mod lean;
pub mod live;
pub mod metrics;
pub mod names;
pub mod nodes;
pub mod pod;
pub mod pod_status;
pub mod pod_story;
pub mod requests;
pub mod runtime;
pub mod service;
pub mod status_pace;
pub mod stored_pod;
pub mod stored_service;
pub mod task_controller;
pub mod task_index;
pub mod task_patch;
pub mod task_sets;
pub mod task_step;
pub mod transition_args;
pub mod transition_calls;
pub mod trim;
pub mod unread;
pub mod watch_index;

use std::time::Duration;

use kube::Resource;

pub use cli::run_cli;
pub use config::OperatorArgs;
pub use leader::{run, run_with_metrics};

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
    /// A Task this environment would create is there, controlled by another object.
    #[error("Task {ns}/{name} exists and is controlled by {owner}, not by this environment")]
    Taken {
        ns: String,
        name: String,
        owner: String,
    },
    #[error("finalizer {action} {ns}/{name}: {source}")]
    Finalizer {
        action: &'static str,
        ns: String,
        name: String,
        source: kube::Error,
    },
    #[error("finalizer: {0}")]
    FinalizerUse(String),
    /// The controllers' task ended in a panic (leader election runs them in a task of their own).
    #[error("operator controllers stopped: {0}")]
    Controllers(String),
    #[error("metrics listener {addr} (--metrics-listen): {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// The controllers' task ended in a panic (kube's controller resumes a reconcile's panic
/// there): an error, so that the process exits non-zero and is restarted, as it does when it
/// runs the controllers without leader election; never a clean stop.
impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Error::Controllers(e.to_string())
    }
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

    /// The variant's name in `envbridge_operator_reconcile_errors_total{error}` (one per
    /// variant: a bounded label, never the message).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Lease(_) => "lease",
            Error::Config(_) => "config",
            Error::Client(_) => "client",
            Error::LeaseLost => "lease_lost",
            Error::Pending { .. } => "pending",
            Error::Taken { .. } => "taken",
            Error::Finalizer { .. } => "finalizer",
            Error::FinalizerUse(_) => "finalizer_use",
            Error::Controllers(_) => "controllers",
            Error::Listen { .. } => "listen",
        }
    }

    /// How soon to try again after this error.
    pub fn retry_after(&self) -> Duration {
        match self {
            Error::Pending { after, .. } => *after,
            // Only its owner's deletion frees the name, and that wakes nothing here.
            Error::Taken { .. } => Duration::from_secs(30),
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

/// Delete `name` (background propagation); an object already gone is success. The reply is
/// not read ([`unread`]).
pub(crate) async fn delete_ignore_missing<K>(
    api: &kube::Api<K>,
    name: &str,
    kind: &'static str,
    ns: &str,
) -> Result<()>
where
    K: kube::Resource + Clone,
{
    match unread::delete(api, name, &kube::api::DeleteParams::background()).await {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube("delete", kind, ns, name, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `metric_label`'s match names every variant; here each label is shown distinct.
    #[test]
    fn every_error_variant_has_its_own_label() {
        let io = || std::io::Error::other("x");
        let kube = || kube::Error::TlsRequired;
        let errors = [
            Error::kube("get", "pods", "ns", "p", kube()),
            Error::Lease("x".into()),
            Error::Config("x".into()),
            Error::Client(kube()),
            Error::LeaseLost,
            Error::Pending {
                what: "x".into(),
                after: std::time::Duration::ZERO,
            },
            Error::Finalizer {
                action: "add",
                ns: "ns".into(),
                name: "e".into(),
                source: kube(),
            },
            Error::FinalizerUse("x".into()),
            Error::Controllers("x".into()),
            Error::Listen {
                addr: ([127, 0, 0, 1], 1).into(),
                source: io(),
            },
        ];
        let labels: std::collections::BTreeSet<_> =
            errors.iter().map(Error::metric_label).collect();
        assert_eq!(labels.len(), errors.len(), "{labels:?}");
        assert!(
            labels
                .iter()
                .all(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        );
    }
}

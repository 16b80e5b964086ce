//! Errors of the daemon's Kubernetes edge.

use std::time::Duration;

/// What can go wrong while deploying, transitioning, killing or destroying.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// Bad input found before anything was written (every problem listed).
    #[error("invalid environment, nothing was written:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
    #[error("environment {0:?} not found")]
    NotFound(String),
    #[error("environment id {0:?} is ambiguous (several namespaces hold it); use namespace/name")]
    Ambiguous(String),
    #[error("task {task:?} not found in environment {env}")]
    TaskNotFound { env: String, task: String },
    #[error("namespace {namespace}: {message}")]
    Namespace { namespace: String, message: String },
    #[error("{what}: timed out after {after:?}")]
    Timeout { what: String, after: Duration },
    #[error("event {event} does not apply to an environment in state {state}")]
    InvalidTransition { event: String, state: String },
    #[error(
        "this replica is on standby (another replica holds the leader lease); writes go to the leader"
    )]
    NotLeader,
    #[error("render: {0}")]
    Render(String),
    /// A detector belongs to at most one environment, as in the anchor.
    #[error(
        "detector {detector} (host {host}) is in use by environment {environment}: nothing was written; destroy that environment first"
    )]
    DetectorInUse {
        detector: String,
        host: String,
        environment: String,
    },
    #[error("{context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
}

impl BridgeError {
    pub fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> BridgeError {
        let context = context.into();
        move |source| BridgeError::Kube { context, source }
    }
}

pub type Result<T, E = BridgeError> = std::result::Result<T, E>;

/// True for the apiserver's 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

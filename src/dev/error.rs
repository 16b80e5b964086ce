//! Errors of the local control plane launcher.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("{context}: {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Pki(#[from] rcgen::Error),
    #[error("building the control plane binaries failed: {0}")]
    Build(String),
    #[error("{component} failed to start: {reason} (log: {log})")]
    Start {
        component: String,
        reason: String,
        log: PathBuf,
    },
    #[error("the control plane did not become ready: {0}")]
    NotReady(String),
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig error: {0}")]
    Kubeconfig(String),
    #[error("state file {path} is unreadable: {reason}")]
    State { path: PathBuf, reason: String },
    #[error("building or importing the node images failed: {0}")]
    Image(String),
    #[error("invalid request: {0}")]
    Invalid(String),
}

pub type Result<T, E = DevError> = std::result::Result<T, E>;

/// Attach a path and what was being done to an io::Error.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, context: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| DevError::Io {
            context,
            path: path.into(),
            source,
        })
    }
}

//! Errors of building and importing the dev images: each names the path or command involved.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("running `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("`{command}` printed what it should not: {line:?}")]
    Output { command: String, line: String },
    #[error("{binary} needs {library}, which `ldd` cannot find")]
    LibraryNotFound { binary: PathBuf, library: String },
    #[error("layer entry {path:?}: {reason}")]
    Entry { path: String, reason: &'static str },
    #[error("image {reference:?}: {reason}")]
    Spec {
        reference: String,
        reason: &'static str,
    },
    #[error("encoding the {what} of {reference}: {source}")]
    Json {
        what: &'static str,
        reference: String,
        source: serde_json::Error,
    },
}

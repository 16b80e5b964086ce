//! Where the control plane keeps its state and its built binaries.

use std::path::PathBuf;

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// State directory of the one control plane of this machine: $ENVBRIDGE_DEV_DIR or
/// ~/.local/state/envbridge/dev. Shared by every checkout and every test process.
pub fn state_dir() -> PathBuf {
    env_path("ENVBRIDGE_DEV_DIR").unwrap_or_else(|| match home() {
        Some(h) => h.join(".local/state/envbridge/dev"),
        None => std::env::temp_dir().join("envbridge-dev"),
    })
}

/// Lock file serialising up/down across processes (beside the state directory, which
/// `down` removes).
pub fn lock_file_for(dir: &std::path::Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| format!("{}.lock", n.to_string_lossy()))
        .unwrap_or_else(|| "dev.lock".to_string());
    dir.with_file_name(name)
}

/// Cache root for built binaries and Go caches: $ENVBRIDGE_CACHE or ~/.cache/envbridge.
pub fn cache_root() -> PathBuf {
    env_path("ENVBRIDGE_CACHE").unwrap_or_else(|| match home() {
        Some(h) => h.join(".cache/envbridge"),
        None => std::env::temp_dir().join("envbridge-cache"),
    })
}

/// An explicit directory of prebuilt binaries ($ENVBRIDGE_DEV_BIN_DIR), bypassing the build.
pub fn bin_dir_override() -> Option<PathBuf> {
    env_path("ENVBRIDGE_DEV_BIN_DIR")
}

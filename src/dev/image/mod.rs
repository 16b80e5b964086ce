//! OCI images of the current envbridge executable, for nodes that run containers: built
//! from this machine's files (the executable, bash and a few tools, the shared objects they
//! load), with no registry, container engine or base image, and imported into containerd
//! with `ctr`. `Containerfile` at the repository root builds the same content with a
//! site's own tools.
//!
//! Both images ([`IMAGE`], [`PAUSE_IMAGE`]) share one uncompressed layer, written once in
//! one OCI-layout archive. Everything is deterministic (sorted entries, zero timestamps and
//! owners), so the same executable gives the same digests and an imported image can be
//! told stale by its digest alone.

mod entry;
mod error;
mod import;
mod layer;
mod layout;
mod ldd;
mod oci;
mod rootfs;
mod ustar;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;

pub use entry::{Entry, EntryKind};
pub use error::ImageError;
pub use import::{NAMESPACE, SNAPSHOTTER, ensure_imported, import, imported_digest};
pub use layout::{Archive, ImageSpec, PATH_ENV, write_oci_archive};
pub use rootfs::{
    ANCHOR_BIN, ANCHOR_COMMANDS, ENVBRIDGE, FLP_UID, MANIFEST_DIRS, rootfs_entries,
    rootfs_entries_with,
};

/// The task image: the executable, entered under the anchor's command names.
pub const IMAGE: &str = "localhost/envbridge:dev";
/// The pod sandbox image: `envbridge pause` sleeps until SIGTERM/SIGINT.
pub const PAUSE_IMAGE: &str = "localhost/envbridge-pause:dev";
/// File name of the archive [`build`] writes.
pub const ARCHIVE_FILE: &str = "envbridge-images.oci.tar";
/// Config label carrying the blake3 hex of the executable the images hold.
pub const BUILD_LABEL: &str = "envbridge.dev/build";

/// The project's manifests directory this executable was built from, when it is still
/// there (its workflows and site profile go into the image, see [`MANIFEST_DIRS`]);
/// `ENVBRIDGE_MANIFESTS` names another.
pub fn manifests_dir() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("ENVBRIDGE_MANIFESTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests"));
    dir.join(MANIFEST_DIRS[0].0).is_dir().then_some(dir)
}

/// Builds [`IMAGE`] and [`PAUSE_IMAGE`] of `exe` (and the workflows of [`manifests_dir`])
/// into `out_dir/`[`ARCHIVE_FILE`].
pub fn build(exe: &Path, out_dir: &Path) -> Result<Archive, ImageError> {
    std::fs::create_dir_all(out_dir).map_err(|source| ImageError::Write {
        path: out_dir.into(),
        source,
    })?;
    let entries = rootfs_entries_with(exe, manifests_dir().as_deref())?;
    let executable = entries
        .iter()
        .find(|e| e.path == ENVBRIDGE)
        .and_then(Entry::data)
        .unwrap_or_default();
    let labels = BTreeMap::from([(
        BUILD_LABEL.to_string(),
        blake3::hash(executable).to_hex().to_string(),
    )]);
    let image = |reference: &str, entrypoint: &[&str]| ImageSpec {
        reference: reference.to_string(),
        entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
        cmd: Vec::new(),
        labels: labels.clone(),
    };
    let images = [
        image(IMAGE, &[ENVBRIDGE]),
        image(PAUSE_IMAGE, &[ENVBRIDGE, "pause"]),
    ];
    write_oci_archive(&entries, &out_dir.join(ARCHIVE_FILE), &images)
}

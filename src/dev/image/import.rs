//! Loading the archive into containerd with its `ctr` client, where the kubelet's CRI finds
//! it: namespace `k8s.io`, unpacked for the `overlayfs` snapshotter.
//!
//! Flags, from containerd v2.2's `cmd/ctr/commands/images/import.go` and the transfer
//! service it calls (`core/transfer/{local/import.go,image/imagestore.go}`):
//! - no `--base-name`: ctr then uses a dated `import-YYYY-MM-DD` prefix, but only for
//!   tag-only names; an `io.containerd.image.name` that contains `/`, `:` or `@` is stored
//!   verbatim, so `localhost/envbridge:dev` stays `localhost/envbridge:dev`. Passing
//!   `--base-name` would instead DROP every image whose name lacks that prefix;
//! - no `--index-name`: the index itself is not stored as an image, only its manifests;
//! - no `--all-platforms`: the host platform is selected and unpacked (the layer holds the
//!   host's binaries; with it, ctr still unpacks only the default platform);
//! - no `--local`: the daemon's transfer service imports and unpacks, and FAILS ("no unpack
//!   platforms defined") when it has no unpack configuration for the requested snapshotter,
//!   rather than leaving the image silently not unpacked;
//! - `--snapshotter overlayfs` explicitly, not the daemon's (or `$CONTAINERD_SNAPSHOTTER`'s)
//!   default; unpacking is on unless `--no-unpack` is given.

use std::path::Path;
use std::process::Command;

use super::{Archive, ImageError};

/// The containerd namespace the CRI plugin (and so the kubelet) uses.
pub const NAMESPACE: &str = "k8s.io";
/// The snapshotter the images are unpacked for.
pub const SNAPSHOTTER: &str = "overlayfs";

/// Imports every image of `archive`, keeping the names its index annotates.
pub fn import(ctr: &Path, address: &Path, archive: &Path) -> Result<(), ImageError> {
    let mut cmd = ctr_command(ctr, address);
    cmd.args(["images", "import", "--snapshotter", SNAPSHOTTER])
        .arg(archive);
    run(cmd).map(drop)
}

/// The manifest digest (`sha256:…`) containerd holds for `reference`, `None` when it has no
/// such image: a digest other than the archive's means the imported image is stale.
pub fn imported_digest(
    ctr: &Path,
    address: &Path,
    reference: &str,
) -> Result<Option<String>, ImageError> {
    let mut cmd = ctr_command(ctr, address);
    cmd.args(["images", "ls", &format!("name=={reference}")]);
    let stdout = run(cmd)?;
    Ok(parse_ls(&stdout, reference))
}

/// Imports `archive` unless containerd already holds each of its images at its digest;
/// true when it imported.
pub fn ensure_imported(ctr: &Path, address: &Path, archive: &Archive) -> Result<bool, ImageError> {
    for (reference, digest) in &archive.manifests {
        if imported_digest(ctr, address, reference)?.as_deref() != Some(digest.as_str()) {
            import(ctr, address, &archive.path)?;
            return Ok(true);
        }
    }
    Ok(false)
}

/// The DIGEST column of `reference`'s row in `ctr images ls` output
/// (`REF TYPE DIGEST SIZE PLATFORMS LABELS`, space-aligned).
pub(super) fn parse_ls(stdout: &str, reference: &str) -> Option<String> {
    stdout.lines().skip(1).find_map(|line| {
        let mut cols = line.split_whitespace();
        let name = cols.next()?;
        let digest = cols.nth(1)?;
        (name == reference && digest.starts_with("sha256:")).then(|| digest.to_string())
    })
}

fn ctr_command(ctr: &Path, address: &Path) -> Command {
    let mut cmd = Command::new(ctr);
    cmd.arg("--address")
        .arg(address)
        .args(["--namespace", NAMESPACE]);
    cmd
}

/// Runs `cmd`, its stdout on success; on failure the error quotes its stderr.
fn run(mut cmd: Command) -> Result<String, ImageError> {
    let command = describe(&cmd);
    let out = cmd.output().map_err(|source| ImageError::Spawn {
        command: command.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(ImageError::Command {
            command,
            status: out.status,
            stderr: quoted_stderr(&String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// ctr's stderr without its log warnings (containerd 2.2 warns about cgroup v1 on every
/// call), unless they are all it said.
pub(super) fn quoted_stderr(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("level=warning"))
        .collect();
    if lines.is_empty() {
        stderr.trim().to_string()
    } else {
        lines.join("\n")
    }
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

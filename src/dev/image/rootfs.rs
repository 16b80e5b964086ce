//! The files of the image's single layer, taken from this machine: the executable, the few
//! host tools task commands run through, and every shared object those need.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{Entry, EntryKind, ImageError, ldd};

/// Where the executable lives in the image.
pub const ENVBRIDGE: &str = "/usr/local/bin/envbridge";
/// The anchor's task directory: its commands are symlinks to [`ENVBRIDGE`].
pub const ANCHOR_BIN: &str = "/opt/o2/bin";
/// Basenames of the anchor's task commands; the executable dispatches on `argv[0]`.
pub use crate::control::sim::as_task::ANCHOR_COMMANDS;
/// The unprivileged account tasks run as (the anchor's `flp` user).
pub const FLP_UID: u32 = 1100;

/// Host programs copied at the same path: task commands are shell lines (`bash -c`,
/// `… | tee log`), and probes use `cat`, `sleep`, `env`.
const HOST_TOOLS: &[&str] = &[
    "/bin/bash",
    "/usr/bin/tee",
    "/bin/cat",
    "/bin/sleep",
    "/usr/bin/env",
];

/// Mount points and scratch directories a container runtime and the tasks expect.
const DIRS: &[(&str, u32)] = &[
    ("/tmp", 0o1777),
    ("/dev/shm", 0o1777),
    ("/etc", 0o755),
    ("/home", 0o755),
    ("/root", 0o700),
    ("/var/log", 0o755),
    ("/proc", 0o555),
    ("/sys", 0o555),
    ("/dev", 0o755),
];

const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nflp:x:1100:1100:flp:/home/flp:/bin/bash\n";
const GROUP: &str = "root:x:0:\nflp:x:1100:\n";
// glibc (2.34+) has `files` and `dns` built in, so no libnss_* objects are needed.
const NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n";

/// The layer's entries for `exe`, sorted by path, parents before children. Content comes
/// from the files (symlinks followed); nothing of the host's timestamps or owners is kept,
/// so the same files always give the same entries.
pub fn rootfs_entries(exe: &Path) -> Result<Vec<Entry>, ImageError> {
    rootfs_entries_with(exe, None)
}

/// Where the project's workflows and site profile go in the image, for the daemon deployed
/// in a cluster (manifests/deploy/local): `<manifests>/<from>/*.yaml` -> `<to>/`.
pub const MANIFEST_DIRS: &[(&str, &str)] = &[
    (
        "control-workflows/tasks",
        "/etc/envbridge/control-workflows/tasks",
    ),
    (
        "control-workflows/workflows",
        "/etc/envbridge/control-workflows/workflows",
    ),
    ("site", "/etc/envbridge/site"),
];

/// A workflow, task class or site file copied into the image is at most this long.
const MAX_MANIFEST_FILE: u64 = 4 * 1024 * 1024;

/// [`rootfs_entries`] plus, from the project's `manifests` directory, the files of
/// [`MANIFEST_DIRS`].
pub fn rootfs_entries_with(exe: &Path, manifests: Option<&Path>) -> Result<Vec<Entry>, ImageError> {
    let mut tree = Tree::default();
    if let Some(dir) = manifests {
        for (from, to) in MANIFEST_DIRS {
            let src = dir.join(from);
            let rd = std::fs::read_dir(&src).map_err(|source| ImageError::Read {
                path: src.clone(),
                source,
            })?;
            let mut files: Vec<std::path::PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml"))
                .collect();
            files.sort();
            for f in files {
                let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if std::fs::metadata(&f).is_ok_and(|m| m.len() > MAX_MANIFEST_FILE) {
                    return Err(ImageError::Entry {
                        path: f.display().to_string(),
                        reason: "is larger than 4 MiB, the bound of a workflow or site file",
                    });
                }
                tree.add(Entry::file(&format!("{to}/{name}"), 0o644, read(&f)?))?;
            }
        }
    }
    tree.add(Entry::file(ENVBRIDGE, 0o755, read(exe)?))?;
    for tool in HOST_TOOLS {
        tree.add(host_file(tool)?)?;
    }
    tree.add(Entry::symlink("/bin/sh", "bash"))?;

    let binaries = std::iter::once(exe).chain(HOST_TOOLS.iter().map(Path::new));
    for binary in binaries {
        for library in ldd::libraries(binary)? {
            if !tree.has(&library) {
                tree.add(host_file(&library)?)?;
            }
        }
    }

    for command in ANCHOR_COMMANDS {
        tree.add(Entry::symlink(
            &format!("{ANCHOR_BIN}/{command}"),
            ENVBRIDGE,
        ))?;
    }
    for (dir, mode) in DIRS {
        tree.add(Entry::dir(dir, *mode))?;
    }
    tree.add(Entry::dir("/home/flp", 0o755).owned(FLP_UID, FLP_UID))?;
    tree.add(Entry::file("/etc/passwd", 0o644, PASSWD.into()))?;
    tree.add(Entry::file("/etc/group", 0o644, GROUP.into()))?;
    tree.add(Entry::file("/etc/nsswitch.conf", 0o644, NSSWITCH.into()))?;
    tree.into_entries()
}

/// Entries by path; a later entry for a path already present is a bug, not an override.
#[derive(Default)]
struct Tree(BTreeMap<String, Entry>);

impl Tree {
    fn has(&self, path: &str) -> bool {
        self.0.contains_key(path)
    }

    fn add(&mut self, entry: Entry) -> Result<(), ImageError> {
        if self.0.contains_key(&entry.path) {
            return Err(ImageError::Entry {
                path: entry.path,
                reason: "added twice",
            });
        }
        self.0.insert(entry.path.clone(), entry);
        Ok(())
    }

    /// The entries with every missing parent directory (0755) added.
    fn into_entries(mut self) -> Result<Vec<Entry>, ImageError> {
        let paths: Vec<String> = self.0.keys().cloned().collect();
        for path in paths {
            for parent in Path::new(&path).ancestors().skip(1) {
                let parent = parent.to_str().unwrap_or_default();
                if parent == "/" || parent.is_empty() {
                    break;
                }
                match self.0.get(parent).map(|e| &e.kind) {
                    Some(EntryKind::Dir { .. }) => {}
                    Some(_) => {
                        return Err(ImageError::Entry {
                            path: parent.to_string(),
                            reason: "is a parent of other entries but not a directory",
                        });
                    }
                    None => {
                        self.0.insert(parent.to_string(), Entry::dir(parent, 0o755));
                    }
                }
            }
        }
        Ok(self.0.into_values().collect())
    }
}

/// A host file at the same path in the image, content and permission bits only.
fn host_file(path: &str) -> Result<Entry, ImageError> {
    let meta = std::fs::metadata(path).map_err(|source| ImageError::Read {
        path: path.into(),
        source,
    })?;
    if !meta.is_file() {
        return Err(ImageError::Entry {
            path: path.to_string(),
            reason: "is not a regular file on this machine",
        });
    }
    // No setuid/setgid/sticky bits from the host.
    let mode = meta.permissions().mode() & 0o777;
    Ok(Entry::file(path, mode, read(Path::new(path))?))
}

fn read(path: &Path) -> Result<Vec<u8>, ImageError> {
    std::fs::read(path).map_err(|source| ImageError::Read {
        path: path.into(),
        source,
    })
}

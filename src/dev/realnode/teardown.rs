//! Ending a real node as a dead machine ends: every process in its cgroup (containers and
//! shims) killed, its mounts (the kubelet's bind mount of its root, volumes, rootfs
//! overlays) detached, its cgroups removed. What `dev down` and a "node lost" fault use.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::dev::error::{IoContext, Result};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The mounted cgroup hierarchies under /sys/fs/cgroup: every v1 controller's and, on a
/// hybrid host, the unified (v2) one, where runc also makes the node's cgroups.
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter(|l| l.contains(" - cgroup ") || l.contains(" - cgroup2 "))
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(CGROUP_ROOT))
        .map(PathBuf::from)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Create `cgroup` (and its parents) in every hierarchy; a new cpuset gets its parent's
/// CPUs and memory nodes (v1 leaves them empty, and no process could join it).
pub fn create_cgroup(cgroup: &str) -> Result<()> {
    for h in hierarchies() {
        let mut path = h.clone();
        for part in cgroup.trim_start_matches('/').split('/') {
            let parent = path.clone();
            path.push(part);
            if !path.exists() {
                std::fs::create_dir(&path).ctx("creating the cgroup", &path)?;
            }
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let own = path.join(f);
                if own.exists() && std::fs::read_to_string(&own).is_ok_and(|v| v.trim().is_empty())
                {
                    let inherited =
                        std::fs::read_to_string(parent.join(f)).ctx("reading", parent.join(f))?;
                    std::fs::write(&own, inherited.trim()).ctx("writing", &own)?;
                }
            }
        }
    }
    Ok(())
}

/// Every cgroup directory at or below `cgroup` in every hierarchy, deepest first.
fn cgroup_dirs(cgroup: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(dir.to_path_buf());
    }
    let mut out = Vec::new();
    for h in hierarchies() {
        let top = h.join(cgroup.trim_start_matches('/'));
        if top.is_dir() {
            walk(&top, &mut out);
        }
    }
    out
}

/// Pids of every process in `cgroup` or below.
pub fn processes(cgroup: &str) -> Vec<i32> {
    let mut pids: Vec<i32> = cgroup_dirs(cgroup)
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// SIGKILL every process of `cgroup` until none is left (a container may fork while it
/// dies), for at most `within`. Returns how many were killed.
pub fn kill_all(cgroup: &str, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    let mut killed = std::collections::BTreeSet::new();
    loop {
        let pids = processes(cgroup);
        if pids.is_empty() || Instant::now() > deadline {
            return killed.len();
        }
        for pid in pids {
            // SAFETY: kill(2) on a pid read from the node's own cgroup.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            killed.insert(pid);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Remove the node's cgroups, deepest first (they must be empty of processes).
pub fn remove_cgroups(cgroup: &str) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for d in cgroup_dirs(cgroup) {
        if std::fs::remove_dir(&d).is_err() && d.exists() {
            left.push(d);
        }
    }
    left
}

/// Mount points at or below `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(field: &str) -> PathBuf {
    let mut out = String::with_capacity(field.len());
    let b = field.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(char::from(v));
            i += 4;
            continue;
        }
        out.push(char::from(b[i]));
        i += 1;
    }
    PathBuf::from(out)
}

/// Detach every mount under `dir` (lazily: a busy mount goes when its last user does).
pub fn unmount_all(dir: &Path) -> usize {
    let mut n = 0;
    // A mount may be stacked several times on one point: repeat until none is left.
    for _ in 0..8 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            break;
        }
        for m in mounts {
            let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: umount2 with a valid C string; failure is reported by the next pass.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path(r"/a\040b/c"), PathBuf::from("/a b/c"));
        assert_eq!(unescape_mount_path("/plain"), PathBuf::from("/plain"));
    }

    #[test]
    fn a_cgroup_is_created_killed_and_removed() {
        if hierarchies().is_empty() {
            panic!("no cgroup v1 hierarchy mounted: real nodes need one");
        }
        let cg = format!("/envbridge-unit-{}", std::process::id());
        create_cgroup(&format!("{cg}/inner")).expect("create");
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        let procs = hierarchies()
            .into_iter()
            .find(|h| h.ends_with("pids"))
            .expect("pids hierarchy")
            .join(cg.trim_start_matches('/'))
            .join("inner/cgroup.procs");
        std::fs::write(&procs, child.id().to_string()).expect("join");
        assert_eq!(processes(&cg), vec![child.id() as i32]);
        assert_eq!(kill_all(&cg, Duration::from_secs(5)), 1);
        let _ = child.wait();
        assert!(processes(&cg).is_empty());
        assert!(remove_cgroups(&cg).is_empty(), "cgroups left");
        assert!(cgroup_dirs(&cg).is_empty());
    }
}

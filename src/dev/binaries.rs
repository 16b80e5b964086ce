//! The control plane's binaries, built from the Go wrapper module tests/cluster/gobuild
//! (embedded here) into a cache directory keyed by the pinned versions, once per machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::error::{DevError, IoContext, Result};
use super::paths;

pub const K8S_VERSION: &str = "v1.36.3";
pub const ETCD_VERSION: &str = "v3.6.8";
pub const KWOK_VERSION: &str = "v0.8.0";
/// Cache key: every pinned version.
pub const KEY: &str = "k8s-v1.36.3-etcd-v3.6.8-kwok-v0.8.0";

const GO_MOD: &str = include_str!("../../tests/cluster/gobuild/go.mod");
const GO_SUM: &str = include_str!("../../tests/cluster/gobuild/go.sum");

/// Go packages and the file name each is installed under.
const PACKAGES: &[(&str, &str)] = &[
    ("go.etcd.io/etcd/server/v3", "etcd"),
    ("k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
    (
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-controller-manager",
    ),
    ("k8s.io/kubernetes/cmd/kubectl", "kubectl"),
    ("sigs.k8s.io/kwok/cmd/kwok", "kwok"),
];

#[derive(Debug, Clone)]
pub struct Binaries {
    pub dir: PathBuf,
    pub etcd: PathBuf,
    pub apiserver: PathBuf,
    pub controller_manager: PathBuf,
    pub kubectl: PathBuf,
    pub kwok: PathBuf,
}

impl Binaries {
    pub fn in_dir(dir: &Path) -> Self {
        // A `go build -o dir/` of etcd names it after its package: accept "server" too.
        let etcd = if dir.join("etcd").exists() || !dir.join("server").exists() {
            dir.join("etcd")
        } else {
            dir.join("server")
        };
        Binaries {
            dir: dir.to_path_buf(),
            etcd,
            apiserver: dir.join("kube-apiserver"),
            controller_manager: dir.join("kube-controller-manager"),
            kubectl: dir.join("kubectl"),
            kwok: dir.join("kwok"),
        }
    }

    fn all(&self) -> [&Path; 5] {
        [
            &self.etcd,
            &self.apiserver,
            &self.controller_manager,
            &self.kubectl,
            &self.kwok,
        ]
    }

    pub fn complete(&self) -> bool {
        self.all().iter().all(|p| p.is_file())
    }
}

/// Directory the binaries of this version live in.
pub fn bin_dir() -> PathBuf {
    paths::bin_dir_override().unwrap_or_else(|| paths::cache_root().join("bin").join(KEY))
}

/// The ldflags that make `/version` report the real Kubernetes version.
pub fn ldflags() -> String {
    let minor = K8S_VERSION.split('.').nth(1).unwrap_or("0");
    format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={K8S_VERSION} \
         -X k8s.io/component-base/version.gitMajor=1 \
         -X k8s.io/component-base/version.gitMinor={minor}"
    )
}

fn go_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let go = dir.join("go");
            if go.is_file() {
                return Ok(go);
            }
        }
    }
    let fallback = PathBuf::from("/usr/local/go/bin/go");
    if fallback.is_file() {
        return Ok(fallback);
    }
    Err(DevError::Build(
        "the `go` command (Go >= 1.26) is not on PATH nor in /usr/local/go/bin".into(),
    ))
}

/// Return the binaries, building them first if this machine has none of this version.
/// A file lock makes concurrent callers build once.
pub fn ensure_built() -> Result<Binaries> {
    let dir = bin_dir();
    let bins = Binaries::in_dir(&dir);
    if bins.complete() {
        return Ok(bins);
    }
    if paths::bin_dir_override().is_some() {
        return Err(DevError::Build(format!(
            "ENVBRIDGE_DEV_BIN_DIR={} lacks one of etcd, kube-apiserver, \
             kube-controller-manager, kubectl, kwok",
            dir.display()
        )));
    }
    let root = paths::cache_root();
    let _lock = build_lock(KEY)?;
    let bins = Binaries::in_dir(&dir);
    if bins.complete() {
        return Ok(bins);
    }
    build(&root, &dir)?;
    Ok(Binaries::in_dir(&dir))
}

/// The lock (held while the returned file lives) that makes concurrent callers build the
/// binaries of `key` once.
pub(crate) fn build_lock(key: &str) -> Result<std::fs::File> {
    let bin_root = paths::cache_root().join("bin");
    std::fs::create_dir_all(&bin_root).ctx("creating", &bin_root)?;
    let lock_path = bin_root.join(format!("{key}.lock"));
    let lock = std::fs::File::create(&lock_path).ctx("creating", &lock_path)?;
    lock.lock().ctx("locking", &lock_path)?;
    Ok(lock)
}

fn build(root: &Path, dir: &Path) -> Result<()> {
    let src = write_module(root)?;
    // Not with_extension: the key itself contains dots (v0.8.0).
    let tmp = fresh_dir(&dir.with_file_name(format!("{KEY}.partial")))?;
    let log = dir.with_file_name(format!("{KEY}.build.log"));
    let pkgs: Vec<&str> = PACKAGES.iter().map(|(pkg, _)| *pkg).collect();
    let start = Instant::now();
    go_build(
        &GoBuild {
            src: &src,
            packages: &pkgs,
            out: &tmp,
            log: &log,
            cgo: false,
            tags: "",
        },
        &format!(
            "Kubernetes {K8S_VERSION}, etcd {ETCD_VERSION}, kwok {KWOK_VERSION} into {} \
             (first time on a machine: ~12 min on 2 cores)",
            dir.display()
        ),
    )?;
    let server = tmp.join("server");
    if server.exists() {
        std::fs::rename(&server, tmp.join("etcd")).ctx("renaming", &server)?;
    }
    if !Binaries::in_dir(&tmp).complete() {
        return Err(DevError::Build(format!(
            "`go build` succeeded but {} lacks a binary",
            tmp.display()
        )));
    }
    move_into_place(&tmp, dir)?;
    eprintln!(
        "envbridge: built the control plane binaries in {:.0?}",
        start.elapsed()
    );
    Ok(())
}

/// The plane's Go module written under the cache root (also where a real node's kubelet is
/// built from: one module graph for every Kubernetes binary).
pub(crate) fn write_module(root: &Path) -> Result<PathBuf> {
    let src = root.join("gobuild").join(KEY);
    std::fs::create_dir_all(&src).ctx("creating", &src)?;
    std::fs::write(src.join("go.mod"), GO_MOD).ctx("writing", src.join("go.mod"))?;
    std::fs::write(src.join("go.sum"), GO_SUM).ctx("writing", src.join("go.sum"))?;
    Ok(src)
}

/// An empty directory at `path` (what a failed build left there removed).
pub(crate) fn fresh_dir(path: &Path) -> Result<PathBuf> {
    if path.exists() {
        std::fs::remove_dir_all(path).ctx("removing", path)?;
    }
    std::fs::create_dir_all(path).ctx("creating", path)?;
    Ok(path.to_path_buf())
}

/// The finished build appears atomically: a half-built directory is never taken as built.
pub(crate) fn move_into_place(tmp: &Path, dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).ctx("removing", dir)?;
    }
    std::fs::rename(tmp, dir).ctx("moving into place", dir)
}

/// One `go build` of several packages into `out`.
pub(crate) struct GoBuild<'a> {
    pub src: &'a Path,
    pub packages: &'a [&'a str],
    pub out: &'a Path,
    pub log: &'a Path,
    /// runc's nsenter is C: force cgo on (otherwise Go's default stands).
    pub cgo: bool,
    /// `go build -tags` (empty: none).
    pub tags: &'a str,
}

/// Run `go build -trimpath` with the plane's ldflags, Go's caches under the cache root unless
/// the caller chose others, saying every minute that it still runs.
pub(crate) fn go_build(b: &GoBuild<'_>, what: &str) -> Result<()> {
    let root = paths::cache_root();
    let log_file = std::fs::File::options()
        .create(true)
        .append(true)
        .open(b.log)
        .ctx("creating", b.log)?;
    let log_err = log_file.try_clone().ctx("opening", b.log)?;
    let go = go_binary()?;
    let mut cmd = Command::new(&go);
    cmd.current_dir(b.src)
        .arg("build")
        .arg("-trimpath")
        .arg("-ldflags")
        .arg(ldflags())
        .args(if b.tags.is_empty() {
            Vec::new()
        } else {
            vec!["-tags".to_string(), b.tags.to_string()]
        })
        .arg("-o")
        .arg(format!("{}/", b.out.display()))
        .args(b.packages)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err);
    if b.cgo {
        cmd.env("CGO_ENABLED", "1");
    }
    if std::env::var_os("GOMODCACHE").is_none() {
        cmd.env("GOMODCACHE", root.join("go/mod"));
    }
    if std::env::var_os("GOCACHE").is_none() {
        cmd.env("GOCACHE", root.join("go/build"));
    }
    eprintln!(
        "envbridge: building {what} with {}; log {}",
        go.display(),
        b.log.display()
    );
    let start = Instant::now();
    let mut child = cmd.spawn().ctx("running", &go)?;
    // Say every minute that it is still building: a silent 12 minutes looks like a hang.
    let mut next_note = 60;
    let status = loop {
        if let Some(status) = child.try_wait().ctx("waiting for", &go)? {
            break status;
        }
        if start.elapsed().as_secs() >= next_note {
            eprintln!("envbridge: still building ({} min)", next_note / 60);
            next_note += 60;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    if !status.success() {
        return Err(DevError::Build(format!(
            "`go build` exited with {status}; last lines of {}:\n{}",
            b.log.display(),
            super::process::log_tail(b.log, 30)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_module_pins_the_versions_of_the_key() {
        assert!(KEY.contains(K8S_VERSION) && KEY.contains(ETCD_VERSION));
        assert!(KEY.contains(KWOK_VERSION));
        assert!(GO_MOD.contains(&format!("k8s.io/kubernetes {K8S_VERSION}")));
        assert!(GO_MOD.contains(&format!("sigs.k8s.io/kwok {KWOK_VERSION}")));
        for (pkg, _) in PACKAGES {
            assert!(GO_MOD.contains(pkg), "go.mod has no tool line for {pkg}");
        }
        assert!(ldflags().contains("gitVersion=v1.36.3"));
        assert!(ldflags().contains("gitMinor=36"));
    }

    #[test]
    fn etcd_may_be_named_server() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("server"), "").expect("w");
        assert!(Binaries::in_dir(dir.path()).etcd.ends_with("server"));
        std::fs::write(dir.path().join("etcd"), "").expect("w");
        assert!(Binaries::in_dir(dir.path()).etcd.ends_with("etcd"));
        assert!(!Binaries::in_dir(dir.path()).complete());
    }
}

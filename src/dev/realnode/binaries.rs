//! A real node's programs, built once per machine like the plane's: the kubelet from the
//! plane's own Go module (same Kubernetes version), containerd, its runc shim, ctr, runc and
//! the CNI loopback plugin from the wrapper module tests/cluster/gobuild-node.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::dev::binaries::{self as plane, GoBuild, K8S_VERSION};
use crate::dev::error::{DevError, IoContext, Result};
use crate::dev::paths;

pub const CONTAINERD_VERSION: &str = "v2.2.9";
pub const RUNC_VERSION: &str = "v1.4.4";
pub const CNI_PLUGINS_VERSION: &str = "v1.9.1";
/// Cache key: every pinned version (runc built with seccomp: containerd gives every
/// unprivileged pod's sandbox the runtime's default seccomp profile).
pub const KEY: &str = "node-k8s-v1.36.3-containerd-v2.2.9-runc-v1.4.4-seccomp-cni-v1.9.1";

const GO_MOD: &str = include_str!("../../../tests/cluster/gobuild-node/go.mod");
const GO_SUM: &str = include_str!("../../../tests/cluster/gobuild-node/go.sum");

const KUBELET: &str = "k8s.io/kubernetes/cmd/kubelet";
const RUNC: &str = "github.com/opencontainers/runc";
const SECCOMP_HEADER: &str = "/usr/include/seccomp.h";
/// Everything but runc (which needs cgo) and the kubelet.
const RUNTIME: &[&str] = &[
    "github.com/containerd/containerd/v2/cmd/containerd",
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
    "github.com/containerd/containerd/v2/cmd/ctr",
    "github.com/containernetworking/plugins/plugins/main/loopback",
];

/// The programs of one real node; one directory, also containerd's CNI bin dir and the
/// shim's PATH entry.
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    pub dir: PathBuf,
    pub kubelet: PathBuf,
    pub containerd: PathBuf,
    pub shim: PathBuf,
    pub ctr: PathBuf,
    pub runc: PathBuf,
    pub loopback: PathBuf,
}

impl NodeBinaries {
    pub fn in_dir(dir: &Path) -> Self {
        NodeBinaries {
            dir: dir.to_path_buf(),
            kubelet: dir.join("kubelet"),
            containerd: dir.join("containerd"),
            shim: dir.join("containerd-shim-runc-v2"),
            ctr: dir.join("ctr"),
            runc: dir.join("runc"),
            loopback: dir.join("loopback"),
        }
    }

    pub fn complete(&self) -> bool {
        [
            &self.kubelet,
            &self.containerd,
            &self.shim,
            &self.ctr,
            &self.runc,
            &self.loopback,
        ]
        .iter()
        .all(|p| p.is_file())
    }
}

pub fn bin_dir() -> PathBuf {
    paths::cache_root().join("bin").join(KEY)
}

/// The node binaries, built first when this machine has none of these versions (a file
/// lock makes concurrent callers build once).
pub fn ensure_built() -> Result<NodeBinaries> {
    let dir = bin_dir();
    if NodeBinaries::in_dir(&dir).complete() {
        return Ok(NodeBinaries::in_dir(&dir));
    }
    let root = paths::cache_root();
    let _lock = plane::build_lock(KEY)?;
    if NodeBinaries::in_dir(&dir).complete() {
        return Ok(NodeBinaries::in_dir(&dir));
    }
    let start = Instant::now();
    let tmp = plane::fresh_dir(&dir.with_file_name(format!("{KEY}.partial")))?;
    let log = dir.with_file_name(format!("{KEY}.build.log"));
    let _ = std::fs::remove_file(&log);
    let plane_src = plane::write_module(&root)?;
    plane::go_build(
        &GoBuild {
            src: &plane_src,
            packages: &[KUBELET],
            out: &tmp,
            log: &log,
            cgo: false,
            tags: "",
        },
        &format!("the kubelet {K8S_VERSION} (a real node's; ~5 min the first time)"),
    )?;
    let node_src = root.join("gobuild").join(KEY);
    std::fs::create_dir_all(&node_src).ctx("creating", &node_src)?;
    std::fs::write(node_src.join("go.mod"), GO_MOD).ctx("writing", node_src.join("go.mod"))?;
    std::fs::write(node_src.join("go.sum"), GO_SUM).ctx("writing", node_src.join("go.sum"))?;
    plane::go_build(
        &GoBuild {
            src: &node_src,
            packages: RUNTIME,
            out: &tmp,
            log: &log,
            cgo: false,
            tags: "",
        },
        &format!(
            "containerd {CONTAINERD_VERSION} and the CNI loopback plugin {CNI_PLUGINS_VERSION}"
        ),
    )?;
    if !Path::new(SECCOMP_HEADER).is_file() {
        return Err(DevError::Build(format!(
            "runc needs libseccomp's headers ({SECCOMP_HEADER}): install Debian's libseccomp-dev \
             (scripts/test.sh does)"
        )));
    }
    plane::go_build(
        &GoBuild {
            src: &node_src,
            packages: &[RUNC],
            out: &tmp,
            log: &log,
            cgo: true,
            tags: "seccomp",
        },
        &format!("runc {RUNC_VERSION} (cgo, seccomp)"),
    )?;
    if !NodeBinaries::in_dir(&tmp).complete() {
        return Err(DevError::Build(format!(
            "`go build` succeeded but {} lacks one of kubelet, containerd, \
             containerd-shim-runc-v2, ctr, runc, loopback",
            tmp.display()
        )));
    }
    plane::move_into_place(&tmp, &dir)?;
    eprintln!(
        "envbridge: built the real node binaries in {:.0?}",
        start.elapsed()
    );
    Ok(NodeBinaries::in_dir(&dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_module_pins_the_versions_of_the_key() {
        assert!(KEY.contains(K8S_VERSION) && KEY.contains(CONTAINERD_VERSION));
        assert!(KEY.contains(RUNC_VERSION) && KEY.contains(CNI_PLUGINS_VERSION));
        assert!(GO_MOD.contains(&format!(
            "github.com/containerd/containerd/v2 {CONTAINERD_VERSION}"
        )));
        assert!(GO_MOD.contains(&format!("github.com/opencontainers/runc {RUNC_VERSION}")));
        assert!(GO_MOD.contains(&format!(
            "github.com/containernetworking/plugins {CNI_PLUGINS_VERSION}"
        )));
        for pkg in RUNTIME.iter().chain([&RUNC]) {
            assert!(GO_MOD.contains(pkg), "go.mod has no tool line for {pkg}");
        }
    }
}

//! The state file (state.json) recording what `dev up` started.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{DevError, IoContext, Result};

/// One started process; it leads its own process group (pgid == pid).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Component {
    pub name: String,
    pub pid: u32,
    pub binary: PathBuf,
    pub log: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PlaneState {
    /// Versions key of the binaries (see binaries::KEY).
    pub versions: String,
    pub bin_dir: PathBuf,
    pub apiserver_port: u16,
    pub etcd_client_port: u16,
    pub etcd_peer_port: u16,
    pub kubeconfig: PathBuf,
    pub nodes: u32,
    /// kwok processes, each managing the simulated nodes of its shard (a plane recorded
    /// before shards had one).
    #[serde(default = "one")]
    pub kwok_shards: u32,
    /// Whether kwok reaches the apiserver through a watch relay (`dev watch-relay`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kwok_relay: bool,
    pub components: Vec<Component>,
    /// Flags appended to kube-apiserver's (a private plane's own limits); kept so that a
    /// restarted apiserver runs as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apiserver_extra_args: Vec<String>,
    /// Real nodes (a containerd and a kubelet each), besides the kwok `nodes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub real_nodes: Vec<super::realnode::RealNodeState>,
}

pub const FILE: &str = "state.json";

#[cfg(test)]
impl PlaneState {
    /// A recorded plane of one kwok and no process, with these extra apiserver flags.
    pub fn sample(apiserver_extra_args: Vec<String>) -> PlaneState {
        PlaneState {
            versions: "k".into(),
            bin_dir: "/b".into(),
            apiserver_port: 1,
            etcd_client_port: 2,
            etcd_peer_port: 3,
            kubeconfig: "/k".into(),
            nodes: 4,
            kwok_shards: 1,
            kwok_relay: false,
            components: Vec::new(),
            apiserver_extra_args,
            real_nodes: Vec::new(),
        }
    }
}

fn one() -> u32 {
    1
}

pub fn load(dir: &Path) -> Result<Option<PlaneState>> {
    let path = dir.join(FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| DevError::State {
                path,
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).ctx("reading", path),
    }
}

/// Write atomically (temp file + rename) so a reader never sees half a file.
pub fn save(dir: &Path, state: &PlaneState) -> Result<()> {
    let path = dir.join(FILE);
    let tmp = dir.join(format!("{FILE}.tmp"));
    let json = serde_json::to_vec_pretty(state).map_err(|e| DevError::State {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    std::fs::write(&tmp, json).ctx("writing", &tmp)?;
    std::fs::rename(&tmp, &path).ctx("renaming into place", &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reports_corruption() {
        let dir = tempfile::tempdir().expect("tmp");
        assert_eq!(load(dir.path()).expect("empty"), None);
        let s = PlaneState {
            kwok_shards: 3,
            components: vec![Component {
                name: "etcd".into(),
                pid: 5,
                binary: "/b/etcd".into(),
                log: "/l".into(),
            }],
            ..PlaneState::sample(vec!["--max-requests-inflight=10".into()])
        };
        save(dir.path(), &s).expect("save");
        assert_eq!(load(dir.path()).expect("load"), Some(s.clone()));
        // A plane recorded before kwok shards ran one kwok.
        let mut old = serde_json::to_value(&s).expect("json");
        old.as_object_mut().expect("object").remove("kwok_shards");
        std::fs::write(dir.path().join(FILE), old.to_string()).expect("old");
        assert_eq!(
            load(dir.path()).expect("old").map(|s| s.kwok_shards),
            Some(1)
        );
        std::fs::write(dir.path().join(FILE), "{").expect("corrupt");
        let err = load(dir.path()).expect_err("corrupt");
        assert!(err.to_string().contains("state.json"), "{err}");
    }
}

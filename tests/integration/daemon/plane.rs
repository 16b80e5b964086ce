//! A PRIVATE control plane for one test (its own state directory, processes and free
//! loopback ports), for faults that must not touch the shared plane other tests use:
//! stopping and restarting the apiserver, or an apiserver with its own limits. Torn down
//! (`dev::down_in`) when dropped, also when the test panics.

use std::path::{Path, PathBuf};
use std::time::Duration;

use envbridge::dev::{self, ClusterInfo};
use kube::Client;

pub struct PrivatePlane {
    pub info: ClusterInfo,
    guard: Guard,
}

/// Brings the plane down and removes its directory; exists before the plane starts, so a
/// start that panics half-way is cleaned up as well.
struct Guard {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Err(e) = dev::down_in(&self.dir) {
            eprintln!("private plane {}: down failed: {e}", self.dir.display());
        }
    }
}

impl PrivatePlane {
    /// Starts a plane with `nodes` simulated nodes and `apiserver_args` appended to
    /// kube-apiserver's flags.
    pub async fn start(nodes: u32, apiserver_args: &[&str]) -> PrivatePlane {
        let tmp = tempfile::Builder::new()
            .prefix("envbridge-private-plane-")
            .tempdir()
            .expect("a temporary directory");
        // The lock file `<dir>.lock` lands beside the state directory: inside `tmp` too.
        let guard = Guard {
            dir: tmp.path().join("dev"),
            _tmp: tmp,
        };
        let args: Vec<String> = apiserver_args.iter().map(|a| a.to_string()).collect();
        let info = dev::ensure_up_in(&guard.dir, nodes, &args)
            .await
            .unwrap_or_else(|e| panic!("a private control plane cannot start: {e}"));
        PrivatePlane { info, guard }
    }

    pub fn dir(&self) -> &Path {
        &self.guard.dir
    }

    /// An admin client of this plane.
    pub async fn client(&self) -> Client {
        dev::client_for(&self.info.kubeconfig)
            .await
            .expect("a client of the private plane")
    }

    /// Stops (SIGTERM, SIGKILL after `grace`) only the apiserver process; returns its pid.
    pub async fn stop_apiserver(&self, grace: Duration) -> u32 {
        let dir = self.dir().to_path_buf();
        tokio::task::spawn_blocking(move || dev::stop_apiserver(&dir, grace))
            .await
            .expect("stop task")
            .expect("stopping the apiserver")
    }

    /// Starts the apiserver again on its port, against the same etcd; returns when ready.
    pub async fn start_apiserver(&self) -> ClusterInfo {
        dev::start_apiserver(self.dir())
            .await
            .expect("restarting the apiserver")
    }
}

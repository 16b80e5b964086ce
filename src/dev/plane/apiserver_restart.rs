//! Stopping (gracefully) and restarting only the kube-apiserver of a PRIVATE plane (a
//! directory of its own), for fault tests: other tests share the default plane. Test
//! scaffolding, behind the `test-support` feature. The restart is the general one of
//! [`super::restart`]; a crash instead of a stop is `kill_component(dir, "kube-apiserver")`.

use std::path::Path;
use std::time::Duration;

use super::APISERVER;
use super::restart::{component, recorded, restart_component};
use super::{ClusterInfo, lock};
use crate::dev::error::{DevError, Result};
use crate::dev::process;

/// Stops only the kube-apiserver of the plane in `dir` (SIGTERM to its process group,
/// SIGKILL after `grace`); etcd, the controller manager and kwok keep running, and the
/// state keeps its port so that [`start_apiserver`] brings it back there. Returns the pid
/// that was stopped. For fault tests on a PRIVATE plane: other tests share the default one.
pub fn stop_apiserver(dir: &Path, grace: Duration) -> Result<u32> {
    let _lock = lock(dir)?;
    let st = recorded(dir)?;
    let c = component(&st, APISERVER)?;
    if !process::alive(c.pid, &c.binary) {
        return Err(DevError::Invalid(format!(
            "{APISERVER} (pid {}) is not running",
            c.pid
        )));
    }
    let killed = process::stop_groups(&[c.pid], grace);
    eprintln!(
        "envbridge: stopped {APISERVER} (pid {}){}",
        c.pid,
        if killed.is_empty() {
            ""
        } else {
            " with SIGKILL"
        }
    );
    Ok(c.pid)
}

/// Starts the kube-apiserver of the plane in `dir` again, with the recorded flags, on the
/// recorded port, against the same etcd; returns once /readyz is ok. An error when it runs.
pub async fn start_apiserver(dir: &Path) -> Result<ClusterInfo> {
    restart_component(dir, APISERVER).await
}

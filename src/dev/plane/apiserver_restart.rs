//! Stopping and restarting only the kube-apiserver of a PRIVATE plane (a directory of its
//! own), for fault tests: other tests share the default plane. Test scaffolding, behind the
//! `test-support` feature.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{
    ClusterInfo, apiserver_args, client_for, died, info_of, launch, lock, lock_async, pki,
    wait_apiserver_ready,
};
use crate::dev::error::{DevError, Result};
use crate::dev::process;
use crate::dev::state::{self, Component, PlaneState};

const APISERVER: &str = "kube-apiserver";

fn recorded(dir: &Path) -> Result<PlaneState> {
    state::load(dir)?
        .ok_or_else(|| DevError::NotReady(format!("no control plane in {}", dir.display())))
}

fn component<'a>(st: &'a PlaneState, name: &str) -> Result<&'a Component> {
    st.components
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| DevError::NotReady(format!("no {name} recorded")))
}

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
    let _lock = lock_async(dir).await?;
    let mut st = recorded(dir)?;
    let old = component(&st, APISERVER)?.clone();
    if process::alive(old.pid, &old.binary) {
        return Err(DevError::Invalid(format!(
            "{APISERVER} (pid {}) is still running",
            old.pid
        )));
    }
    let etcd = component(&st, "etcd")?.clone();
    if !process::alive(etcd.pid, &etcd.binary) {
        return Err(died(&etcd, "not running"));
    }
    // The port was ours until the apiserver died; wait for the kernel to release it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while process::port_open(st.apiserver_port) {
        if Instant::now() > deadline {
            return Err(DevError::Invalid(format!(
                "port {} is still taken",
                st.apiserver_port
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    st.components.retain(|c| c.name != APISERVER);
    let args = apiserver_args(dir, &st, &pki::files(&dir.join("pki")));
    let apiserver = launch(APISERVER, &old.binary, args, dir, &mut st)?;
    let client = client_for(&st.kubeconfig).await?;
    wait_apiserver_ready(&client, &apiserver, &etcd).await?;
    eprintln!(
        "envbridge: {APISERVER} restarted (pid {}) at https://127.0.0.1:{}",
        apiserver.pid, st.apiserver_port
    );
    Ok(info_of(&st, dir))
}

//! Crashing (SIGKILL) and restarting etcd or kube-apiserver of a PRIVATE plane, for fault
//! tests: other tests share the default plane. Test scaffolding, behind `test-support`.
//!
//! A restarted component gets the flags it had, its ports and its data: kube-apiserver's from
//! [`apiserver_args`] (what `dev up` itself passes, from the recorded state), etcd's argv as
//! read from `/proc/<pid>/cmdline` by [`kill_component`] just before the kill (the state file
//! records no etcd flags, and copying `dev up`'s list here would drift from it).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{
    APISERVER, ClusterInfo, READY_TIMEOUT, apiserver_args, client_for, died, info_of, launch, lock,
    lock_async, pki, wait_apiserver_ready,
};
use crate::dev::error::{DevError, IoContext, Result};
use crate::dev::process;
use crate::dev::state::{self, Component, PlaneState};

mod serving;

const ETCD: &str = "etcd";

pub(super) fn recorded(dir: &Path) -> Result<PlaneState> {
    state::load(dir)?
        .ok_or_else(|| DevError::NotReady(format!("no control plane in {}", dir.display())))
}

pub(super) fn component<'a>(st: &'a PlaneState, name: &str) -> Result<&'a Component> {
    st.components
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| DevError::NotReady(format!("no {name} recorded")))
}

/// The component names this module restarts, as the `&'static str` that `launch` records.
fn restartable(name: &str) -> Result<&'static str> {
    match name {
        ETCD => Ok(ETCD),
        APISERVER => Ok(APISERVER),
        _ => Err(DevError::Invalid(format!(
            "only {ETCD} and {APISERVER} can be killed and restarted, not {name:?}"
        ))),
    }
}

/// Where [`kill_component`] keeps the argv of a killed component (inside the state
/// directory, so `down_in` removes it with the rest).
fn argv_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.argv.json"))
}

/// The arguments (argv[1..]) `pid` runs with.
fn read_argv(pid: u32) -> Result<Vec<String>> {
    let path = PathBuf::from(format!("/proc/{pid}/cmdline"));
    let raw = std::fs::read(&path).ctx("reading", &path)?;
    // Each argument ends with a NUL (an empty argument is an empty field).
    let raw = raw.strip_suffix(&[0]).unwrap_or(&raw);
    Ok(raw
        .split(|b| *b == 0)
        .skip(1)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect())
}

/// SIGKILLs the process group of `name` (`etcd` or `kube-apiserver`) of the plane in `dir`
/// at once, no SIGTERM first: a crash, not a stop (etcd gets no chance to close its WAL, the
/// apiserver none to drain). Waits until the group is gone; returns the killed pid. The state
/// keeps the component (dead), so [`restart_component`] brings it back on the same ports.
pub fn kill_component(dir: &Path, name: &str) -> Result<u32> {
    let name = restartable(name)?;
    let _lock = lock(dir)?;
    let st = recorded(dir)?;
    let c = component(&st, name)?;
    if !process::alive(c.pid, &c.binary) {
        return Err(DevError::Invalid(format!(
            "{name} (pid {}) is not running",
            c.pid
        )));
    }
    if name == ETCD {
        let argv = serde_json::to_vec(&read_argv(c.pid)?)
            .map_err(|e| DevError::Invalid(format!("encoding {name}'s argv: {e}")))?;
        let path = argv_file(dir, name);
        std::fs::write(&path, argv).ctx("writing", &path)?;
    }
    let pgid = i32::try_from(c.pid)
        .map_err(|_| DevError::Invalid(format!("pid {} out of range", c.pid)))?;
    // SAFETY: signals the process group we started (alive() checked its leader just above).
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
    // Only waits (and reaps): the group is already dying, a SIGTERM more changes nothing.
    process::stop_groups(&[c.pid], Duration::ZERO);
    eprintln!("envbridge: killed {name} (pid {}) with SIGKILL", c.pid);
    Ok(c.pid)
}

/// The flags `name` is restarted with (see the module's doc).
fn args_for(dir: &Path, st: &PlaneState, name: &str) -> Result<Vec<String>> {
    if name == APISERVER {
        return Ok(apiserver_args(dir, st, &pki::files(&dir.join("pki"))));
    }
    let path = argv_file(dir, name);
    let raw = std::fs::read(&path).map_err(|e| {
        DevError::Invalid(format!(
            "{name}'s flags were not recorded ({}: {e}); restart it only after kill_component",
            path.display()
        ))
    })?;
    serde_json::from_slice(&raw).map_err(|e| DevError::State {
        path,
        reason: e.to_string(),
    })
}

/// The ports `name` listens on, as recorded.
fn ports_of(st: &PlaneState, name: &str) -> Vec<u16> {
    match name {
        ETCD => vec![st.etcd_client_port, st.etcd_peer_port],
        _ => vec![st.apiserver_port],
    }
}

/// The ports were the dead process's; a listener is closed with it, but wait until nothing
/// answers there, or the new process would fail to bind (or we would probe the wrong one).
async fn wait_ports_free(ports: &[u16]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for &port in ports {
        while process::port_open(port) {
            if Instant::now() > deadline {
                return Err(DevError::Invalid(format!("port {port} is still taken")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// True when etcd's `/health` on 127.0.0.1:`port` (plain HTTP, as `dev up` runs it) says
/// `"health":"true"`: it has a leader and serves reads.
async fn etcd_healthy(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut body = Vec::new();
        s.read_to_end(&mut body).await?;
        std::io::Result::Ok(String::from_utf8_lossy(&body).contains(r#""health":"true""#))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Ok(true))
    )
}

async fn wait_etcd_healthy(etcd: &Component, port: u16) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while !etcd_healthy(port).await {
        if !process::alive(etcd.pid, &etcd.binary) {
            return Err(died(etcd, "exited"));
        }
        if Instant::now() > deadline {
            return Err(died(etcd, "/health not ok"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Starts `name` (`etcd` or `kube-apiserver`) of the plane in `dir` again, after
/// [`kill_component`] (or, for the apiserver, `stop_apiserver`): same binary, flags, ports
/// and data directory. Returns once it is healthy: for the apiserver `/readyz`; for etcd its
/// `/health`, then, when the apiserver runs, its `/readyz` and a LIST of every resource (see
/// [`serving`]: the apiserver's etcd clients reconnect one by one, up to a minute or more
/// after a long outage). An error when it still runs.
pub async fn restart_component(dir: &Path, name: &str) -> Result<ClusterInfo> {
    let name = restartable(name)?;
    let t0 = Instant::now();
    let _lock = lock_async(dir).await?;
    let mut st = recorded(dir)?;
    let old = component(&st, name)?.clone();
    if process::alive(old.pid, &old.binary) {
        return Err(DevError::Invalid(format!(
            "{name} (pid {}) is still running",
            old.pid
        )));
    }
    let args = args_for(dir, &st, name)?;
    if name == APISERVER {
        let etcd = component(&st, ETCD)?;
        if !process::alive(etcd.pid, &etcd.binary) {
            return Err(DevError::Invalid(format!(
                "{ETCD} (pid {}) is not running: restart it first",
                etcd.pid
            )));
        }
    }
    wait_ports_free(&ports_of(&st, name)).await?;
    st.components.retain(|c| c.name != name);
    let new = launch(name, &old.binary, args, dir, &mut st)?;
    let etcd = component(&st, ETCD)?.clone();
    if name == ETCD {
        wait_etcd_healthy(&etcd, st.etcd_client_port).await?;
        eprintln!(
            "envbridge: {ETCD} restarted (pid {}), /health ok after {:.1?}",
            new.pid,
            t0.elapsed()
        );
    }
    let apiserver = component(&st, APISERVER)?.clone();
    if process::alive(apiserver.pid, &apiserver.binary) {
        let client = client_for(&st.kubeconfig).await?;
        wait_apiserver_ready(&client, &apiserver, &etcd).await?;
        let what = if name == ETCD {
            serving::wait_serving_all(&client, t0 + READY_TIMEOUT).await?;
            "serving every resource"
        } else {
            "ready"
        };
        eprintln!(
            "envbridge: {APISERVER} (pid {}) {what} at https://127.0.0.1:{} {:.1?} after {name} restarted",
            apiserver.pid,
            st.apiserver_port,
            t0.elapsed()
        );
    }
    Ok(info_of(&st, dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_argv_and_refuses_other_components() {
        let argv = read_argv(std::process::id()).expect("own cmdline");
        let want: Vec<String> = std::env::args().skip(1).collect();
        assert_eq!(argv, want);
        assert!(restartable("kwok").is_err());
        assert_eq!(restartable("etcd").expect("etcd"), ETCD);
    }
}

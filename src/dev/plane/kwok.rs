//! kwok in shards: each kwok process manages the simulated nodes labelled with its shard.
//!
//! One kwok takes every pod event through one goroutine (its Stage matching), fed without a
//! buffer by the goroutine that reads its watch. When pod events come faster than that
//! goroutine takes them (10,000 pods created in 80 s; a teardown's 108 deletes a second) the
//! apiserver cuts kwok's watch off as unresponsive, kwok is sent everything since again and
//! falls further behind (docs/benchmarks.md, issue 23). A site has a kubelet per node, which
//! never lags this way; `dev up --kwok-shards K` gives K kwoks a share of the nodes each.
//! Each still reads every pod event (kwok watches all bound pods) but matches stages only for
//! its own nodes' pods: K times the decoding. On this 2-core machine that cost more than the
//! one goroutine did (docs/benchmarks.md, "kwok in shards"), so a plane has one kwok unless
//! asked. `dev up --kwok-relay` instead puts the watch relay (`dev::watch_relay`) between
//! kwok and the apiserver: kwok lags as before, but is never cut off for it.

use std::path::{Path, PathBuf};

use super::{STARTED_TIMEOUT, launch, launch_with_env, s};
use crate::dev::addressing::{self, KWOK_NODE_LABEL, KWOK_SHARD_LABEL};
use crate::dev::binaries::Binaries;
use crate::dev::error::{IoContext, Result};
use crate::dev::state::{Component, PlaneState};
use crate::dev::{kubeconfig, pki, process};

/// The component name of the watch relay in front of kwok.
pub const RELAY: &str = "kwok-relay";
/// kwok's kubeconfig when it goes through the relay.
const RELAY_KUBECONFIG: &str = "kwok-relay.kubeconfig";

/// kwok processes of a plane started without `--kwok-shards`.
pub const DEFAULT_SHARDS: u32 = 1;

/// The component name of shard `shard`: `kwok` for the first (its log stays `kwok.log`),
/// then `kwok-2`, `kwok-3` ...
pub fn component_name(shard: u32) -> String {
    match shard {
        0 => "kwok".to_string(),
        n => format!("kwok-{}", n + 1),
    }
}

/// The node label selector of shard `shard` of `shards`.
fn selector(shard: u32, shards: u32) -> String {
    let kwok = format!("{}={}", KWOK_NODE_LABEL.0, KWOK_NODE_LABEL.1);
    match shards {
        0 | 1 => kwok,
        _ => format!("{kwok},{KWOK_SHARD_LABEL}={shard}"),
    }
}

fn args(dir: &Path, kubeconfig: &Path, shard: u32, shards: u32) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", dir.join("kwok.yaml").display()),
        s("--manage-all-nodes=false"),
        format!(
            "--manage-nodes-with-label-selector={}",
            selector(shard, shards)
        ),
        format!("--cidr={}", addressing::FALLBACK_POD_CIDR),
        format!("--node-ip={}", addressing::FALLBACK_NODE_IP),
    ]
}

/// Starts the watch relay kwok will reach the apiserver through (`exe dev watch-relay` on a
/// free loopback port) and writes kwok's kubeconfig for it; waits for its port.
pub(super) async fn launch_relay(
    exe: &Path,
    dir: &Path,
    pki: &pki::PkiFiles,
    st: &mut PlaneState,
) -> Result<Component> {
    let mut port = process::free_port()?;
    while [st.apiserver_port, st.etcd_client_port, st.etcd_peer_port].contains(&port) {
        port = process::free_port()?;
    }
    let path = dir.join(RELAY_KUBECONFIG);
    let server = format!("https://127.0.0.1:{port}");
    std::fs::write(
        &path,
        kubeconfig::render(&server, &pki.ca_cert, &pki.admin_cert, &pki.admin_key),
    )
    .ctx("writing", &path)?;
    let relay = launch(
        RELAY,
        exe,
        vec![
            s("dev"),
            s("watch-relay"),
            format!("--listen=127.0.0.1:{port}"),
            format!("--upstream=127.0.0.1:{}", st.apiserver_port),
        ],
        dir,
        st,
    )?;
    process::wait_started(&relay, "port", STARTED_TIMEOUT, || process::port_open(port)).await?;
    Ok(relay)
}

/// Starts the plane's `st.kwok_shards` kwok processes, recording each: through the relay,
/// over HTTP/1.1, when the plane has one (HTTP/2's flow control would hold the apiserver
/// back at kwok's pace whatever the relay holds).
pub(super) fn launch_all(
    bins: &Binaries,
    dir: &Path,
    st: &mut PlaneState,
) -> Result<Vec<Component>> {
    let shards = st.kwok_shards.max(1);
    let (kubeconfig, env): (PathBuf, &[(&str, &str)]) = if st.kwok_relay {
        (dir.join(RELAY_KUBECONFIG), &[("DISABLE_HTTP2", "1")])
    } else {
        (st.kubeconfig.clone(), &[])
    };
    (0..shards)
        .map(|shard| {
            launch_with_env(
                &component_name(shard),
                &bins.kwok,
                args(dir, &kubeconfig, shard, shards),
                env,
                dir,
                st,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_kwok_selects_every_simulated_node_and_shards_their_share() {
        assert_eq!(selector(0, 1), "type=kwok");
        assert_eq!(selector(2, 3), "type=kwok,envbridge.dev/kwok-shard=2");
        assert_eq!(
            (0..3).map(component_name).collect::<Vec<_>>(),
            ["kwok", "kwok-2", "kwok-3"]
        );
    }
}

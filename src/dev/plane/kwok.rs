//! kwok in shards: each kwok process manages the simulated nodes labelled with its shard.
//!
//! One kwok takes every pod event through one goroutine (its Stage matching), fed without a
//! buffer by the goroutine that reads its watch. When pod events come faster than that
//! goroutine takes them (10,000 pods created in 80 s; a teardown's 108 deletes a second) the
//! apiserver cuts kwok's watch off as unresponsive, kwok is sent everything since again and
//! falls further behind (docs/benchmarks.md, issue 23). A site has a kubelet per node, which
//! never lags this way; so the plane gives each [`NODES_PER_SHARD`] nodes a kwok of their own.
//! Each still reads every pod event (kwok watches all bound pods) but matches stages only for
//! its own nodes' pods.

use std::path::Path;

use super::{launch, s};
use crate::dev::addressing::{self, KWOK_NODE_LABEL, KWOK_SHARD_LABEL};
use crate::dev::binaries::Binaries;
use crate::dev::error::Result;
use crate::dev::state::{Component, PlaneState};

/// Simulated nodes a kwok process manages at most, for a plane's default shard count: up to
/// this many one kwok, as before shards; 1,250 nodes get three.
pub const NODES_PER_SHARD: u32 = 500;

/// kwok processes for a plane started with `nodes` simulated nodes.
pub fn shards_for(nodes: u32) -> u32 {
    nodes.div_ceil(NODES_PER_SHARD).max(1)
}

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

/// Starts the plane's `st.kwok_shards` kwok processes, recording each.
pub(super) fn launch_all(
    bins: &Binaries,
    dir: &Path,
    st: &mut PlaneState,
) -> Result<Vec<Component>> {
    let shards = st.kwok_shards.max(1);
    let kubeconfig = st.kubeconfig.clone();
    (0..shards)
        .map(|shard| {
            launch(
                &component_name(shard),
                &bins.kwok,
                args(dir, &kubeconfig, shard, shards),
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
    fn one_kwok_up_to_a_shard_of_nodes_then_one_per_share() {
        assert_eq!(shards_for(0), 1);
        assert_eq!(shards_for(NODES_PER_SHARD), 1);
        assert_eq!(shards_for(NODES_PER_SHARD + 1), 2);
        assert_eq!(shards_for(1250), 3);
        assert_eq!(selector(0, 1), "type=kwok");
        assert_eq!(selector(2, 3), "type=kwok,envbridge.dev/kwok-shard=2");
        assert_eq!(
            (0..3).map(component_name).collect::<Vec<_>>(),
            ["kwok", "kwok-2", "kwok-3"]
        );
    }
}

//! The local plane a benchmark needs, reused without a write when it is there.

use envbridge::dev::{ClusterInfo, UpSpec};
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::Res;

/// The running plane as it is when it has `real_nodes` live real nodes and the kwok nodes
/// `kwok_hosts` Ready (nothing written: no image re-import); otherwise what is missing is
/// started (`ensure_up_with`, the images of this bench's envbridge). Also says whether the
/// plane was started from nothing (the caller then stops it).
pub async fn reuse_or_start(real_nodes: usize, kwok_hosts: &[&str]) -> Res<(ClusterInfo, bool)> {
    let found = envbridge::dev::current()?;
    if let Some(info) = &found
        && ready(info, real_nodes, kwok_hosts).await
    {
        println!(
            "reusing the running control plane ({}) as it is",
            info.state_dir.display()
        );
        return Ok((info.clone(), false));
    }
    let spec = UpSpec {
        nodes: found
            .as_ref()
            .map_or(0, |i| i.nodes)
            .max(kwok_hosts.len() as u32),
        real_nodes: real_nodes as u32,
        exe: Some(env!("CARGO_BIN_EXE_envbridge").into()),
        ..Default::default()
    };
    println!("starting what the control plane lacks: {spec:?}");
    let info = envbridge::dev::ensure_up_with(&spec).await?;
    Ok((info, found.is_none()))
}

/// Whether the recorded plane answers, with the nodes asked for Ready.
async fn ready(info: &ClusterInfo, real_nodes: usize, kwok_hosts: &[&str]) -> bool {
    let Ok(real) = envbridge::dev::real_nodes() else {
        return false;
    };
    let real: Vec<String> = real
        .iter()
        .filter(|n| n.alive())
        .map(|n| n.name.clone())
        .collect();
    let Ok(client) = envbridge::dev::client_for(&info.kubeconfig).await else {
        return false;
    };
    let Ok(nodes) = Api::<Node>::all(client).list(&Default::default()).await else {
        return false;
    };
    let is_ready = |name: &str| {
        nodes.items.iter().any(|n| {
            n.metadata.name.as_deref() == Some(name)
                && n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
    };
    real.iter().filter(|n| is_ready(n)).count() >= real_nodes
        && kwok_hosts
            .iter()
            .all(|h| is_ready(&format!("{h}.cluster.local")))
}

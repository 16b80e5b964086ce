//! The simulated kwok nodes: created with their loopback addresses, then driven by kwok.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};

use super::addressing::{self, HOST_LABEL, KWOK_NODE_LABEL, KWOK_SHARD_LABEL, NODE_KIND_LABEL};
use super::error::{DevError, Result};

/// A Node named `name` with `labels`, its loopback InternalIP `ip` and its host name as
/// addresses (a node's status may be set on create, as the kubelet does; kwok and a kubelet
/// with an external cloud provider keep them).
fn node(
    name: String,
    ip: std::net::Ipv4Addr,
    labels: Vec<(&str, String)>,
    annotations: Option<BTreeMap<String, String>>,
    spec: Option<NodeSpec>,
) -> Node {
    let mut all: BTreeMap<String, String> = labels
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    all.insert("kubernetes.io/hostname".into(), name.clone());
    all.insert("kubernetes.io/os".into(), "linux".into());
    all.insert("kubernetes.io/arch".into(), "amd64".into());
    Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(all),
            annotations,
            ..Default::default()
        },
        spec,
        status: Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip.to_string(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name,
                },
            ]),
            ..Default::default()
        }),
    }
}

/// The Node object for node `n` (1-based) on a plane of `kwok_shards` kwok processes.
pub fn node_object(n: u32, kwok_shards: u32) -> Result<Node> {
    let ip = addressing::node_ip(n).ok_or_else(|| {
        DevError::Invalid(format!(
            "node index {n} outside 1..={}",
            addressing::MAX_NODES
        ))
    })?;
    let cidr = addressing::pod_cidr(n)
        .ok_or_else(|| DevError::Invalid(format!("node index {n} has no pod CIDR")))?;
    let annotations = BTreeMap::from([
        ("kwok.x-k8s.io/node".to_string(), "fake".to_string()),
        ("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string()),
    ]);
    let mut labels = vec![
        (HOST_LABEL, addressing::host_name(n)),
        (KWOK_NODE_LABEL.0, KWOK_NODE_LABEL.1.to_string()),
        (NODE_KIND_LABEL, addressing::NODE_KIND_SIMULATED.to_string()),
    ];
    if let Some(shard) = addressing::kwok_shard(n, kwok_shards) {
        labels.push((KWOK_SHARD_LABEL, shard.to_string()));
    }
    let spec = NodeSpec {
        pod_cidr: Some(cidr.clone()),
        pod_cidrs: Some(vec![cidr]),
        ..Default::default()
    };
    Ok(node(
        addressing::node_name(n),
        ip,
        labels,
        Some(annotations),
        Some(spec),
    ))
}

/// The Node object of real node `r` (1-based), created before its kubelet starts: the
/// kubelet refuses a loopback `--node-ip`, so the node's loopback InternalIP is set here and
/// kept (`--cloud-provider=external`). No kwok label: kwok leaves it alone.
pub fn real_node_object(r: u32, ip: std::net::Ipv4Addr) -> Result<Node> {
    if r == 0 || r > addressing::MAX_REAL_NODES {
        return Err(DevError::Invalid(format!(
            "real node index {r} outside 1..={}",
            addressing::MAX_REAL_NODES
        )));
    }
    let labels = vec![
        (HOST_LABEL, addressing::real_host_name(r)),
        (NODE_KIND_LABEL, addressing::NODE_KIND_REAL.to_string()),
    ];
    Ok(node(addressing::real_node_name(r), ip, labels, None, None))
}

/// Create nodes 1..=count that do not exist yet, each labelled for its kwok shard.
pub async fn ensure_nodes(client: &Client, count: u32, kwok_shards: u32) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let existing = existing_indices(&api).await?;
    let missing: Vec<u32> = (1..=count).filter(|n| !existing.contains(n)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("envbridge: creating {} simulated node(s)", missing.len());
    futures::stream::iter(missing)
        .map(|n| {
            let api = api.clone();
            async move {
                let node = node_object(n, kwok_shards)?;
                match api.create(&PostParams::default(), &node).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) => Err(DevError::from(e)),
                }
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Labels node `n` with the host name a workflow uses for it (`envbridge.dev/host`), for
/// hosts not named like the local plane's nodes (`alio2-cr1-flp001`).
pub async fn label_host(client: &Client, n: u32, host: &str) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({"metadata": {"labels": {HOST_LABEL: host}}});
    api.patch(
        &addressing::node_name(n),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// The node index each host gets: a host named like a node of the local plane (`flp007`)
/// gets that node; any other host the next index after those, in the order given.
pub fn host_indices(hosts: &[String]) -> Vec<(u32, String)> {
    let own = |h: &str| addressing::node_index(&format!("{h}.cluster.local"));
    let mut next = hosts.iter().filter_map(|h| own(h)).max().unwrap_or(0);
    hosts
        .iter()
        .map(|h| match own(h) {
            Some(n) => (n, h.clone()),
            None => {
                next += 1;
                (next, h.clone())
            }
        })
        .collect()
}

async fn existing_indices(api: &Api<Node>) -> Result<Vec<u32>> {
    let list = api
        .list_metadata(&ListParams::default().labels(HOST_LABEL))
        .await?;
    Ok(list
        .items
        .iter()
        .filter_map(|n| n.metadata.name.as_deref().and_then(addressing::node_index))
        .collect())
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Number of our nodes (by label) that are Ready.
pub async fn ready_count(client: &Client) -> Result<(u32, u32)> {
    let api: Api<Node> = Api::all(client.clone());
    let list = api.list(&ListParams::default().labels(HOST_LABEL)).await?;
    let total = u32::try_from(list.items.len()).unwrap_or(u32::MAX);
    let ready = list.items.iter().filter(|n| is_ready(n)).count();
    Ok((u32::try_from(ready).unwrap_or(u32::MAX), total))
}

/// Wait until nodes 1..=count are all Ready (kwok initialised them).
/// `check` is called each round and aborts the wait with its error (e.g. kwok died).
pub async fn wait_ready(
    client: &Client,
    count: u32,
    timeout: Duration,
    check: impl Fn() -> Result<()>,
) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let start = Instant::now();
    loop {
        let list = api.list(&ListParams::default().labels(HOST_LABEL)).await?;
        let ready = list
            .items
            .iter()
            .filter(|n| {
                is_ready(n)
                    && n.metadata
                        .name
                        .as_deref()
                        .and_then(addressing::node_index)
                        .is_some_and(|i| i <= count)
            })
            .count();
        if u32::try_from(ready).unwrap_or(0) >= count {
            return Ok(());
        }
        check()?;
        if start.elapsed() > timeout {
            return Err(DevError::NotReady(format!(
                "only {ready} of {count} nodes Ready after {timeout:?} (see kwok*.log)"
            )));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_object_carries_label_addresses_and_cidr() {
        let n = node_object(3, 1).expect("node");
        assert_eq!(n.metadata.name.as_deref(), Some("flp003.cluster.local"));
        assert_eq!(
            host_indices(&["flp002".into(), "alio2-cr1-flp001".into(), "flp005".into()]),
            [
                (2, "flp002".to_string()),
                (6, "alio2-cr1-flp001".to_string()),
                (5, "flp005".to_string())
            ]
        );
        let labels = n.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels.get(HOST_LABEL).map(String::as_str), Some("flp003"));
        assert_eq!(labels.get("type").map(String::as_str), Some("kwok"));
        assert_eq!(
            labels.get(NODE_KIND_LABEL).map(String::as_str),
            Some("simulated")
        );
        let spec = n.spec.as_ref().expect("spec");
        assert_eq!(spec.pod_cidr.as_deref(), Some("127.128.2.0/24"));
        let addrs = n
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone())
            .expect("addrs");
        assert_eq!(addrs[0].type_, "InternalIP");
        assert_eq!(addrs[0].address, "127.1.0.3");
        assert!(!labels.contains_key(KWOK_SHARD_LABEL), "one kwok: no shard");
        assert!(node_object(0, 1).is_err());
        let r = real_node_object(2, [127, 3, 0, 2].into()).expect("real node");
        let labels = r.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels[NODE_KIND_LABEL], "real");
        assert_eq!(labels[HOST_LABEL], "real002");
        assert!(!labels.contains_key("type"), "kwok would manage it");
        let addrs = r.status.and_then(|s| s.addresses).expect("addrs");
        assert_eq!(addrs[0].address, "127.3.0.2");
    }

    #[test]
    fn nodes_are_dealt_to_kwok_shards_in_turn() {
        let shard = |n: u32| {
            node_object(n, 3)
                .expect("node")
                .metadata
                .labels
                .expect("labels")[KWOK_SHARD_LABEL]
                .clone()
        };
        assert_eq!(
            (1..=7).map(shard).collect::<Vec<_>>(),
            ["0", "1", "2", "0", "1", "2", "0"]
        );
    }
}

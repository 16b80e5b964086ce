//! A private plane whose simulated nodes are shared by several kwok processes: each node is
//! labelled for one shard, each kwok selects only its shard, and a pod on any node runs.

use envbridge::dev::{UpSpec, addressing};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;

use super::{pod, pod_ip, wait_phase};

/// The label selector of every running kwok of the plane in `dir` (from its command line),
/// with its pid.
fn kwoks(dir: &std::path::Path) -> Vec<(String, String)> {
    let dir = dir.to_string_lossy();
    let mut out: Vec<(String, String)> = std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((String::from_utf8_lossy(&cmd).into_owned(), e.file_name()))
        })
        .filter(|(c, _)| {
            c.contains(&*dir) && c.split('\0').next().is_some_and(|b| b.ends_with("/kwok"))
        })
        .filter_map(|(c, pid)| {
            let selector = c
                .split('\0')
                .find_map(|a| a.strip_prefix("--manage-nodes-with-label-selector="))?;
            Some((selector.to_string(), pid.to_string_lossy().into_owned()))
        })
        .collect();
    out.sort();
    out
}

/// Takes the private plane down however the test ends (a failed assertion too).
struct Down(std::path::PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        if let Err(e) = envbridge::dev::down_in(&self.0) {
            eprintln!("taking the private plane down: {e}");
        }
    }
}

fn kwok_selectors(dir: &std::path::Path) -> Vec<String> {
    kwoks(dir).into_iter().map(|(s, _)| s).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_kwok_shards_share_the_nodes_and_each_node_runs_its_pods() {
    let tmp = tempfile::Builder::new()
        .prefix("envbridge-kwok-shards-")
        .tempdir()
        .expect("tmp");
    let dir = tmp.path().join("dev");
    let spec = UpSpec {
        nodes: 5,
        kwok_shards: Some(3),
        ..Default::default()
    };
    let down = Down(dir.clone());
    {
        let info = envbridge::dev::ensure_up_in_with(&dir, &spec, &[])
            .await
            .unwrap_or_else(|e| panic!("private plane with 3 kwok shards: {e}"));
        assert_eq!(
            kwok_selectors(&dir),
            [
                "type=kwok,envbridge.dev/kwok-shard=0",
                "type=kwok,envbridge.dev/kwok-shard=1",
                "type=kwok,envbridge.dev/kwok-shard=2"
            ]
        );
        // Grown by one node: the running plane is kept (the same kwok processes) and the new
        // node dealt to one of its shards.
        let before = kwoks(&dir);
        let grown = UpSpec {
            nodes: 6,
            ..spec.clone()
        };
        envbridge::dev::ensure_up_in_with(&dir, &grown, &[])
            .await
            .unwrap_or_else(|e| panic!("growing the plane to 6 nodes: {e}"));
        assert_eq!(kwoks(&dir), before, "the plane restarted or lost a kwok");
        let client = envbridge::dev::client_for(&info.kubeconfig)
            .await
            .expect("client");
        let nodes: Api<Node> = Api::all(client.clone());
        let pods: Api<Pod> = Api::namespaced(client, "default");
        for n in 1..=6u32 {
            let node = nodes.get(&addressing::node_name(n)).await.expect("node");
            let labels = node.metadata.labels.unwrap_or_default();
            assert_eq!(
                labels.get(addressing::KWOK_SHARD_LABEL),
                Some(&((n - 1) % 3).to_string()),
                "node {n}'s shard"
            );
            let name = format!("p{n}");
            pods.create(
                &PostParams::default(),
                &pod(&name, &addressing::node_name(n), &[], &[]),
            )
            .await
            .expect("create pod");
        }
        for n in 1..=6u32 {
            let p = wait_phase(&pods, &format!("p{n}"), "Running").await;
            let cidr = addressing::pod_cidr(n).expect("cidr");
            let ip = pod_ip(&p).to_string();
            assert!(
                ip.starts_with(cidr.trim_end_matches("0/24")),
                "pod on node {n}: {ip} not in {cidr}"
            );
        }
    }
    drop(down);
    assert!(kwok_selectors(&dir).is_empty(), "a kwok left after down");
}

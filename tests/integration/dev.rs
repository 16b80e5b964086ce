//! The local control plane itself: real apiserver, kwok nodes and pod lifecycles,
//! kube-controller-manager's namespace and garbage collection, the failure stage, the CLI.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use envbridge::dev::{addressing, stages};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, Node, Pod, PodSpec, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};

use crate::support::{self, TestNamespace};

mod cut_watchers;
mod kwok_relay;
mod kwok_shards;

const WAIT: Duration = Duration::from_secs(60);

fn pod(name: &str, node: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
    let map = |kv: &[(&str, &str)]| -> Option<BTreeMap<String, String>> {
        (!kv.is_empty()).then(|| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            containers: vec![Container {
                name: "main".into(),
                image: Some("envbridge.invalid/sim:1".into()),
                ..Default::default()
            }],
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn wait_phase(api: &Api<Pod>, name: &str, phase: &str) -> Pod {
    support::wait_for(&format!("pod {name} phase {phase}"), WAIT, || async {
        let p = api.get(name).await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some(phase)).then_some(p)
    })
    .await
}

fn pod_ip(p: &Pod) -> Ipv4Addr {
    let ip = p
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .expect("a pod IP");
    ip.parse().unwrap_or_else(|e| panic!("pod IP {ip}: {e}"))
}

#[tokio::test]
async fn pod_on_a_kwok_node_runs_with_a_loopback_ip_from_its_node_cidr() {
    let ns = TestNamespace::new("dev-pod").await;
    let api: Api<Pod> = ns.api();
    let node = addressing::node_name(1);
    api.create(&PostParams::default(), &pod("p", &node, &[], &[]))
        .await
        .expect("create pod");
    let p = wait_phase(&api, "p", "Running").await;
    let ip = pod_ip(&p);
    assert!(ip.is_loopback(), "pod IP {ip} outside 127.0.0.0/8");
    let cidr = addressing::pod_cidr(1).expect("cidr");
    let prefix = cidr.trim_end_matches("0/24");
    assert!(ip.to_string().starts_with(prefix), "{ip} not in {cidr}");
    let host_ip = p.status.as_ref().and_then(|s| s.host_ip.clone());
    assert_eq!(host_ip, addressing::node_ip(1).map(|i| i.to_string()));
}

#[tokio::test]
async fn host_network_pod_gets_its_node_address() {
    let ns = TestNamespace::new("dev-hostnet").await;
    let api: Api<Pod> = ns.api();
    let mut p = pod("h", &addressing::node_name(2), &[], &[]);
    if let Some(spec) = p.spec.as_mut() {
        spec.host_network = Some(true);
    }
    api.create(&PostParams::default(), &p)
        .await
        .expect("create");
    let p = wait_phase(&api, "h", "Running").await;
    assert_eq!(Some(pod_ip(&p)), addressing::node_ip(2));
}

#[tokio::test]
async fn failure_stage_fails_a_labelled_pod_with_the_asked_exit_code() {
    let ns = TestNamespace::new("dev-fail").await;
    let api: Api<Pod> = ns.api();
    let p = pod(
        "f",
        &addressing::node_name(3),
        &[(stages::SIM_FAIL_LABEL, "true")],
        &[
            (stages::SIM_EXIT_CODE, "7"),
            (stages::SIM_REASON, "Crashed"),
            (stages::SIM_FAIL_AFTER, "500ms"),
        ],
    );
    api.create(&PostParams::default(), &p)
        .await
        .expect("create");
    let failed = wait_phase(&api, "f", "Failed").await;
    let status = failed.status.clone().expect("status");
    let term = status
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .expect("a terminated container");
    assert_eq!(term.exit_code, 7);
    assert_eq!(term.reason.as_deref(), Some("Crashed"));
    assert!(pod_ip(&failed).is_loopback());

    // An unlabelled pod on the same node keeps running.
    api.create(
        &PostParams::default(),
        &pod("ok", &addressing::node_name(3), &[], &[]),
    )
    .await
    .expect("create");
    wait_phase(&api, "ok", "Running").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let still = api.get("ok").await.expect("get");
    assert_eq!(
        still.status.and_then(|s| s.phase).as_deref(),
        Some("Running")
    );
}

#[tokio::test]
async fn succeed_stage_completes_a_labelled_pod() {
    let ns = TestNamespace::new("dev-succeed").await;
    let api: Api<Pod> = ns.api();
    let p = pod(
        "s",
        &addressing::node_name(4),
        &[(stages::SIM_SUCCEED_LABEL, "true")],
        &[],
    );
    api.create(&PostParams::default(), &p)
        .await
        .expect("create");
    let done = wait_phase(&api, "s", "Succeeded").await;
    let code = done
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|cs| cs.into_iter().next())
        .and_then(|c| c.state)
        .and_then(|s| s.terminated)
        .map(|t| t.exit_code);
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn deleting_a_namespace_makes_it_disappear() {
    let client = support::client().await;
    let name = format!("dev-nsdel-{}", support::random_suffix());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create ns");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &name);
    pods.create(
        &PostParams::default(),
        &pod("x", &addressing::node_name(1), &[], &[]),
    )
    .await
    .expect("create pod");
    wait_phase(&pods, "x", "Running").await;
    namespaces
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete ns");
    support::wait_for(&format!("namespace {name} gone"), WAIT, || async {
        match namespaces.get_opt(&name).await {
            Ok(None) => Some(()),
            _ => None,
        }
    })
    .await;
}

#[tokio::test]
async fn garbage_collector_deletes_dependents() {
    let ns = TestNamespace::new("dev-gc").await;
    let api: Api<ConfigMap> = ns.api();
    let owner = api
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("owner");
    let dependent = ConfigMap {
        metadata: ObjectMeta {
            name: Some("dependent".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "owner".into(),
                uid: owner.metadata.uid.clone().expect("uid"),
                ..Default::default()
            }]),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &dependent)
        .await
        .expect("dependent");
    api.delete("owner", &DeleteParams::background())
        .await
        .expect("delete owner");
    support::wait_for("dependent ConfigMap collected", WAIT, || async {
        match api.get_opt("dependent").await {
            Ok(None) => Some(()),
            _ => None,
        }
    })
    .await;
}

#[tokio::test]
async fn nodes_carry_host_labels_distinct_loopback_ips_and_cidrs() {
    let client = support::client().await;
    let nodes: Api<Node> = Api::all(client);
    let list = nodes
        .list(&ListParams::default().labels(addressing::HOST_LABEL))
        .await
        .expect("list nodes");
    for n in 1..=support::NODES {
        let name = addressing::node_name(n);
        let node = list
            .items
            .iter()
            .find(|x| x.metadata.name.as_deref() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("node {name} missing"));
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(addressing::HOST_LABEL),
            Some(&addressing::host_name(n))
        );
        let internal = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            .map(|a| a.address.clone());
        assert_eq!(internal, addressing::node_ip(n).map(|i| i.to_string()));
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        assert!(ready, "{name} not Ready");
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
            addressing::pod_cidr(n)
        );
    }
}

#[tokio::test]
async fn service_cluster_ips_are_loopback_data() {
    let client = support::client().await;
    let services: Api<Service> = Api::namespaced(client, "default");
    let svc = services
        .get("kubernetes")
        .await
        .expect("kubernetes service");
    let ip: Ipv4Addr = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("cluster IP")
        .parse()
        .expect("IPv4");
    assert!(ip.is_loopback(), "service IP {ip} outside 127.0.0.0/8");
}

#[tokio::test]
async fn server_reports_the_built_kubernetes_version() {
    let client = support::client().await;
    let v = client.apiserver_version().await.expect("version");
    assert_eq!(v.git_version, envbridge::dev::binaries::K8S_VERSION);
}

#[tokio::test]
async fn cli_up_is_idempotent_and_prints_the_kubeconfig_last() {
    let info = support::cluster().await;
    let exe = env!("CARGO_BIN_EXE_envbridge");
    let up = tokio::process::Command::new(exe)
        .args(["dev", "up", "--nodes", &support::NODES.to_string()])
        .output()
        .await
        .expect("run dev up");
    assert!(
        up.status.success(),
        "dev up: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let stdout = String::from_utf8_lossy(&up.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!("export KUBECONFIG={}", info.kubeconfig.display())
    );
    assert!(info.kubeconfig.is_absolute());

    let status = tokio::process::Command::new(exe)
        .args(["dev", "status"])
        .output()
        .await
        .expect("run dev status");
    assert!(
        status.status.success(),
        "dev status: {}",
        String::from_utf8_lossy(&status.stdout)
    );

    let nodes = tokio::process::Command::new(exe)
        .args([
            "dev",
            "kubectl",
            "get",
            "nodes",
            "-o",
            "wide",
            "--show-labels",
        ])
        .output()
        .await
        .expect("run dev kubectl");
    let text = String::from_utf8_lossy(&nodes.stdout);
    assert!(
        nodes.status.success(),
        "{}",
        String::from_utf8_lossy(&nodes.stderr)
    );
    assert!(text.contains("flp001.cluster.local"), "{text}");
    assert!(text.contains("envbridge.dev/host=flp001"), "{text}");
    assert!(text.contains("127.1.0.1"), "{text}");
}

/// `dev up --real-nodes` on a PRIVATE plane (its own block of addresses and cgroups): the
/// real node is Ready, labelled, runs a container of the envbridge image; `dev down` then
/// leaves no process, mount or cgroup of it behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_joins_runs_a_container_and_leaves_nothing_after_down() {
    use envbridge::dev::realnode::teardown;
    // The shared plane first: it builds the binaries and images once for everyone.
    support::real_cluster().await;
    let tmp = tempfile::Builder::new()
        .prefix("envbridge-real-down-")
        .tempdir()
        .expect("tmp");
    let dir = tmp.path().join("dev");
    let spec = envbridge::dev::UpSpec {
        nodes: 1,
        real_nodes: 1,
        exe: Some(env!("CARGO_BIN_EXE_envbridge").into()),
        ..Default::default()
    };
    let up = envbridge::dev::ensure_up_in_with(&dir, &spec, &[]).await;
    let nodes = envbridge::dev::real_nodes_in(&dir).unwrap_or_default();
    let result = async {
        let info = up.map_err(|e| format!("private plane with a real node: {e}"))?;
        let client = envbridge::dev::client_for(&info.kubeconfig)
            .await
            .map_err(|e| e.to_string())?;
        let n = nodes.first().ok_or("no real node recorded")?;
        let node = Api::<Node>::all(client.clone())
            .get(&n.name)
            .await
            .map_err(|e| e.to_string())?;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(addressing::NODE_KIND_LABEL).map(String::as_str),
            Some("real")
        );
        assert_eq!(
            labels.get(addressing::HOST_LABEL).map(String::as_str),
            Some("real001")
        );
        let kwok = Api::<Node>::all(client.clone())
            .get(&addressing::node_name(1))
            .await
            .map_err(|e| e.to_string())?;
        assert_eq!(
            kwok.metadata
                .labels
                .unwrap_or_default()
                .get(addressing::NODE_KIND_LABEL)
                .map(String::as_str),
            Some("simulated")
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let mut p = pod("sleeper", &n.name, &[], &[]);
        let spec = p.spec.as_mut().expect("spec");
        spec.host_network = Some(true);
        spec.containers[0].image = Some(envbridge::dev::image::IMAGE.into());
        spec.containers[0].command = Some(vec!["/bin/sleep".into(), "600".into()]);
        pods.create(&PostParams::default(), &p)
            .await
            .map_err(|e| e.to_string())?;
        wait_phase(&pods, "sleeper", "Running").await;
        let cg = n.layout().cgroup;
        let sleeping = teardown::processes(&cg)
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.starts_with(b"/bin/sleep\x00600"))
            })
            .count();
        assert_eq!(sleeping, 1, "the container's process in the node's cgroup");
        Ok::<_, String>(n.clone())
    }
    .await;
    envbridge::dev::down_in(&dir).expect("down");
    let n = result.unwrap_or_else(|e| panic!("{e}"));
    let layout = n.layout();
    assert!(teardown::processes(&layout.cgroup).is_empty());
    assert!(
        teardown::hierarchies()
            .iter()
            .all(|h| !h.join(layout.cgroup.trim_start_matches('/')).exists()),
        "a cgroup of the node is left"
    );
    assert!(teardown::mounts_under(tmp.path()).is_empty(), "mounts left");
    let ours = |pid: &str| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&*dir.to_string_lossy()))
    };
    let left: Vec<String> = std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()) && ours(p))
        .collect();
    assert!(left.is_empty(), "processes of the plane left: {left:?}");
}

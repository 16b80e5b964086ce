//! `envbridge demo --real-nodes N`: the daemon and the operator deployed IN the cluster, on
//! the plane's real nodes, from manifests/deploy/local (the base a site uses, plus what the
//! local plane needs), instead of as child processes; their tasks run in real containers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};

use super::demo::say;

/// Where the overlay puts everything (its daemon's environments and its own objects).
const SYSTEM: &str = envbridge::dev::realnode::SYSTEM_NAMESPACE;
/// The namespace the overlay's daemon puts every environment in (its operator's only one).
pub const ENVIRONMENTS: &str = "envbridge-local";
const TOKEN_SECRET: &str = "envbridge-daemon-token";
const READY_WITHIN: Duration = Duration::from_secs(180);

/// The deployment the demo made, removed by [`Deployed::remove`] on every exit path. The RBAC
/// and the namespace envbridge-system stay: they are the site's, shared with whoever else
/// uses this plane.
pub struct Deployed {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    /// The daemon's gRPC and HTTP (dashboard, metrics) addresses, on its node's address.
    pub grpc: String,
    pub http: String,
}

fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(bin)
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()
        .map_err(|e| format!("running {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates the daemon's token Secret, applies manifests/deploy/local, and waits until the
/// daemon and the operator run Ready on real nodes.
pub async fn deploy(
    kube: &Client,
    kubectl_bin: &Path,
    kubeconfig: &Path,
    manifests: &Path,
    token: &str,
) -> Result<Deployed, String> {
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": TOKEN_SECRET, "namespace": SYSTEM},
        "stringData": {"token": format!("{token}\n")},
    });
    Api::<Secret>::namespaced(kube.clone(), SYSTEM)
        .patch(
            TOKEN_SECRET,
            &PatchParams::apply("envbridge-demo").force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(|e| format!("the daemon's token Secret: {e}"))?;
    let overlay = manifests.join("deploy/local");
    let applied = kubectl(
        kubectl_bin,
        kubeconfig,
        &["apply", "-k", &overlay.display().to_string()],
    )?;
    say(&format!(
        "kubectl apply -k {}: {} objects",
        overlay.display(),
        applied.lines().count()
    ));
    let pods: Api<Pod> = Api::namespaced(kube.clone(), SYSTEM);
    let started = Instant::now();
    let (daemon, operator) = loop {
        let ready = |name: &str, list: &[Pod]| {
            list.iter()
                .find(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("app.kubernetes.io/name"))
                            == Some(&name.to_string())
                        && p.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                })
                .cloned()
        };
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing {SYSTEM} pods: {e}"))?
            .items;
        if let (Some(d), Some(o)) = (
            ready("envbridge-daemon", &list),
            ready("envbridge-operator", &list),
        ) {
            break (d, o);
        }
        if started.elapsed() > READY_WITHIN {
            let states: Vec<String> = list
                .iter()
                .map(|p| {
                    format!(
                        "{} {:?}",
                        p.metadata.name.clone().unwrap_or_default(),
                        p.status.as_ref().and_then(|s| s.container_statuses.clone())
                    )
                })
                .collect();
            return Err(format!(
                "the daemon and the operator were not Ready within {READY_WITHIN:?}: {}",
                states.join("; ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let ip = daemon
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .ok_or("the daemon's pod has no IP")?;
    let node_of = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    say(&format!(
        "daemon Ready on {} ({ip}), operator Ready on {}, in {} ms",
        node_of(&daemon),
        node_of(&operator),
        started.elapsed().as_millis()
    ));
    Ok(Deployed {
        kubectl: kubectl_bin.to_path_buf(),
        kubeconfig: kubeconfig.to_path_buf(),
        grpc: format!("http://{ip}:50061"),
        http: format!("{ip}:9464"),
    })
}

impl Deployed {
    /// Deletes what the demo deployed (the Deployments, the daemon's ConfigMap, Service and
    /// token, the environments' namespace), waiting until their pods are gone.
    pub fn remove(&self) {
        let objects = [
            "deployment/envbridge-daemon",
            "deployment/envbridge-operator",
            "service/envbridge-daemon",
            "configmap/envbridge-daemon",
            &format!("secret/{TOKEN_SECRET}"),
        ];
        let mut args = vec!["delete", "-n", SYSTEM, "--ignore-not-found", "--wait"];
        args.extend(objects.iter().map(|s| &**s));
        match kubectl(&self.kubectl, &self.kubeconfig, &args) {
            Ok(_) => say("in-cluster daemon and operator removed"),
            Err(e) => eprintln!("warning: {e}"),
        }
        let ns = [
            "delete",
            "namespace",
            ENVIRONMENTS,
            "--ignore-not-found",
            "--wait",
        ];
        if let Err(e) = kubectl(&self.kubectl, &self.kubeconfig, &ns) {
            eprintln!("warning: {e}");
        }
    }
}

/// Where the task processes' logs are read: the sim-runner's files, or the kubelet.
pub enum TaskLogs {
    Dir(PathBuf),
    Kubelet(Client),
}

impl TaskLogs {
    /// The log of task `task` in `namespace` (its pod has the task's name).
    pub async fn text(&self, namespace: &str, task: &str) -> Result<String, String> {
        match self {
            TaskLogs::Dir(dir) => {
                let log = dir.join(format!("{namespace}_{task}.log"));
                std::fs::read_to_string(&log).map_err(|e| format!("{}: {e}", log.display()))
            }
            TaskLogs::Kubelet(client) => Api::<Pod>::namespaced(client.clone(), namespace)
                .logs(task, &Default::default())
                .await
                .map_err(|e| format!("the kubelet's log of {namespace}/{task}: {e}")),
        }
    }
}

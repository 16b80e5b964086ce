//! Real nodes of the local plane: per node a containerd and a kubelet of the plane's
//! Kubernetes version, each with its own root, state, socket, cgroup and loopback address,
//! joined the proper way (a `system:node:<name>` client certificate issued by the plane's
//! CA, a serving certificate, webhook authentication and authorization of the apiserver).
//! See docs/local-control-plane.md, "Real nodes".

pub mod binaries;
pub mod config;
pub mod teardown;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};

use super::addressing;
use super::error::{DevError, IoContext, Result};
use super::image;
use super::kubeconfig;
use super::nodes;
use super::pki;
use super::process::{self, died};
use super::state::Component;
pub use binaries::NodeBinaries;
pub use config::NodeLayout;

/// How long a kubelet may take from start to its Node Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_GRACE: Duration = Duration::from_secs(10);

/// One running real node, as recorded in state.json.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RealNodeState {
    pub index: u32,
    pub name: String,
    pub host: String,
    pub ip: std::net::Ipv4Addr,
    pub dir: PathBuf,
    pub containerd: Component,
    pub kubelet: Component,
}

impl RealNodeState {
    pub fn layout(&self) -> NodeLayout {
        NodeLayout::new(
            self.name.clone(),
            self.host.clone(),
            self.ip,
            self.dir.clone(),
        )
    }
    pub fn alive(&self) -> bool {
        process::alive(self.containerd.pid, &self.containerd.binary)
            && process::alive(self.kubelet.pid, &self.kubelet.binary)
    }
}

/// The layout of real node `r` of the plane in `plane_dir`.
pub fn layout(plane_dir: &Path, r: u32) -> Result<NodeLayout> {
    let ip = addressing::real_node_ip(addressing::real_block(plane_dir), r).ok_or_else(|| {
        DevError::Invalid(format!(
            "--real-nodes must be within 0..={}",
            addressing::MAX_REAL_NODES
        ))
    })?;
    let host = addressing::real_host_name(r);
    Ok(NodeLayout::new(
        addressing::real_node_name(r),
        host.clone(),
        ip,
        plane_dir.join("nodes").join(host),
    ))
}

/// What a real node needs from the plane.
pub struct PlaneAccess<'a> {
    pub dir: &'a Path,
    pub server: String,
    pub apiserver_port: u16,
    pub pki: pki::PkiFiles,
    /// The envbridge executable the node's images are built from.
    pub exe: &'a Path,
}

/// Namespace of envbridge's own deployments (manifests/deploy).
pub const SYSTEM_NAMESPACE: &str = "envbridge-system";
/// ConfigMap there telling in-cluster clients where the apiserver is: the local plane has
/// no kube-proxy behind the `kubernetes` Service (manifests/deploy/local reads it).
pub const APISERVER_CONFIGMAP: &str = "envbridge-apiserver";

/// Writes [`APISERVER_CONFIGMAP`] for the apiserver on 127.0.0.1:`port`.
pub async fn ensure_apiserver_configmap(client: &Client, port: u16) -> Result<()> {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube::api::{Patch, PatchParams};
    let pp = PatchParams::apply("envbridge-dev").force();
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": SYSTEM_NAMESPACE}});
    Api::<Namespace>::all(client.clone())
        .patch(SYSTEM_NAMESPACE, &pp, &Patch::Apply(&ns))
        .await?;
    let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": APISERVER_CONFIGMAP, "namespace": SYSTEM_NAMESPACE},
        "data": {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                 "KUBERNETES_SERVICE_PORT": port.to_string()}});
    Api::<ConfigMap>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .patch(APISERVER_CONFIGMAP, &pp, &Patch::Apply(&cm))
        .await?;
    Ok(())
}

/// The apiserver calls kubelets (logs, exec, port-forward) as [`pki::KUBELET_CLIENT_USER`];
/// each kubelet asks the apiserver (SubjectAccessReview) whether that user may.
pub async fn ensure_apiserver_access(client: &Client) -> Result<()> {
    let api: Api<ClusterRoleBinding> = Api::all(client.clone());
    let crb = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some("envbridge-dev:apiserver-kubelet-client".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "system:kubelet-api-admin".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: pki::KUBELET_CLIENT_USER.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            namespace: None,
        }]),
    };
    match api.create(&PostParams::default(), &crb).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Build the images from `exe` once, then import them into every node whose containerd
/// lacks them or holds another build.
pub fn ensure_images(
    bins: &NodeBinaries,
    plane_dir: &Path,
    exe: &Path,
    nodes: &[NodeLayout],
) -> Result<image::Archive> {
    let out = plane_dir.join("images");
    std::fs::create_dir_all(&out).ctx("creating", &out)?;
    let archive = image::build(exe, &out).map_err(|e| DevError::Image(e.to_string()))?;
    for node in nodes {
        let sock = node.containerd_socket();
        if image::ensure_imported(&bins.ctr, &sock, &archive)
            .map_err(|e| DevError::Image(e.to_string()))?
        {
            eprintln!("envbridge: imported {} into {}", image::IMAGE, node.name);
        }
    }
    Ok(archive)
}

fn write_file(path: &Path, content: &str, secret: bool) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    if secret {
        opts.mode(0o600);
    }
    let mut f = opts.open(path).ctx("writing", path)?;
    std::io::Write::write_all(&mut f, content.as_bytes()).ctx("writing", path)
}

/// Certificates, kubeconfig and configuration files of `node`.
fn prepare(
    node: &NodeLayout,
    plane: &PlaneAccess<'_>,
    bins: &NodeBinaries,
) -> Result<(PathBuf, PathBuf)> {
    for d in [
        node.containerd_root(),
        node.containerd_state(),
        node.kubelet_root(),
        node.pki_dir(),
        node.pod_logs(),
        node.cni_conf_dir(),
    ] {
        std::fs::create_dir_all(&d).ctx("creating", &d)?;
    }
    let ca_key = std::fs::read_to_string(&plane.pki.ca_key).ctx("reading", &plane.pki.ca_key)?;
    let certs = pki::issue_node(&pki::issuer_from(&ca_key)?, &node.name, node.ip)?;
    let p = node.pki_dir();
    let (client_cert, client_key) = (p.join("client.crt"), p.join("client.key"));
    let (serving_cert, serving_key) = (p.join("kubelet.crt"), p.join("kubelet.key"));
    write_file(&client_cert, &certs.client_cert, false)?;
    write_file(&client_key, &certs.client_key, true)?;
    write_file(&serving_cert, &certs.serving_cert, false)?;
    write_file(&serving_key, &certs.serving_key, true)?;
    write_file(
        &node.kubeconfig(),
        &kubeconfig::render(&plane.server, &plane.pki.ca_cert, &client_cert, &client_key),
        true,
    )?;
    write_file(
        &node.containerd_config(),
        &config::containerd(node, &bins.dir, image::PAUSE_IMAGE),
        false,
    )?;
    write_file(
        &node.cni_conf_dir().join("10-envbridge.conflist"),
        config::cni_conflist(),
        false,
    )?;
    write_file(
        &node.kubelet_config(),
        &config::kubelet(node, &plane.pki.ca_cert, &serving_cert, &serving_key),
        false,
    )?;
    teardown::create_cgroup(&node.shim_cgroup())?;
    Ok((client_cert, client_key))
}

fn component(name: String, pid: u32, binary: &Path, log: PathBuf) -> Component {
    Component {
        name,
        pid,
        binary: std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_path_buf()),
        log,
    }
}

async fn start_containerd(node: &NodeLayout, bins: &NodeBinaries) -> Result<Component> {
    let log = node.dir.join("containerd.log");
    let path = format!(
        "{}:{}",
        bins.dir.display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
    );
    let pid = process::spawn_with_env(
        &bins.containerd,
        &[
            "--config".into(),
            node.containerd_config().display().to_string(),
        ],
        &log,
        &node.dir,
        &[("PATH", path.as_str())],
    )?;
    let c = component(
        format!("containerd/{}", node.host),
        pid,
        &bins.containerd,
        log,
    );
    let socket = node.containerd_socket();
    process::wait_started(&c, "socket", Duration::from_secs(30), || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    })
    .await?;
    Ok(c)
}

fn start_kubelet(node: &NodeLayout, bins: &NodeBinaries) -> Result<Component> {
    let log = node.dir.join("kubelet.log");
    let args = vec![
        format!("--config={}", node.kubelet_config().display()),
        format!("--kubeconfig={}", node.kubeconfig().display()),
        format!("--hostname-override={}", node.name),
        // The Node exists already with its loopback InternalIP (the kubelet refuses a
        // loopback --node-ip); with an external cloud provider it keeps those addresses.
        "--cloud-provider=external".into(),
        format!("--root-dir={}", node.kubelet_root().display()),
        format!("--cert-dir={}", node.pki_dir().display()),
        "--v=1".into(),
    ];
    let pid = process::spawn(&bins.kubelet, &args, &log, &node.dir)?;
    Ok(component(
        format!("kubelet/{}", node.host),
        pid,
        &bins.kubelet,
        log,
    ))
}

async fn ensure_node_object(client: &Client, r: u32, ip: std::net::Ipv4Addr) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    match api
        .create(&PostParams::default(), &nodes::real_node_object(r, ip)?)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Start real nodes 1..=count that are not running (their images imported first), and wait
/// until each is Ready. `running` is what state.json records; the result replaces it.
pub async fn ensure(
    client: &Client,
    plane: &PlaneAccess<'_>,
    running: &[RealNodeState],
    count: u32,
    mut record: impl FnMut(&[RealNodeState]) -> Result<()>,
) -> Result<Vec<RealNodeState>> {
    if count > addressing::MAX_REAL_NODES {
        return Err(DevError::Invalid(format!(
            "--real-nodes must be within 0..={}",
            addressing::MAX_REAL_NODES
        )));
    }
    if count == 0 {
        return Ok(running.to_vec());
    }
    let mut out: Vec<RealNodeState> = Vec::new();
    let mut to_start = Vec::new();
    for r in 1..=count.max(running.iter().map(|n| n.index).max().unwrap_or(0)) {
        match running.iter().find(|n| n.index == r) {
            Some(n) if n.alive() => out.push(n.clone()),
            Some(n) => {
                eprintln!("envbridge: real node {} is down; starting it again", n.name);
                stop(n);
                to_start.push(r);
            }
            None if r <= count => to_start.push(r),
            None => {}
        }
    }

    let bins = tokio::task::spawn_blocking(binaries::ensure_built)
        .await
        .map_err(|e| DevError::Build(format!("build task failed: {e}")))??;
    ensure_apiserver_access(client).await?;
    ensure_apiserver_configmap(client, plane.apiserver_port).await?;
    let mut started = Vec::new();
    for r in to_start {
        let node = layout(plane.dir, r)?;
        prepare(&node, plane, &bins)?;
        ensure_node_object(client, r, node.ip).await?;
        eprintln!("envbridge: starting containerd of {}", node.name);
        let containerd = start_containerd(&node, &bins).await?;
        started.push((r, node, containerd));
    }
    let layouts: Vec<NodeLayout> = out
        .iter()
        .map(RealNodeState::layout)
        .chain(started.iter().map(|(_, n, _)| n.clone()))
        .collect();
    let bins2 = bins.clone();
    let (dir, exe) = (plane.dir.to_path_buf(), plane.exe.to_path_buf());
    tokio::task::spawn_blocking(move || ensure_images(&bins2, &dir, &exe, &layouts))
        .await
        .map_err(|e| DevError::Image(format!("image task failed: {e}")))??;
    for (r, node, containerd) in started {
        eprintln!("envbridge: starting the kubelet of {}", node.name);
        let kubelet = start_kubelet(&node, &bins)?;
        out.push(RealNodeState {
            index: r,
            name: node.name.clone(),
            host: node.host.clone(),
            ip: node.ip,
            dir: node.dir.clone(),
            containerd,
            kubelet,
        });
        out.sort_by_key(|n| n.index);
        record(&out)?;
        // The kubelets of one machine share /var/lib/kubelet/device-plugins/kubelet.sock (a
        // path the kubelet does not let us move): each removes and binds it as it starts, so
        // two starting at once can fail EADDRINUSE (seen in CI). The next one starts once
        // this one is Ready, which it is only after binding it.
        if let Some(n) = out.iter().find(|n| n.index == r) {
            wait_ready(client, std::slice::from_ref(n)).await?;
        }
    }
    wait_ready(client, &out).await?;
    Ok(out)
}

async fn wait_ready(client: &Client, nodes: &[RealNodeState]) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let start = Instant::now();
    for n in nodes {
        loop {
            let ready = api
                .get_opt(&n.name)
                .await?
                .and_then(|node| node.status)
                .and_then(|s| s.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                break;
            }
            for c in [&n.containerd, &n.kubelet] {
                if !process::alive(c.pid, &c.binary) {
                    return Err(died(c, "exited"));
                }
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(died(
                    &n.kubelet,
                    &format!("{} not Ready after {READY_TIMEOUT:?}", n.name),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// End real node `n` as a machine dies: its kubelet, every container and shim, its
/// containerd; then detach its mounts and remove its cgroups. Its Node object stays (the
/// plane sees the node go silent). Returns what could not be removed, if anything.
pub fn stop(n: &RealNodeState) -> Vec<String> {
    let node = n.layout();
    let mut left = Vec::new();
    process::stop_groups(&[n.kubelet.pid], STOP_GRACE);
    teardown::kill_all(&node.cgroup, STOP_GRACE);
    process::stop_groups(&[n.containerd.pid], STOP_GRACE);
    // A shim or container started in the last instant of containerd's life.
    teardown::kill_all(&node.cgroup, STOP_GRACE);
    teardown::unmount_all(&node.dir);
    left.extend(
        teardown::mounts_under(&node.dir)
            .iter()
            .map(|m| format!("mount {}", m.display())),
    );
    left.extend(
        teardown::remove_cgroups(&node.cgroup)
            .iter()
            .map(|c| format!("cgroup {}", c.display())),
    );
    for l in &left {
        eprintln!("envbridge: {} left behind: {l}", n.name);
    }
    left
}

/// Stop the kubelet of `n` alone (its containers keep running and answering): the Node goes
/// NotReady once its heartbeats stop. For tests of that case.
pub fn stop_kubelet(n: &RealNodeState) {
    process::stop_groups(&[n.kubelet.pid], STOP_GRACE);
}

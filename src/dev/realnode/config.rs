//! The configuration files of one real node: containerd's, the kubelet's and the CNI
//! network's (pure: rendered from [`NodeLayout`], unit-tested).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Where one real node keeps everything; all of it lives under `dir` so that teardown
/// finds every mount by its path.
#[derive(Debug, Clone)]
pub struct NodeLayout {
    pub name: String,
    pub host: String,
    pub ip: Ipv4Addr,
    pub dir: PathBuf,
    /// The node's cgroup (in every v1 hierarchy): its pods under kubepods, its shims under
    /// shims, so that one walk of it finds every process the node runs.
    pub cgroup: String,
}

impl NodeLayout {
    pub fn new(name: String, host: String, ip: Ipv4Addr, dir: PathBuf) -> Self {
        // The address names the plane and the node: unique on this machine.
        let cgroup = format!("/envbridge-{}", ip.to_string().replace('.', "-"));
        NodeLayout {
            name,
            host,
            ip,
            dir,
            cgroup,
        }
    }
    pub fn containerd_root(&self) -> PathBuf {
        self.dir.join("containerd/root")
    }
    pub fn containerd_state(&self) -> PathBuf {
        self.dir.join("containerd/state")
    }
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    pub fn containerd_config(&self) -> PathBuf {
        self.dir.join("containerd.toml")
    }
    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet")
    }
    pub fn kubelet_config(&self) -> PathBuf {
        self.dir.join("kubelet.yaml")
    }
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
    pub fn pki_dir(&self) -> PathBuf {
        self.dir.join("pki")
    }
    pub fn pod_logs(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni/net.d")
    }
    pub fn shim_cgroup(&self) -> String {
        format!("{}/shims", self.cgroup)
    }
}

/// TOML basic string: the JSON quoting of a path is valid TOML.
fn q(p: &Path) -> String {
    serde_json::Value::from(p.to_string_lossy().as_ref()).to_string()
}

/// containerd (config version 3) for `node`, with runc and the CNI plugins from `bin_dir`.
/// Why each setting: `restrict_oom_score_adj` (this container lacks CAP_SYS_RESOURCE, so
/// runc fails every sandbox that asks for a lower OOM score), runc's own root and the shims'
/// cgroup per node (two nodes on one host never share state), the streaming server on
/// loopback, network namespaces under the state directory (torn down with it), and the
/// pause image built locally (nothing is ever pulled).
pub fn containerd(node: &NodeLayout, bin_dir: &Path, pause_image: &str) -> String {
    let state = node.containerd_state();
    format!(
        r#"# containerd of the local plane's real node {name} (written by envbridge dev up)
version = 3
root = {root}
state = {state_q}
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
  "io.containerd.nri.v1.nri",
]

[grpc]
  address = {sock}

[ttrpc]
  address = {ttrpc}

[debug]
  address = ""

[metrics]
  address = ""

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{pause_image}"

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    disable_apparmor = true
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    enable_cdi = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {runc}
          Root = {runc_root}
          ShimCgroup = "{shim_cgroup}"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [{bin}]
      conf_dir = {cni_conf}
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
"#,
        name = node.name,
        root = q(&node.containerd_root()),
        state_q = q(&state),
        sock = q(&node.containerd_socket()),
        ttrpc = q(&node.dir.join("containerd.sock.ttrpc")),
        runc = q(&bin_dir.join("runc")),
        runc_root = q(&state.join("runc")),
        shim_cgroup = node.shim_cgroup(),
        bin = q(bin_dir),
        cni_conf = q(&node.cni_conf_dir()),
    )
}

/// The node's CNI network: loopback only. The TaskTemplates run on the host's network
/// (hostNetwork), which needs no CNI; containerd reports the network ready once a network
/// is configured. A pod without hostNetwork gets no address here (its sandbox fails with
/// containerd's own words), see docs/local-control-plane.md.
pub fn cni_conflist() -> &'static str {
    r#"{
  "cniVersion": "1.0.0",
  "name": "envbridge-loopback",
  "plugins": [{"type": "loopback"}]
}
"#
}

/// The kubelet's KubeletConfiguration. It serves on the node's own loopback address, so the
/// kubelets of several nodes on one host never clash; anonymous access is off, callers are
/// authenticated by the plane's CA and authorized by webhook (SubjectAccessReview); cgroups
/// v1 with the cgroupfs driver under the node's own cgroup root.
pub fn kubelet(
    node: &NodeLayout,
    ca_cert: &Path,
    serving_cert: &Path,
    serving_key: &Path,
) -> String {
    format!(
        r#"# kubelet of the local plane's real node {name} (written by envbridge dev up)
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: {ip}
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
    cacheTTL: 30s
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 30s
    cacheUnauthorizedTTL: 5s
tlsCertFile: {cert}
tlsPrivateKeyFile: {key}
containerRuntimeEndpoint: unix://{sock}
podLogsDir: {logs}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup}
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
oomScoreAdj: 0
protectKernelDefaults: false
registerNode: true
nodeStatusUpdateFrequency: 10s
nodeStatusReportFrequency: 1m
syncFrequency: 30s
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
maxPods: 250
shutdownGracePeriod: 0s
resolvConf: /etc/resolv.conf
staticPodPath: ""
"#,
        name = node.name,
        ip = node.ip,
        ca = q(ca_cert),
        cert = q(serving_cert),
        key = q(serving_key),
        sock = node.containerd_socket().display(),
        logs = q(&node.pod_logs()),
        cgroup = node.cgroup,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeLayout {
        NodeLayout::new(
            "real001.cluster.local".into(),
            "real001".into(),
            Ipv4Addr::new(127, 3, 0, 1),
            PathBuf::from("/s/nodes/real001"),
        )
    }

    #[test]
    fn containerd_config_keeps_everything_under_the_node() {
        let text = containerd(&node(), Path::new("/b"), "localhost/envbridge-pause:dev");
        let v: toml::Value = toml::from_str(&text).expect("valid TOML");
        assert_eq!(v["version"].as_integer(), Some(3));
        assert_eq!(v["root"].as_str(), Some("/s/nodes/real001/containerd/root"));
        assert_eq!(
            v["grpc"]["address"].as_str(),
            Some("/s/nodes/real001/containerd.sock")
        );
        let rt = &v["plugins"]["io.containerd.cri.v1.runtime"];
        assert_eq!(rt["restrict_oom_score_adj"].as_bool(), Some(true));
        let opts = &rt["containerd"]["runtimes"]["runc"]["options"];
        assert_eq!(opts["BinaryName"].as_str(), Some("/b/runc"));
        assert_eq!(
            opts["ShimCgroup"].as_str(),
            Some("/envbridge-127-3-0-1/shims")
        );
        assert_eq!(
            v["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].as_str(),
            Some("localhost/envbridge-pause:dev")
        );
    }

    #[test]
    fn kubelet_serves_on_the_node_address_without_anonymous_access() {
        let text = kubelet(
            &node(),
            Path::new("/s/pki/ca.crt"),
            Path::new("/n/kubelet.crt"),
            Path::new("/n/kubelet.key"),
        );
        let v: serde_json::Value = serde_saphyr::from_str(&text).expect("valid YAML");
        assert_eq!(v["address"], "127.3.0.1");
        assert_eq!(v["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(v["authorization"]["mode"], "Webhook");
        assert_eq!(v["cgroupRoot"], "/envbridge-127-3-0-1");
        assert_eq!(v["failCgroupV1"], false);
        assert_eq!(
            v["containerRuntimeEndpoint"],
            "unix:///s/nodes/real001/containerd.sock"
        );
        let cni: serde_json::Value = serde_json::from_str(cni_conflist()).expect("json");
        assert_eq!(cni["plugins"][0]["type"], "loopback");
    }
}

//! Names and loopback addresses of the simulated nodes (pure, no I/O).
//!
//! Scheme (everything inside 127.0.0.0/8, see docs/local-control-plane.md):
//! - control plane processes: 127.0.0.1
//! - node n (1-based) InternalIP: 127.1.x.y with x = (n-1)/250, y = (n-1)%250 + 1
//!   (never .0 nor .255; up to 64 000 nodes)
//! - node n podCIDR: 127.(128 + (n-1)/256).((n-1)%256).0/24 (up to 32 768 nodes,
//!   254 pod IPs each; hostNetwork pods get the node's InternalIP)
//! - service cluster-IP range: 127.2.0.0/16, data only: nothing ever dials it
//! - kwok's fallback pod CIDR / node IP (used only for nodes we did not create): 127.127.255.0/24
//! - a fault-proxied task simulator's own listener (`dev sim-runner --fault-dir`, behind the
//!   proxy on its pod's address): 127.100.x.y, one address per simulator
//! - real node r (1-based, a kubelet and a containerd of its own): realNNN, InternalIP
//!   127.3.B.r, B = the plane's block (from its state directory, so that two planes' real
//!   nodes never share an address); its pods are host-network pods on that address

use std::net::Ipv4Addr;

/// Largest node count the address scheme supports (bounded by the podCIDR range).
pub const MAX_NODES: u32 = 128 * 256;
/// Service cluster-IP range given to the apiserver (never dialled).
pub const SERVICE_CIDR: &str = "127.2.0.0/16";
/// kwok's default pod CIDR, only for nodes without a podCIDR.
pub const FALLBACK_POD_CIDR: &str = "127.127.255.0/24";
/// kwok's default node IP, only for nodes without an InternalIP.
pub const FALLBACK_NODE_IP: &str = "127.127.254.1";
/// Label carrying the short host name a workflow's machine_id uses.
pub const HOST_LABEL: &str = "envbridge.dev/host";
/// Label kwok selects its managed nodes by.
pub const KWOK_NODE_LABEL: (&str, &str) = ("type", "kwok");
/// Label naming the kwok process (its shard, from 0) that manages a simulated node, on a
/// plane with more than one (see `dev::plane::kwok`).
pub const KWOK_SHARD_LABEL: &str = "envbridge.dev/kwok-shard";

/// The kwok shard of node `n` (1-based) on a plane of `shards` kwok processes: nodes taken in
/// turn, so that a run's pods, in whatever order of nodes they come, load every shard alike.
/// None with one kwok (it manages every simulated node; no label).
pub fn kwok_shard(n: u32, shards: u32) -> Option<u32> {
    (shards > 1 && n > 0).then(|| (n - 1) % shards)
}

/// Label saying whether a node runs containers: `real` (a kubelet) or `simulated` (kwok).
pub const NODE_KIND_LABEL: &str = "envbridge.dev/node-kind";
pub const NODE_KIND_REAL: &str = "real";
pub const NODE_KIND_SIMULATED: &str = "simulated";
/// Real nodes one plane runs at most: each is a kubelet (~90 MiB) and a containerd.
pub const MAX_REAL_NODES: u32 = 32;

/// Addresses [`sim_upstream_ip`] hands out before it wraps.
pub const SIM_UPSTREAM_IPS: u32 = 256 * 254;

/// The `n`-th address (wrapping) a fault-proxied simulator listens on behind its proxy:
/// 127.100.x.y, never .0 nor .255. A simulator of its own address cannot lose its port to
/// another one between the runner's choice and its bind, as on a shared 127.0.0.1.
pub fn sim_upstream_ip(n: u32) -> Ipv4Addr {
    let n = n % SIM_UPSTREAM_IPS;
    Ipv4Addr::new(127, 100, (n / 254) as u8, (n % 254 + 1) as u8)
}

/// Short host name of real node `r` (1-based): real001 ...
pub fn real_host_name(r: u32) -> String {
    format!("real{r:03}")
}

/// Kubernetes Node name of real node `r`: real001.cluster.local.
pub fn real_node_name(r: u32) -> String {
    format!("{}.cluster.local", real_host_name(r))
}

/// Loopback InternalIP of real node `r` (1-based) of the plane with block `block`:
/// 127.3.block.r.
pub fn real_node_ip(block: u8, r: u32) -> Option<Ipv4Addr> {
    if r == 0 || r > MAX_REAL_NODES {
        return None;
    }
    Some(Ipv4Addr::new(127, 3, block, u8::try_from(r).ok()?))
}

/// The address block of the plane whose state lives in `dir`: stable for a directory,
/// different (but for a 1-in-250 chance) between two.
pub fn real_block(dir: &std::path::Path) -> u8 {
    let h = blake3::hash(dir.as_os_str().as_encoded_bytes());
    h.as_bytes()[0] % 250
}

/// Whether `ip` is a real node's address (its host-network pods have it): the sim-runner
/// leaves those pods to their kubelet.
pub fn is_real_node_ip(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let o = v4.octets();
            o[0] == 127 && o[1] == 3
        }
        std::net::IpAddr::V6(_) => false,
    }
}

/// Short host name of node `n` (1-based): flp001, ..., flp999, flp1000 ...
pub fn host_name(n: u32) -> String {
    format!("flp{n:03}")
}

/// Kubernetes Node name of node `n`: flp001.cluster.local.
pub fn node_name(n: u32) -> String {
    format!("{}.cluster.local", host_name(n))
}

/// Loopback InternalIP of node `n` (1-based).
pub fn node_ip(n: u32) -> Option<Ipv4Addr> {
    if n == 0 || n > MAX_NODES {
        return None;
    }
    let i = n - 1;
    let x = u8::try_from(i / 250).ok()?;
    let y = u8::try_from(i % 250 + 1).ok()?;
    Some(Ipv4Addr::new(127, 1, x, y))
}

/// Pod CIDR (/24) of node `n` (1-based).
pub fn pod_cidr(n: u32) -> Option<String> {
    if n == 0 || n > MAX_NODES {
        return None;
    }
    let i = n - 1;
    let second = u8::try_from(128 + i / 256).ok()?;
    let third = u8::try_from(i % 256).ok()?;
    Some(format!("127.{second}.{third}.0/24"))
}

/// Node index from a node name produced by [`node_name`] (flp007.cluster.local -> 7).
pub fn node_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("flp")?.strip_suffix(".cluster.local")?;
    if digits.len() < 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn real_nodes_have_their_own_names_and_block() {
        assert_eq!(real_node_name(2), "real002.cluster.local");
        assert_eq!(real_node_ip(7, 2), Some(Ipv4Addr::new(127, 3, 7, 2)));
        assert_eq!(real_node_ip(0, 0), None);
        assert_eq!(real_node_ip(0, MAX_REAL_NODES + 1), None);
        let b = real_block(std::path::Path::new("/s/dev"));
        assert_eq!(b, real_block(std::path::Path::new("/s/dev")));
        assert!(b < 250);
        assert!(is_real_node_ip("127.3.9.2".parse().unwrap()));
        assert!(!is_real_node_ip("127.1.0.2".parse().unwrap()));
        // Never a kwok node's address nor the service range.
        for n in [1, 250, 251, MAX_NODES] {
            assert!(!is_real_node_ip(node_ip(n).unwrap().into()));
        }
        assert_eq!(node_index(&real_node_name(1)), None);
    }

    #[test]
    fn names_are_zero_padded_fqdns() {
        assert_eq!(host_name(1), "flp001");
        assert_eq!(node_name(42), "flp042.cluster.local");
        assert_eq!(node_name(1000), "flp1000.cluster.local");
        assert_eq!(node_index("flp042.cluster.local"), Some(42));
        assert_eq!(node_index("flp1000.cluster.local"), Some(1000));
        assert_eq!(node_index("flp000.cluster.local"), None);
        assert_eq!(node_index("flp42.cluster.local"), None);
        assert_eq!(node_index("other.cluster.local"), None);
    }

    #[test]
    fn node_ips_are_distinct_loopback_and_never_network_or_broadcast() {
        let mut seen = HashSet::new();
        for n in 1..=2000 {
            let ip = node_ip(n).expect("in range");
            assert!(ip.is_loopback(), "{ip}");
            let o = ip.octets();
            assert!(o[3] != 0 && o[3] != 255, "{ip}");
            assert_eq!(o[1], 1);
            assert!(seen.insert(ip), "duplicate {ip}");
        }
        assert_eq!(node_ip(1), Some(Ipv4Addr::new(127, 1, 0, 1)));
        assert_eq!(node_ip(251), Some(Ipv4Addr::new(127, 1, 1, 1)));
        assert_eq!(node_ip(0), None);
        assert_eq!(node_ip(MAX_NODES + 1), None);
        assert!(node_ip(MAX_NODES).is_some());
    }

    #[test]
    fn pod_cidrs_are_distinct_loopback_and_disjoint_from_node_ips() {
        let mut seen = HashSet::new();
        for n in 1..=MAX_NODES {
            let cidr = pod_cidr(n).expect("in range");
            let (base, len) = cidr.split_once('/').expect("cidr");
            assert_eq!(len, "24");
            let ip: Ipv4Addr = base.parse().expect("ip");
            assert!(ip.is_loopback());
            assert!(ip.octets()[1] >= 128, "{cidr} overlaps node/service ranges");
            assert!(seen.insert(cidr));
        }
        assert_eq!(pod_cidr(1).as_deref(), Some("127.128.0.0/24"));
        assert_eq!(pod_cidr(257).as_deref(), Some("127.129.0.0/24"));
        assert_eq!(pod_cidr(MAX_NODES + 1), None);
        assert!(!seen.contains(FALLBACK_POD_CIDR));
    }

    #[test]
    fn simulators_behind_proxies_get_distinct_addresses_of_their_own() {
        let mut seen = HashSet::new();
        for n in 0..SIM_UPSTREAM_IPS {
            let ip = sim_upstream_ip(n);
            assert!(ip.is_loopback());
            assert_eq!(ip.octets()[1], 100, "{ip} leaves its range");
            assert!(!matches!(ip.octets()[3], 0 | 255), "{ip}");
            assert!(seen.insert(ip), "duplicate {ip}");
        }
        assert_eq!(sim_upstream_ip(SIM_UPSTREAM_IPS), sim_upstream_ip(0));
        assert!(!seen.contains(&node_ip(1).unwrap()));
    }
}

//! Deterministic names and ids: everything derives from a hash of the environment id and the
//! role path (and channel), so re-rendering gives the same strings and two environments never
//! collide.

use sha2::{Digest, Sha256};

/// Longest Kubernetes label value / DNS-1123 label.
pub const DNS_LABEL_MAX: usize = 63;
/// Longest environment object name (leaves room for TaskSet suffixes).
const ENV_NAME_MAX: usize = 40;

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The first `hex_len` hex digits (even) of the SHA-256 of `parts` joined by NUL bytes
/// (hashed piecewise: no joined copy, no digits that are cut off anyway).
fn hash_of(parts: &[&str], hex_len: usize) -> String {
    let mut out = String::with_capacity(hex_len);
    push_hash(&mut out, parts, hex_len);
    out
}

/// Appends [`hash_of`] to `out`.
fn push_hash(out: &mut String, parts: &[&str], hex_len: usize) {
    let mut h = Sha256::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update(b"\0");
        }
        h.update(p.as_bytes());
    }
    let digest = h.finalize();
    let bytes = &digest[..(hex_len / 2).min(digest.len())];
    let mut hex = [0u8; 64];
    let hex = &mut hex[..bytes.len() * 2];
    // The buffer is exactly twice the bytes long, so this cannot fail; hex digits are ASCII.
    let _ = hex::encode_to_slice(bytes, hex);
    out.push_str(&String::from_utf8_lossy(hex));
}

/// Lowercase, `[a-z0-9-]` only, no leading/trailing `-`, runs of `-` collapsed.
pub fn dns_label(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    push_dns_label(&mut out, &[s], max);
    out
}

/// Appends [`dns_label`] of `parts` joined (no joined copy made) to `out`, which is empty.
fn push_dns_label(out: &mut String, parts: &[&str], max: usize) {
    for c in parts.iter().flat_map(|p| p.chars()) {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.truncate(max);
    while out.ends_with('-') {
        out.pop();
    }
}

pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty() && s.len() <= DNS_LABEL_MAX && dns_label(s, DNS_LABEL_MAX) == s
}

/// The Environment object's name: the id lowercased; when that changes more than case or
/// the id is no DNS label, a hash of the exact id is appended so that ids differing only in
/// case or punctuation still get distinct names.
pub fn environment_name(env_id: &str) -> String {
    let base = dns_label(env_id, ENV_NAME_MAX);
    if base == env_id && !base.is_empty() {
        return base;
    }
    let h = &hash_of(&["env", env_id], 8);
    let base = dns_label(&base, ENV_NAME_MAX - 9);
    if base.is_empty() {
        format!("env-{h}")
    } else {
        format!("{base}-{h}")
    }
}

/// A Task object's name: `<class>-<host>-<hash>`; the hash covers environment id and role path,
/// so names are unique across environments and for several tasks of one class on one node.
pub fn task_name(env_id: &str, path: &str, class: &str, node: &str) -> String {
    let host = node.split('.').next().unwrap_or(node);
    let mut name = String::with_capacity(DNS_LABEL_MAX);
    push_dns_label(&mut name, &[class, "-", host], DNS_LABEL_MAX - 11);
    if name.is_empty() {
        name.push('t');
    }
    name.push('-');
    push_hash(&mut name, &["task", env_id, path], 10);
    name
}

/// The task id (FairMQ `--id`), unique within the environment.
pub fn task_id(env_id: &str, path: &str) -> String {
    crate::workflow::expr::short_id_of(&[env_id, "\0task\0", path])
}

/// An abstract IPC socket name, `[a-z0-9.-]` only, identical on both sides of the channel.
pub fn ipc_address(env_id: &str, path: &str, channel: &str) -> String {
    let mut a = String::with_capacity(30);
    a.push_str("ipc://@eb-");
    push_hash(&mut a, &["ipc", env_id, path, channel], 20);
    a
}

/// The default environment id when none is given: stable for one workflow.
pub fn default_env_id(workflow: &str) -> String {
    crate::workflow::expr::short_id(&format!("envbridge\0{workflow}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_safe_and_distinct() {
        assert_eq!(environment_name("env1"), "env1");
        let a = environment_name("31jdWLL4XL6");
        let b = environment_name("31jdwll4xl6");
        assert_ne!(a, b);
        assert!(is_dns_label(&a), "{a}");
        let n1 = task_name(
            "E",
            "w.h.stfb",
            "stfbuilder-senderoutput",
            "flp001.cluster.local",
        );
        let n2 = task_name(
            "E",
            "w.h.stfb2",
            "stfbuilder-senderoutput",
            "flp001.cluster.local",
        );
        let n3 = task_name(
            "F",
            "w.h.stfb",
            "stfbuilder-senderoutput",
            "flp001.cluster.local",
        );
        assert!(is_dns_label(&n1), "{n1}");
        assert!(n1.starts_with("stfbuilder-senderoutput-flp001-"));
        assert!(n1 != n2 && n1 != n3);
        assert_eq!(dns_label("Ä-é_x..Y ü", 63), "x-y");
        assert_eq!(dns_label("--Flp001.Cluster--", 63), "flp001-cluster");
        let long = task_name("E", "p", &"x".repeat(200), "n");
        assert!(is_dns_label(&long), "{long}");
        let ipc = ipc_address("E", "w.h.readout", "readout");
        assert!(
            ipc["ipc://@".len()..]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
    }
}

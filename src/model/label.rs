//! Kubernetes label values derived from names (environments, nodes, tasks): kept when valid,
//! otherwise cut with a hash suffix so that distinct names stay distinct.

use sha2::{Digest, Sha256};

/// Kubernetes label values: at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends.
const LABEL_MAX: usize = 63;

/// A valid label value for `s`: kept when valid; otherwise sanitized, and when too long cut
/// and suffixed with a hash of the full string so that distinct inputs stay distinct.
pub fn label_value(s: &str) -> String {
    if is_valid_label_value(s) {
        return s.to_string();
    }
    let clean: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let hash = short_hash(s);
    let keep = LABEL_MAX - hash.len() - 1;
    let head: String = clean.chars().take(keep).collect();
    let head = head.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if head.is_empty() {
        hash
    } else {
        format!("{head}-{hash}")
    }
}

fn is_valid_label_value(s: &str) -> bool {
    s.len() <= LABEL_MAX
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && s.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && s.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
}

pub fn short_hash(s: &str) -> String {
    hex::encode(&Sha256::digest(s.as_bytes())[..5])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_label_values_are_kept_others_cut_with_hash() {
        assert_eq!(label_value("flp001"), "flp001");
        let long = "a".repeat(80);
        let v = label_value(&long);
        assert_eq!(v.len(), 63);
        assert!(is_valid_label_value(&v));
        assert_ne!(label_value(&format!("{long}b")), v);
        let v = label_value("readout-dataflow/host:x");
        assert!(is_valid_label_value(&v), "{v}");
        assert!(v.starts_with("readout-dataflow-host-x-"));
    }
}

//! Object names and labels derived from a task reference, computed once per object.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::crd::labels;
use crate::plan::TaskRef;

/// Kubernetes label values: at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends.
const LABEL_MAX: usize = 63;
/// Service names are DNS-1035 labels: at most 63 characters, starting with a letter.
const SERVICE_MAX: usize = 63;

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

fn short_hash(s: &str) -> String {
    hex::encode(&Sha256::digest(s.as_bytes())[..5])
}

/// The headless Service of a task: the task name when it is a valid DNS-1035 label, otherwise
/// `t-` + name, cut with a hash suffix when longer than 63 characters.
pub fn service_name(task_name: &str) -> String {
    let base = if task_name.starts_with(|c: char| c.is_ascii_lowercase()) {
        task_name.to_string()
    } else {
        format!("t-{task_name}")
    };
    let base = base.replace('.', "-");
    if base.len() <= SERVICE_MAX && !base.ends_with('-') {
        return base;
    }
    let hash = short_hash(task_name);
    let head: String = base.chars().take(SERVICE_MAX - hash.len() - 1).collect();
    format!("{}-{hash}", head.trim_end_matches('-'))
}

/// Labels of a Task and of its Pod and Service (managed-by, environment, node, task, class).
pub fn task_labels(environment: &str, task: &TaskRef) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
        (labels::ENVIRONMENT.to_string(), label_value(environment)),
        (labels::NODE.to_string(), label_value(&task.node)),
        (labels::TASK.to_string(), label_value(&task.name)),
        (labels::CLASS.to_string(), label_value(&task.class)),
    ])
}

/// The role path does not fit a label value: it travels as an annotation.
pub fn task_annotations(task: &TaskRef) -> BTreeMap<String, String> {
    BTreeMap::from([(labels::ROLE_PATH.to_string(), task.path.clone())])
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

    #[test]
    fn service_names_are_dns_1035() {
        assert_eq!(service_name("readout-flp001"), "readout-flp001");
        assert_eq!(service_name("31jdwll4xl6-readout"), "t-31jdwll4xl6-readout");
        let long = format!("e{}", "x".repeat(100));
        let s = service_name(&long);
        assert_eq!(s.len(), 63);
        assert!(s.starts_with('e') && !s.ends_with('-'));
        assert_ne!(service_name(&format!("{long}y")), s);
        assert_eq!(service_name("a.b"), "a-b");
    }
}

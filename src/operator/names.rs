//! Object names and labels derived from a task reference, computed once per object.

use std::collections::BTreeMap;

use crate::crd::labels;
use crate::model::label::{label_value, short_hash};
use crate::plan::TaskRef;

/// Service names are DNS-1035 labels: at most 63 characters, starting with a letter.
const SERVICE_MAX: usize = 63;

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

/// Labels of a Task and of its Pod and Service (managed-by, environment, node, task, class,
/// and the environment's operator shard when it has one: the shard's watches select on it).
pub fn task_labels(
    environment: &str,
    task: &TaskRef,
    shard: Option<&str>,
) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
        (labels::ENVIRONMENT.to_string(), label_value(environment)),
        (labels::NODE.to_string(), label_value(&task.node)),
        (labels::TASK.to_string(), label_value(&task.name)),
        (labels::CLASS.to_string(), label_value(&task.class)),
    ]);
    crate::crd::shard::stamp(&mut l, shard);
    l
}

/// The role path does not fit a label value: it travels as an annotation.
pub fn task_annotations(task: &TaskRef) -> BTreeMap<String, String> {
    BTreeMap::from([(labels::ROLE_PATH.to_string(), task.path.clone())])
}

#[cfg(test)]
mod tests {
    use super::*;

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

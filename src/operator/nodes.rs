//! machine_id -> Kubernetes Node name. Pure: works on (name, labels) pairs from the node store.
//!
//! Workflows name hosts by their short name (`flp001`) while Kubernetes names nodes by FQDN
//! (`flp001.cluster.local`): the label `envbridge.dev/host=flp001` joins them, and only a
//! labelled Node ever receives a task.

use std::collections::BTreeMap;

use crate::crd::labels;

/// Why a machine_id names no single Node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error(
        "no Node for machine_id {id:?}: none is labelled {label}={id} (tasks run only on nodes an administrator labelled: kubectl label node NODE {label}={id})"
    )]
    NotFound { id: String, label: &'static str },
    #[error("machine_id {id:?} is ambiguous: {rule} matches several Nodes ({})", .nodes.join(", "))]
    Ambiguous {
        id: String,
        rule: &'static str,
        nodes: Vec<String>,
    },
}

/// The Node a task with `machine_id` runs on: the single Node labelled
/// `envbridge.dev/host=<id>`. A Node without the label (the control plane, another tenant's)
/// is never a task's node, whatever its name (docs/security.md).
pub fn resolve<'a, I>(machine_id: &str, nodes: I) -> Result<String, NodeError>
where
    I: IntoIterator<Item = (&'a str, Option<&'a BTreeMap<String, String>>)> + Clone,
{
    let labelled: Vec<&str> = nodes
        .into_iter()
        .filter(|(_, l)| {
            l.and_then(|l| l.get(labels::HOST))
                .is_some_and(|v| v == machine_id)
        })
        .map(|(n, _)| n)
        .collect();
    match labelled.as_slice() {
        [one] => Ok((*one).to_string()),
        [] => Err(NodeError::NotFound {
            id: machine_id.to_string(),
            label: labels::HOST,
        }),
        many => Err(ambiguous(machine_id, "the host label", many)),
    }
}

fn ambiguous(id: &str, rule: &'static str, nodes: &[&str]) -> NodeError {
    let mut nodes: Vec<String> = nodes.iter().map(|s| s.to_string()).collect();
    nodes.sort();
    NodeError::Ambiguous {
        id: id.to_string(),
        rule,
        nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, host: Option<&str>) -> (String, BTreeMap<String, String>) {
        let mut l = BTreeMap::new();
        if let Some(h) = host {
            l.insert(labels::HOST.to_string(), h.to_string());
        }
        (name.to_string(), l)
    }

    fn run(id: &str, nodes: &[(String, BTreeMap<String, String>)]) -> Result<String, NodeError> {
        resolve(id, nodes.iter().map(|(n, l)| (n.as_str(), Some(l))))
    }

    #[test]
    fn label_wins_over_name() {
        let nodes = [
            node("flp001", None),
            node("x.cluster.local", Some("flp001")),
        ];
        assert_eq!(run("flp001", &nodes).unwrap(), "x.cluster.local");
    }

    #[test]
    fn a_node_without_the_label_is_never_chosen() {
        // Named like the host (or its FQDN), but not labelled: no task goes there.
        let nodes = [node("flp001", None), node("flp001.cluster.local", None)];
        let err = run("flp001", &nodes).unwrap_err();
        assert!(matches!(err, NodeError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("envbridge.dev/host=flp001"));
        let nodes = [node("a", Some("h")), node("b", Some("h"))];
        assert_eq!(
            run("h", &nodes).unwrap_err().to_string(),
            "machine_id \"h\" is ambiguous: the host label matches several Nodes (a, b)"
        );
    }
}

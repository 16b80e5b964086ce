//! machine_id -> Kubernetes Node name.
//!
//! Workflows name hosts by their short name (`flp001`) while Kubernetes names nodes by FQDN
//! (`flp001.cluster.local`): the label `envbridge.dev/host=flp001` joins them, and only a
//! labelled Node ever receives a task. [`NodeIndex`] holds the Nodes by that label, fed by
//! the one Node watch (apply, delete, and a relist that replaces everything): a pod's node
//! is one lookup, where a scan of every Node per pod was 12.5 million label reads for
//! 10,000 pods on 1,250 nodes. Plain data behind one lock; unit-tested by feeding it events.

use std::sync::RwLock;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::watcher;

use super::watch_index::{Groups, Index, Relisting};
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

/// Nodes by their host label.
#[derive(Default)]
pub struct NodeIndex {
    inner: RwLock<Relisting<Inner>>,
}

#[derive(Default)]
struct Inner {
    /// Node names by their host label value.
    by_host: Groups<String, String>,
}

impl Index for Inner {
    type Object = Node;
    /// A Node's name and host label (None: not labelled, never a task's node).
    type Entry = (String, Option<String>);

    fn entry(n: &Node) -> Self::Entry {
        (n.name_any(), n.labels().get(labels::HOST).cloned())
    }

    fn apply(&mut self, (name, host): Self::Entry) {
        self.by_host.set(name, host);
    }

    fn delete(&mut self, n: &Node) {
        self.by_host.remove(&n.name_any());
    }

    fn clear(&mut self) {
        self.by_host.clear();
    }
}

impl NodeIndex {
    /// Takes one event of the Node watch.
    pub fn observe(&self, ev: &watcher::Event<Node>) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.observe(ev);
    }

    /// The Node a task with `machine_id` runs on: the single Node labelled
    /// `envbridge.dev/host=<id>`. A Node without the label (the control plane, another
    /// tenant's) is never a task's node, whatever its name (docs/security.md).
    pub fn resolve(&self, machine_id: &str) -> Result<String, NodeError> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let labelled: Vec<&str> = inner
            .index
            .by_host
            .members(machine_id)
            .map(String::as_str)
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
    use std::collections::BTreeMap;

    fn node(name: &str, host: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels =
            host.map(|h| BTreeMap::from([(labels::HOST.to_string(), h.to_string())]));
        n
    }

    fn index(nodes: &[Node]) -> NodeIndex {
        let ix = NodeIndex::default();
        for n in nodes {
            ix.observe(&watcher::Event::Apply(n.clone()));
        }
        ix
    }

    #[test]
    fn label_wins_over_name() {
        let ix = index(&[
            node("flp001", None),
            node("x.cluster.local", Some("flp001")),
        ]);
        assert_eq!(ix.resolve("flp001").unwrap(), "x.cluster.local");
    }

    #[test]
    fn a_node_without_the_label_is_never_chosen() {
        // Named like the host (or its FQDN), but not labelled: no task goes there.
        let ix = index(&[node("flp001", None), node("flp001.cluster.local", None)]);
        let err = ix.resolve("flp001").unwrap_err();
        assert!(matches!(err, NodeError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("envbridge.dev/host=flp001"));
        let ix = index(&[node("b", Some("h")), node("a", Some("h"))]);
        assert_eq!(
            ix.resolve("h").unwrap_err().to_string(),
            "machine_id \"h\" is ambiguous: the host label matches several Nodes (a, b)"
        );
    }

    #[test]
    fn relabel_delete_and_relist() {
        let ix = index(&[node("n1", Some("h1")), node("n2", Some("h2"))]);
        // Relabelled: found under its new host only.
        ix.observe(&watcher::Event::Apply(node("n1", Some("h3"))));
        assert!(ix.resolve("h1").is_err());
        assert_eq!(ix.resolve("h3").unwrap(), "n1");
        // Its label removed: no task's node any more.
        ix.observe(&watcher::Event::Apply(node("n1", None)));
        assert!(ix.resolve("h3").is_err());
        ix.observe(&watcher::Event::Delete(node("n2", Some("h2"))));
        assert!(ix.resolve("h2").is_err());
        // A relist replaces everything at its end; until then the old view stands.
        ix.observe(&watcher::Event::Apply(node("n4", Some("h4"))));
        ix.observe(&watcher::Event::Init);
        ix.observe(&watcher::Event::InitApply(node("n5", Some("h5"))));
        assert_eq!(ix.resolve("h4").unwrap(), "n4");
        assert!(ix.resolve("h5").is_err());
        ix.observe(&watcher::Event::InitDone);
        assert!(ix.resolve("h4").is_err());
        assert_eq!(ix.resolve("h5").unwrap(), "n5");
    }
}

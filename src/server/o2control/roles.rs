//! An environment's workflow tree as the anchor's `RoleInfo` (GetEnvironment with
//! `showWorkflowTree`, GetRoles), built from the roster's tasks: every task's path in the
//! workflow (`root.host-flp001.readout`) names the roles above it. A role holds the ids of
//! every task below it; its state and status are the anchor's products over its children.

use std::sync::Arc;

use super::glob::Glob;
use super::pb::o2control as pb;
use super::state_map;
use crate::roster::TaskRecord;

/// A role while the tree is built: a leaf is one task.
#[derive(Default)]
struct Node {
    name: String,
    path: String,
    /// (task id, state, status, critical) of the tasks below, the leaf's own first.
    tasks: Vec<(String, &'static str, &'static str, bool)>,
    children: Vec<Node>,
}

impl Node {
    fn child(&mut self, name: &str) -> &mut Node {
        let i = match self.children.iter().position(|c| c.name == name) {
            Some(i) => i,
            None => {
                self.children.push(Node {
                    name: name.to_string(),
                    path: format!("{}.{name}", self.path),
                    ..Default::default()
                });
                self.children.len() - 1
            }
        };
        &mut self.children[i]
    }

    fn critical(&self) -> bool {
        self.tasks.iter().any(|t| t.3)
    }

    /// (state, status): a task's own; a role's the product over its children, where only
    /// children holding a critical task count (all of them when none does).
    fn product(&self) -> (String, String) {
        if self.children.is_empty() {
            return match self.tasks.first() {
                Some((_, state, status, _)) => (state.to_string(), status.to_string()),
                None => ("UNKNOWN".into(), "UNDEFINED".into()),
            };
        }
        let any_critical = self.children.iter().any(Node::critical);
        let counted = self
            .children
            .iter()
            .filter(|c| !any_critical || c.critical())
            .map(Node::product);
        let (mut state, mut status): (Option<String>, Option<String>) = (None, None);
        for (s, st) in counted {
            state = Some(match state {
                None => s,
                Some(a) => state_product(&a, &s).to_string(),
            });
            status = Some(match status {
                None => st,
                Some(a) => status_product(&a, &st).to_string(),
            });
        }
        (
            state.unwrap_or_else(|| "UNKNOWN".into()),
            status.unwrap_or_else(|| "UNDEFINED".into()),
        )
    }

    fn info(&self) -> pb::RoleInfo {
        let (state, status) = self.product();
        pb::RoleInfo {
            name: self.name.clone(),
            status,
            state,
            full_path: self.path.clone(),
            task_ids: self.tasks.iter().map(|t| t.0.clone()).collect(),
            roles: self.children.iter().map(Node::info).collect(),
            ..Default::default()
        }
    }
}

/// The anchor's state product: equal states stay, ERROR wins, INVARIANT is the identity,
/// anything else disagreeing is MIXED.
fn state_product<'a>(a: &'a str, b: &'a str) -> &'a str {
    match (a, b) {
        _ if a == b => a,
        ("ERROR", _) | (_, "ERROR") => "ERROR",
        ("INVARIANT", x) | (x, "INVARIANT") => x,
        _ => "MIXED",
    }
}

/// The anchor's status product: UNDEFINED, then UNDEPLOYABLE, win; ACTIVE with INACTIVE is
/// PARTIAL.
fn status_product<'a>(a: &'a str, b: &'a str) -> &'a str {
    match (a, b) {
        _ if a == b => a,
        ("UNDEFINED", _) | (_, "UNDEFINED") => "UNDEFINED",
        ("UNDEPLOYABLE", _) | (_, "UNDEPLOYABLE") => "UNDEPLOYABLE",
        _ => "PARTIAL",
    }
}

/// The tree under `root` (the workflow's name) of an environment's tasks. A task whose path
/// does not start at the root hangs under the root by its whole path (the roster never holds
/// one; nothing is dropped if it does).
pub fn tree(root: &str, tasks: &[Arc<TaskRecord>]) -> pb::RoleInfo {
    let mut top = Node {
        name: root.to_string(),
        path: root.to_string(),
        ..Default::default()
    };
    for t in tasks {
        let entry = (
            t.name.to_string(),
            state_map::task_state(t.state),
            state_map::task_status(t.state),
            t.critical,
        );
        let below = t
            .path
            .strip_prefix(root)
            .and_then(|rest| rest.strip_prefix('.'))
            .unwrap_or(&t.path);
        top.tasks.push(entry.clone());
        let mut node = &mut top;
        for part in below.split('.').filter(|p| !p.is_empty()) {
            node = node.child(part);
            node.tasks.push(entry.clone());
        }
    }
    top.info()
}

/// GetRoles: every role of the tree whose full path matches `path_spec` (the anchor's glob,
/// '.' separating the segments), in pre-order; an empty spec is the root alone.
pub fn query(tree: &pb::RoleInfo, path_spec: &str) -> Vec<pb::RoleInfo> {
    if path_spec.is_empty() {
        return vec![tree.clone()];
    }
    let g = Glob::new(path_spec, Some(b'.'));
    let mut out = Vec::new();
    let mut stack = vec![tree];
    while let Some(r) = stack.pop() {
        if g.matches(&r.full_path) {
            out.push(r.clone());
        }
        stack.extend(r.roles.iter().rev());
    }
    out
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::state::State;

    fn task(name: &str, path: &str, state: State, critical: bool) -> Arc<TaskRecord> {
        super::super::fixture::task(name, "flp001", path, state, critical)
    }

    fn tasks() -> Vec<Arc<TaskRecord>> {
        vec![
            task("r1", "rd.host-flp001.readout", State::Running, true),
            task("s1", "rd.host-flp001.stfb", State::Running, true),
            task("r2", "rd.host-flp002.readout", State::Running, true),
            task("q2", "rd.host-flp002.qc", State::Error, false),
        ]
    }

    #[test]
    fn the_tree_follows_the_paths_and_only_critical_children_decide() {
        let t = tree("rd", &tasks());
        assert_eq!((t.name.as_str(), t.full_path.as_str()), ("rd", "rd"));
        assert_eq!(t.task_ids, ["r1", "s1", "r2", "q2"]);
        // q2 is in ERROR but not critical: the host and the root stay RUNNING.
        assert_eq!((t.state.as_str(), t.status.as_str()), ("RUNNING", "ACTIVE"));
        assert_eq!(t.roles.len(), 2);
        let h2 = &t.roles[1];
        assert_eq!(h2.full_path, "rd.host-flp002");
        assert_eq!(h2.task_ids, ["r2", "q2"]);
        assert_eq!(h2.state, "RUNNING");
        let q2 = &h2.roles[1];
        assert_eq!(
            (q2.full_path.as_str(), q2.state.as_str()),
            ("rd.host-flp002.qc", "ERROR")
        );
        assert!(q2.roles.is_empty());
        assert_eq!(q2.task_ids, ["q2"]);
    }

    #[test]
    fn a_critical_error_wins_and_disagreement_is_mixed() {
        let mut ts = tasks();
        ts[1] = task("s1", "rd.host-flp001.stfb", State::Error, true);
        let t = tree("rd", &ts);
        assert_eq!(t.roles[0].state, "ERROR");
        assert_eq!(t.state, "ERROR");
        ts[1] = task("s1", "rd.host-flp001.stfb", State::Configured, true);
        assert_eq!(tree("rd", &ts).state, "MIXED");
        ts[1] = task("s1", "rd.host-flp001.stfb", State::Deploying, true);
        assert_eq!(tree("rd", &ts).roles[0].status, "PARTIAL");
        assert_eq!(state_product("INVARIANT", "RUNNING"), "RUNNING");
        assert_eq!(status_product("UNDEPLOYABLE", "ACTIVE"), "UNDEPLOYABLE");
        assert_eq!(status_product("UNDEFINED", "UNDEPLOYABLE"), "UNDEFINED");
    }

    #[test]
    fn roles_are_queried_by_glob_in_pre_order() {
        let t = tree("rd", &tasks());
        let paths = |spec: &str| -> Vec<String> {
            query(&t, spec).into_iter().map(|r| r.full_path).collect()
        };
        assert_eq!(paths(""), ["rd"]);
        assert_eq!(paths("rd.*"), ["rd.host-flp001", "rd.host-flp002"]);
        assert_eq!(
            paths("rd.*.readout"),
            ["rd.host-flp001.readout", "rd.host-flp002.readout"]
        );
        assert_eq!(paths("**").len(), 7);
        assert_eq!(
            paths("rd.host-flp002.**"),
            ["rd.host-flp002.readout", "rd.host-flp002.qc"]
        );
        assert!(paths("nothing").is_empty());
    }

    #[test]
    fn no_tasks_is_a_bare_root() {
        let t = tree("rd", &[]);
        assert!(t.roles.is_empty() && t.task_ids.is_empty());
        assert_eq!(
            (t.state.as_str(), t.status.as_str()),
            ("UNKNOWN", "UNDEFINED")
        );
    }
}

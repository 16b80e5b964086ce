//! The variables a workflow declares for its callers: the anchor's `!public` markers with all
//! their metadata (label, description, type, widget, values, panel, index, visibleif, ...),
//! in the `defaults` and `vars` of any role. What a daemon may let a caller set, and what a
//! form is built from.

use std::sync::Arc;

use super::model::{RoleKind, VarMeta, Workflow};

/// One declared variable.
#[derive(Clone, Debug, PartialEq)]
pub struct Declared {
    pub name: Arc<str>,
    /// Its value as written (a template's text when it holds no expression).
    pub default: Option<String>,
    pub meta: VarMeta,
}

/// The variables with a declaration (`!public`, or a mapping with metadata) in the
/// `defaults` and `vars` of every role of the file, as the anchor walks the whole file for
/// them, by name. The root role's come first: a name declared again further down keeps its
/// first declaration; within a role a `vars` entry wins over a `defaults` entry.
pub fn declared(wf: &Workflow) -> Vec<Declared> {
    let mut out: std::collections::BTreeMap<Arc<str>, Declared> = Default::default();
    let mut roles = vec![&wf.root];
    while let Some(role) = roles.pop() {
        let mut here: std::collections::BTreeMap<Arc<str>, Declared> = Default::default();
        for block in [&role.defaults, &role.vars] {
            for (name, meta) in block.meta.iter() {
                let default = block
                    .get(name)
                    .and_then(|t| t.as_literal().map(str::to_string));
                here.insert(
                    name.clone(),
                    Declared {
                        name: name.clone(),
                        default,
                        meta: meta.clone(),
                    },
                );
            }
        }
        for (name, d) in here {
            out.entry(name).or_insert(d);
        }
        if let RoleKind::Aggregator(children) = &role.kind {
            roles.extend(children.iter().rev());
        }
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::error::Loc;
    use crate::workflow::yaml;

    #[test]
    fn public_markers_keep_their_metadata() {
        let f: Arc<str> = Arc::from("w.yaml");
        let text = "name: w\ndefaults:\n  a: !public\n    value: \"x\"\n    type: bool\n    values: [\"x\", \"y\"]\n    visibleif: $$b === \"1\"\n  b: plain\n  c: !public \"3\"\nvars:\n  d:\n    value: \"{{ a }}\"\n    label: D\nroles: []\n";
        let node = yaml::parse(&f, text).unwrap();
        let _ = Loc::file_start(&f);
        let wf = crate::workflow::load::workflow_from_node(&node).unwrap();
        let d = declared(&wf);
        let names: Vec<&str> = d.iter().map(|v| &*v.name).collect();
        assert_eq!(names, ["a", "c", "d"]);
        assert!(d[0].meta.public && d[1].meta.public && !d[2].meta.public);
        assert_eq!(d[0].default.as_deref(), Some("x"));
        assert_eq!(d[0].meta.fields["type"], "bool");
        assert_eq!(d[0].meta.fields["values"], serde_json::json!(["x", "y"]));
        assert_eq!(d[0].meta.fields["visibleif"], "$$b === \"1\"");
        assert_eq!(d[2].default, None, "an expression has no literal default");
        assert_eq!(d[2].meta.fields["label"], "D");
    }

    #[test]
    fn public_variables_of_nested_roles_count_the_roots_first() {
        let f: Arc<str> = Arc::from("w.yaml");
        let text = "name: w\ndefaults:\n  a: !public\n    value: \"root\"\nroles:\n  - name: dcs\n    defaults:\n      dcs_sor_parameters: !public\n        value: \"{}\"\n        type: string\n      a: !public\n        value: \"nested\"\n    roles:\n      - name: deeper\n        vars:\n          deep: !public\n            value: \"1\"\n        task:\n          load: x\n";
        let node = yaml::parse(&f, text).unwrap();
        let wf = crate::workflow::load::workflow_from_node(&node).unwrap();
        let d = declared(&wf);
        let names: Vec<&str> = d.iter().map(|v| &*v.name).collect();
        assert_eq!(names, ["a", "dcs_sor_parameters", "deep"]);
        assert_eq!(
            d[0].default.as_deref(),
            Some("root"),
            "the root's declaration wins"
        );
        assert_eq!(d[1].default.as_deref(), Some("{}"));
        assert!(d.iter().all(|v| v.meta.public));
    }
}

//! The variables a workflow declares for its callers: the anchor's `!public` markers with all
//! their metadata (label, description, type, widget, values, panel, index, visibleif, ...),
//! in the root role's `defaults` and `vars`. What a daemon may let a caller set, and what a
//! form is built from.

use std::sync::Arc;

use super::model::{VarMeta, Workflow};

/// One declared variable.
#[derive(Clone, Debug, PartialEq)]
pub struct Declared {
    pub name: Arc<str>,
    /// Its value as written (a template's text when it holds no expression).
    pub default: Option<String>,
    pub meta: VarMeta,
}

/// The root role's variables with a declaration (`!public`, or a mapping with metadata), by
/// name; a `vars` entry wins over a `defaults` entry of the same name.
pub fn declared(wf: &Workflow) -> Vec<Declared> {
    let mut out: std::collections::BTreeMap<Arc<str>, Declared> = Default::default();
    for block in [&wf.root.defaults, &wf.root.vars] {
        for (name, meta) in block.meta.iter() {
            let default = block
                .get(name)
                .and_then(|t| t.as_literal().map(str::to_string));
            out.insert(
                name.clone(),
                Declared {
                    name: name.clone(),
                    default,
                    meta: meta.clone(),
                },
            );
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
}

//! The site's mapping from task classes to TaskTemplates (the pod shapes): so the anchor's
//! unmodified classes deploy with templates the site chose, by class or by control mode.
//!
//! ```yaml
//! classes:                # by the class's file name (what `load:` names)
//!   readout: readout
//! modes:                  # otherwise by control mode: direct, fairmq, basic, hook
//!   fairmq: fairmq-device
//!   hook: hook-task
//! ```
//! A task's template: its class's entry, else the `task_template` variable, else its mode's
//! entry, else the class's `name:` (else its file name).

use std::collections::BTreeMap;
use std::path::Path;

use super::ControlMode;
use super::resolve::control_mode;
use crate::workflow::error::{Error, Result};
use crate::workflow::load::read_yaml;
use crate::workflow::yaml::{Kind, Node};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TemplateMap {
    pub classes: BTreeMap<String, String>,
    pub modes: BTreeMap<ControlModeKey, String>,
}

/// A control mode as a map key (ordered, for a stable map).
pub type ControlModeKey = u8;

fn key(m: ControlMode) -> ControlModeKey {
    m as u8
}

impl TemplateMap {
    /// Reads a mapping file; errors name the file, line and column.
    pub fn load(path: &Path) -> Result<Self> {
        let node = read_yaml(path)?;
        let mut map = TemplateMap::default();
        let Kind::Map(entries) = &node.kind else {
            return Err(Error::new(
                &node.loc,
                "a template mapping: expected `classes:` and `modes:`",
            ));
        };
        for (k, v) in entries {
            match k.as_str() {
                Some("classes") => {
                    for (name, tmpl, _) in pairs(v)? {
                        map.classes.insert(name, tmpl);
                    }
                }
                Some("modes") => {
                    for (name, tmpl, loc) in pairs(v)? {
                        let mode = control_mode(&name).ok_or_else(|| {
                            Error::new(&loc, format!("unknown control mode `{name}`"))
                        })?;
                        map.modes.insert(key(mode), tmpl);
                    }
                }
                _ => {
                    return Err(Error::new(
                        &k.loc,
                        "unknown field (expected `classes` or `modes`)",
                    ));
                }
            }
        }
        Ok(map)
    }

    /// The mapped template of a class (by file name), if any.
    pub fn for_class(&self, class: &str) -> Option<&str> {
        self.classes.get(class).map(String::as_str)
    }

    /// The mapped template of a control mode, if any.
    pub fn for_mode(&self, mode: ControlMode) -> Option<&str> {
        self.modes.get(&key(mode)).map(String::as_str)
    }
}

/// (key, value, key's place) of a mapping of names to template names.
fn pairs(node: &Node) -> Result<Vec<(String, String, crate::workflow::error::Loc)>> {
    match &node.kind {
        Kind::Null => Ok(Vec::new()),
        Kind::Map(m) => m
            .iter()
            .map(|(k, v)| match (k.as_str(), v.as_str()) {
                (Some(k2), Some(v2)) if !v2.trim().is_empty() => {
                    Ok((k2.to_string(), v2.trim().to_string(), k.loc.clone()))
                }
                _ => Err(Error::new(
                    &v.loc,
                    "expected a template name (a string) for each entry",
                )),
            })
            .collect(),
        _ => Err(Error::new(&node.loc, "expected a mapping of names")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_classes_and_modes_and_names_bad_entries() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.yaml");
        std::fs::write(
            &p,
            "classes:\n  readout: ro\nmodes:\n  kubectl_fairmq: fmq\n",
        )
        .unwrap();
        let m = TemplateMap::load(&p).unwrap();
        assert_eq!(m.for_class("readout"), Some("ro"));
        assert_eq!(m.for_mode(ControlMode::Fairmq), Some("fmq"));
        assert_eq!(m.for_mode(ControlMode::Hook), None);
        std::fs::write(&p, "modes:\n  weird: x\n").unwrap();
        let e = TemplateMap::load(&p).unwrap_err().to_string();
        assert!(e.contains("t.yaml:2:3") && e.contains("weird"), "{e}");
        std::fs::write(&p, "clases: {}\n").unwrap();
        assert!(TemplateMap::load(&p).is_err());
    }
}

//! What a caller of the daemon may ask of a workflow (docs/security.md). Pure.
//!
//! A caller sets `hosts` (the machines of its environment), the variables the workflow
//! declares public (the anchor's `!public`, checked against their declared type and values)
//! and those the site's allow-list names; nothing else. The command and the TaskTemplate of a
//! task come from its class and the site's mapping: [`command_changes`] compares a render with
//! the caller's public variables to one without them. A caller's value that reaches a
//! `shell: true` command line must hold no shell syntax ([`shell_problems`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::plan::TaskRef;
use crate::workflow::public::Declared;

/// The variable every caller may set: the environment's machines.
pub const HOSTS: &str = "hosts";

/// What a site lets its callers do (the daemon's settings).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallerPolicy {
    /// Variables callers may set besides `hosts` and the workflow's public ones.
    pub allowed: BTreeSet<String>,
    /// At most this many hosts per environment.
    pub max_hosts: usize,
    /// At most this many tasks per environment.
    pub max_tasks: usize,
}

impl CallerPolicy {
    /// The defaults: no extra variable; 1,000 hosts and 20,000 tasks per environment.
    pub fn new() -> CallerPolicy {
        CallerPolicy {
            allowed: BTreeSet::new(),
            max_hosts: 1000,
            max_tasks: 20_000,
        }
    }
}

/// The hosts a `hosts` value names: a JSON list of host names, or names separated by commas.
pub fn hosts_of(value: &str) -> Result<Vec<String>, String> {
    let list: Vec<String> = if value.trim_start().starts_with('[') {
        serde_json::from_str(value).map_err(|e| {
            format!("variable hosts: {value:?} is not a JSON list of host names ({e})")
        })?
    } else {
        value.split(',').map(|h| h.trim().to_string()).collect()
    };
    for h in &list {
        let ok = !h.is_empty()
            && h.len() <= 253
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
        if !ok {
            return Err(format!(
                "variable hosts: {h:?} is not a host name (letters, digits, '-', '.', '_')"
            ));
        }
    }
    Ok(list)
}

/// Every problem with a caller's variables (empty: allowed).
pub fn check(
    policy: &CallerPolicy,
    workflow: &str,
    declared: &[Declared],
    vars: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, value) in vars {
        if name == HOSTS {
            match hosts_of(value) {
                Ok(h) if h.len() > policy.max_hosts => problems.push(format!(
                    "variable hosts names {} hosts; this site allows at most {} per environment",
                    h.len(),
                    policy.max_hosts
                )),
                Ok(_) => {}
                Err(e) => problems.push(e),
            }
            continue;
        }
        if policy.allowed.contains(name) {
            continue;
        }
        match declared.iter().find(|d| &*d.name == name) {
            Some(d) if d.meta.public => {
                if let Err(e) = value_fits(d, value) {
                    problems.push(format!("variable {name}: {e}"));
                }
            }
            _ => problems.push(format!(
                "variable {name} may not be set by a caller: it is not `hosts`, not public in workflow {workflow} (`!public`), and not on this site's allow-list (daemon setting `caller-variables`)"
            )),
        }
    }
    problems
}

/// Single-choice widgets: the value must be one of `values`.
const CHOICE_WIDGETS: [&str; 3] = ["comboBox", "dropDownBox", "radioButtonBox"];

/// Whether `value` fits what the declaration says (type, allowed values).
pub fn value_fits(d: &Declared, value: &str) -> Result<(), String> {
    let field = |k: &str| d.meta.fields.get(k);
    let kind = field("type").and_then(|t| t.as_str()).unwrap_or("string");
    match kind {
        "number" if value.trim().parse::<f64>().is_err() => {
            return Err(format!("{value:?} is not a number"));
        }
        "bool" if !matches!(value, "true" | "false") => {
            return Err(format!("{value:?} is not true or false"));
        }
        _ => {}
    }
    let Some(values) = field("values").and_then(|v| v.as_array()) else {
        return Ok(());
    };
    let allowed: Vec<&str> = values.iter().filter_map(|v| v.as_str()).collect();
    if allowed.is_empty() {
        return Ok(());
    }
    let widget = field("widget").and_then(|w| w.as_str()).unwrap_or("");
    let chosen: Vec<String> = match serde_json::from_str::<Vec<String>>(value) {
        // A list (a detector selector, a multi-choice): each element must be allowed.
        Ok(list) if !CHOICE_WIDGETS.contains(&widget) => list,
        _ => vec![value.to_string()],
    };
    match chosen.iter().find(|c| !allowed.contains(&c.as_str())) {
        Some(bad) => Err(format!("{bad:?} is not one of {}", allowed.join(", "))),
        None => Ok(()),
    }
}

/// Characters a shell gives a meaning to.
const SHELL_SYNTAX: &[char] = &[
    ';', '|', '&', '$', '`', '<', '>', '(', ')', '{', '}', '\\', '\'', '"', '\n', '\r', '*', '?',
    '~', '!', '#', '[', ']',
];

/// Caller values holding shell syntax that land in a `shell: true` command line.
pub fn shell_problems<'a>(
    vars: &BTreeMap<String, String>,
    tasks: impl IntoIterator<Item = &'a TaskRef>,
) -> Vec<String> {
    let risky: Vec<(&String, &String)> = vars
        .iter()
        .filter(|(k, v)| *k != HOSTS && v.contains(SHELL_SYNTAX))
        .collect();
    if risky.is_empty() {
        return Vec::new();
    }
    let mut found: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for t in tasks.into_iter().filter(|t| t.shell) {
        let line = std::iter::once(t.command.as_str())
            .chain(t.args.iter().map(|a| &**a))
            .collect::<Vec<_>>()
            .join(" ");
        for (k, v) in &risky {
            if line.contains(v.as_str()) {
                found
                    .entry(k.as_str())
                    .or_default()
                    .insert(t.class.as_str());
            }
        }
    }
    found
        .into_iter()
        .map(|(k, classes)| {
            format!(
                "variable {k}: its value holds shell syntax and lands in the shell command line of {} (a caller's value may not)",
                classes.into_iter().collect::<Vec<_>>().join(", ")
            )
        })
        .collect()
}

/// What of a task comes from its class and the site, never from a caller.
fn fixed_part(t: &TaskRef) -> (&str, bool, &str, Option<&str>, &str) {
    (
        t.command.as_str(),
        t.shell,
        t.template.as_str(),
        t.user.as_deref(),
        t.node.as_str(),
    )
}

/// Tasks whose command, shell, TaskTemplate, user or node differ between a render with the
/// caller's public variables (`with`) and one without them (`without`), by task path.
pub fn command_changes<'a, 'b>(
    with: impl IntoIterator<Item = &'a TaskRef>,
    without: impl IntoIterator<Item = &'b TaskRef>,
    public_given: &[&str],
) -> Vec<String> {
    let base: BTreeMap<&str, &TaskRef> =
        without.into_iter().map(|t| (t.path.as_str(), t)).collect();
    let mut classes = BTreeSet::new();
    for t in with {
        if let Some(b) = base.get(t.path.as_str())
            && fixed_part(b) != fixed_part(t)
        {
            classes.insert(t.class.clone());
        }
    }
    if classes.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "variables {} change the command, TaskTemplate, user or node of task class(es) {}: those come from the task class and the site, never from a caller",
        public_given.join(", "),
        classes.into_iter().collect::<Vec<_>>().join(", ")
    )]
}

/// Hosts the environment's tasks land on that no Node carries the host label for.
pub fn unlabelled_hosts<'a>(
    tasks: impl IntoIterator<Item = &'a TaskRef>,
    labelled: &BTreeSet<String>,
) -> Vec<String> {
    let hosts: BTreeSet<&str> = tasks.into_iter().map(|t| t.node.as_str()).collect();
    hosts
        .into_iter()
        .filter(|h| !labelled.contains(*h))
        .map(|h| {
            format!(
                "host {h:?}: no Node carries the label envbridge.dev/host={h} (tasks run only on nodes an administrator labelled)"
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::workflow::model::VarMeta;

    fn decl(name: &str, public: bool, fields: serde_json::Value) -> Declared {
        Declared {
            name: Arc::from(name),
            default: None,
            meta: VarMeta {
                public,
                fields: serde_json::from_value(fields).unwrap(),
            },
        }
    }

    fn vars(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_hosts_public_and_allowed_variables_pass() {
        let declared = [
            decl(
                "severity",
                true,
                serde_json::json!({"values": ["info", "debug"], "widget": "comboBox"}),
            ),
            decl("hidden", false, serde_json::json!({})),
        ];
        let mut policy = CallerPolicy::new();
        policy.allowed.insert("port_base".into());
        let ok = vars(&[
            ("hosts", r#"["flp001"]"#),
            ("severity", "info"),
            ("port_base", "4000"),
        ]);
        assert!(check(&policy, "w", &declared, &ok).is_empty());
        let bad = vars(&[
            ("readout_exe", "/bin/sh"),
            ("hidden", "x"),
            ("severity", "trace"),
        ]);
        let p = check(&policy, "w", &declared, &bad);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p.iter()
                .any(|m| m.starts_with("variable readout_exe may not be set"))
        );
        assert!(
            p.iter()
                .any(|m| m.starts_with("variable hidden may not be set"))
        );
        assert!(
            p.iter()
                .any(|m| m.contains("\"trace\" is not one of info, debug"))
        );
    }

    #[test]
    fn hosts_must_be_a_bounded_list_of_host_names() {
        let mut policy = CallerPolicy::new();
        policy.max_hosts = 2;
        let p = check(&policy, "w", &[], &vars(&[("hosts", r#"["a","b","c"]"#)]));
        assert!(p[0].contains("at most 2"), "{p:?}");
        assert!(check(&policy, "w", &[], &vars(&[("hosts", "flp001,flp002")])).is_empty());
        assert!(!check(&policy, "w", &[], &vars(&[("hosts", "{{ [1].map(#) }}")])).is_empty());
        assert!(!check(&policy, "w", &[], &vars(&[("hosts", r#"["a;rm -rf /"]"#)])).is_empty());
    }

    #[test]
    fn declared_types_and_lists_are_checked() {
        let n = decl("n", true, serde_json::json!({"type": "number"}));
        assert!(value_fits(&n, "12").is_ok());
        assert!(value_fits(&n, "twelve").is_err());
        let b = decl("b", true, serde_json::json!({"type": "bool"}));
        assert!(value_fits(&b, "true").is_ok());
        assert!(value_fits(&b, "yes").is_err());
        let d = decl(
            "d",
            true,
            serde_json::json!({"values": ["TPC", "ITS"], "widget": "detectorSelector"}),
        );
        assert!(value_fits(&d, r#"["TPC","ITS"]"#).is_ok());
        assert!(value_fits(&d, r#"["TPC","XXX"]"#).is_err());
    }

    fn task(path: &str, cmd: &str, shell: bool, args: &[&str]) -> TaskRef {
        TaskRef {
            path: path.into(),
            class: "c".into(),
            command: cmd.into(),
            shell,
            args: args.iter().map(|a| Arc::from(*a)).collect(),
            node: "flp001".into(),
            template: "t".into(),
            ..Default::default()
        }
    }

    #[test]
    fn shell_syntax_reaching_a_shell_command_is_refused() {
        let t = [task(
            "p",
            "/bin/x",
            true,
            &["--severity=info; touch /tmp/pwn"],
        )];
        let v = vars(&[("severity", "info; touch /tmp/pwn")]);
        assert_eq!(shell_problems(&v, &t).len(), 1);
        // Not a shell command line: the value is one argument, no shell reads it.
        let t = [task(
            "p",
            "/bin/x",
            false,
            &["--severity=info; touch /tmp/pwn"],
        )];
        assert!(shell_problems(&v, &t).is_empty());
        // Plain words are fine anywhere.
        let t = [task("p", "/bin/x", true, &["--severity=info"])];
        assert!(shell_problems(&vars(&[("severity", "info")]), &t).is_empty());
    }

    #[test]
    fn a_caller_never_changes_a_command_or_template() {
        let with = [task("p", "/bin/sh -c evil", true, &[])];
        let without = [task("p", "/opt/o2/bin/readout", false, &[])];
        assert_eq!(command_changes(&with, &without, &["readout_exe"]).len(), 1);
        assert!(command_changes(&without, &without, &["x"]).is_empty());
    }

    #[test]
    fn hosts_without_a_labelled_node_are_named() {
        let t = [task("p", "/bin/x", false, &[])];
        let labelled: BTreeSet<String> = ["flp002".to_string()].into();
        assert_eq!(unlabelled_hosts(&t, &labelled).len(), 1);
        let labelled: BTreeSet<String> = ["flp001".to_string()].into();
        assert!(unlabelled_hosts(&t, &labelled).is_empty());
    }
}

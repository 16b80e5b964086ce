//! From located YAML to the input model: shape checks, unknown fields, `!public` values.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::error::{Error, Loc, Result};
use super::model::{
    CallSpec, Channel, Command, Constraint, FastMap, ForSpec, Role, RoleKind, TaskClass, TaskSpec,
    VarBlock, VarMeta, Workflow,
};
use super::template::{Template, is_identifier};
use super::yaml::{self, Kind, Node};

/// Largest input file read (bytes).
const MAX_FILE: u64 = 16 * 1024 * 1024;

const CLASS_FIELDS: &[&str] = &[
    "name",
    "description",
    "defaults",
    "vars",
    "control",
    "wants",
    "limits",
    "bind",
    "connect",
    "properties",
    "constraints",
    "command",
];
const COMMAND_FIELDS: &[&str] = &[
    "env",
    "shell",
    "value",
    "user",
    "arguments",
    "stdout",
    "stderr",
    "log",
];
const ROLE_FIELDS: &[&str] = &[
    "name",
    "description",
    "enabled",
    "for",
    "defaults",
    "vars",
    "constraints",
    "bind",
    "connect",
    "task",
    "roles",
    "include",
    "call",
];
const TASK_FIELDS: &[&str] = &["load", "critical", "timeout", "trigger", "await"];
const CALL_FIELDS: &[&str] = &["func", "critical", "timeout", "trigger", "await"];
const CHANNEL_FIELDS: &[&str] = &[
    "name",
    "type",
    "transport",
    "addressing",
    "sndBufSize",
    "rcvBufSize",
    "rateLogging",
    "target",
    "global",
];

/// Reads and parses a YAML file; the path as given is what error messages name.
pub fn read_yaml(path: &Path) -> Result<Node> {
    let file: Arc<str> = Arc::from(path.display().to_string());
    let start = Loc::file_start(&file);
    let meta =
        std::fs::metadata(path).map_err(|e| Error::new(&start, format!("cannot read: {e}")))?;
    if meta.len() > MAX_FILE {
        return Err(Error::new(
            &start,
            format!("file larger than {MAX_FILE} bytes"),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| Error::new(&start, format!("cannot read: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let upto = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = upto.iter().filter(|b| **b == b'\n').count() + 1;
        let col = upto.iter().rev().take_while(|b| **b != b'\n').count() + 1;
        Error::new(&Loc::new(&file, line, col), "not UTF-8 text")
    })?;
    yaml::parse(&file, &text)
}

/// Loads a task class; `id` is its file name without `.yaml`.
pub fn load_class(path: &Path, id: &str) -> Result<TaskClass> {
    let node = read_yaml(path)?;
    class_from_node(&node, id)
}

pub fn class_from_node(node: &Node, id: &str) -> Result<TaskClass> {
    let f = fields(node, "a task class", CLASS_FIELDS)?;
    let mode = match f.get("control") {
        Some(c) => {
            let cf = fields(c, "`control`", &["mode"])?;
            opt_tmpl(cf.get("mode"))?
        }
        None => None,
    };
    let mode = mode.unwrap_or_else(|| Template::literal(&node.loc, "direct"));
    let command = match f.get("command") {
        Some(c) => command(c)?,
        None => Command::default(),
    };
    Ok(TaskClass {
        id: Arc::from(id),
        file: node.loc.file.clone(),
        name: opt_tmpl(f.get("name"))?,
        defaults: var_block(f.get("defaults"))?,
        vars: var_block(f.get("vars"))?,
        mode,
        command,
        bind: channels(f.get("bind"))?,
        connect: channels(f.get("connect"))?,
        constraints: constraints(f.get("constraints"))?,
        properties: properties(f.get("properties"))?,
    })
}

/// A class's `properties`: a mapping of names to values, kept in order.
fn properties(node: Option<&&Node>) -> Result<Vec<(Arc<str>, Template)>> {
    let Some(node) = node else {
        return Ok(Vec::new());
    };
    match &node.kind {
        Kind::Null => Ok(Vec::new()),
        Kind::Map(m) => m
            .iter()
            .map(|(k, v)| match k.as_str() {
                Some(name) if !name.is_empty() => Ok((Arc::from(name), Template::from_node(v)?)),
                _ => Err(Error::new(&k.loc, "property names must be strings")),
            })
            .collect(),
        _ => Err(Error::new(
            &node.loc,
            format!("`properties` must be a mapping, found {}", node.kind_name()),
        )),
    }
}

fn command(node: &Node) -> Result<Command> {
    let f = fields(node, "`command`", COMMAND_FIELDS)?;
    Ok(Command {
        env: tmpl_list(f.get("env"))?,
        shell: opt_tmpl(f.get("shell"))?,
        value: opt_tmpl(f.get("value"))?,
        user: opt_tmpl(f.get("user"))?,
        arguments: tmpl_list(f.get("arguments"))?,
    })
}

/// Loads a workflow template: a root role with `name` and `roles` (or another role kind).
pub fn load_workflow(path: &Path) -> Result<Workflow> {
    workflow_from_node(&read_yaml(path)?)
}

/// A workflow template from its parsed YAML.
pub fn workflow_from_node(node: &Node) -> Result<Workflow> {
    if node.as_map().is_none() {
        return Err(Error::new(
            &node.loc,
            format!(
                "not a workflow: expected a mapping with `name` and `roles`, found {}",
                node.kind_name()
            ),
        ));
    }
    let root = role(node, 0)?;
    let public_tag = |n: &Node| n.tag.as_deref() == Some("public");
    let description = node
        .get("description")
        .filter(|d| public_tag(d))
        .and_then(|d| d.as_str())
        .map(str::to_string);
    Ok(Workflow {
        file: node.loc.file.clone(),
        root,
        public: node.get("name").is_some_and(public_tag),
        description,
    })
}

/// Loads a site profile: a mapping of variable names to values (like `defaults`).
pub fn load_defaults(path: &Path) -> Result<VarBlock> {
    let node = read_yaml(path)?;
    if node.as_map().is_none() {
        return Err(Error::new(
            &node.loc,
            format!(
                "not a site profile: expected a mapping of variables, found {}",
                node.kind_name()
            ),
        ));
    }
    var_block(Some(&&node))
}

fn role(node: &Node, depth: usize) -> Result<Role> {
    if depth > 64 {
        return Err(Error::new(&node.loc, "roles nested too deeply"));
    }
    let f = fields(node, "a role", ROLE_FIELDS)?;
    let name = match f.get("name") {
        Some(n) => Template::from_node(n)?,
        None => return Err(Error::new(&node.loc, "role without a `name`")),
    };
    let kinds: Vec<&str> = ["task", "roles", "include", "call"]
        .into_iter()
        .filter(|k| f.contains_key(k))
        .collect();
    let kind = match kinds.as_slice() {
        ["task"] => {
            let t = f["task"];
            let tf = fields(t, "`task`", TASK_FIELDS)?;
            let load = match tf.get("load") {
                Some(l) => Template::from_node(l)?,
                None => return Err(Error::new(&t.loc, "`task` without `load`")),
            };
            RoleKind::Task(Arc::new(TaskSpec {
                load,
                critical: opt_tmpl(tf.get("critical"))?,
                timeout: opt_tmpl(tf.get("timeout"))?,
                trigger: opt_tmpl(tf.get("trigger"))?,
                r#await: opt_tmpl(tf.get("await"))?,
            }))
        }
        ["call"] => {
            let c = f["call"];
            let cf = fields(c, "`call`", CALL_FIELDS)?;
            let func = match cf.get("func") {
                Some(l) => Template::from_node(l)?,
                None => return Err(Error::new(&c.loc, "`call` without `func`")),
            };
            RoleKind::Call(CallSpec {
                func,
                critical: opt_tmpl(cf.get("critical"))?,
                timeout: opt_tmpl(cf.get("timeout"))?,
                trigger: opt_tmpl(cf.get("trigger"))?,
                r#await: opt_tmpl(cf.get("await"))?,
            })
        }
        ["include"] => RoleKind::Include(Template::from_node(f["include"])?),
        ["roles"] => {
            let list = f["roles"];
            let Kind::Seq(items) = &list.kind else {
                return Err(Error::new(
                    &list.loc,
                    format!("`roles` must be a list, found {}", list.kind_name()),
                ));
            };
            RoleKind::Aggregator(
                items
                    .iter()
                    .map(|r| role(r, depth + 1))
                    .collect::<Result<_>>()?,
            )
        }
        [] => {
            return Err(Error::new(
                &node.loc,
                "role without `task`, `roles`, `include` or `call`",
            ));
        }
        several => {
            return Err(Error::new(
                &node.loc,
                format!("role has several kinds at once: {}", several.join(", ")),
            ));
        }
    };
    let r#for = match f.get("for") {
        None => None,
        Some(n) => {
            let ff = fields(n, "`for`", &["range", "var"])?;
            let range = match ff.get("range") {
                Some(r) => Template::from_node(r)?,
                None => return Err(Error::new(&n.loc, "`for` without `range`")),
            };
            let var = match ff.get("var").and_then(|v| v.as_str().map(|s| (v, s))) {
                Some((_, s)) if is_identifier(s) => Arc::from(s),
                Some((v, s)) => {
                    return Err(Error::new(&v.loc, format!("`{s}` is not a variable name")));
                }
                None => return Err(Error::new(&n.loc, "`for` without `var`")),
            };
            Some(ForSpec { range, var })
        }
    };
    Ok(Role {
        loc: node.loc.clone(),
        name,
        enabled: opt_tmpl(f.get("enabled"))?,
        r#for,
        defaults: var_block(f.get("defaults"))?,
        vars: var_block(f.get("vars"))?,
        constraints: constraints(f.get("constraints"))?,
        bind: channels(f.get("bind"))?.into(),
        connect: channels(f.get("connect"))?.into(),
        kind,
    })
}

/// The fields of a mapping, refusing unknown and repeated keys (a typo is likely).
fn fields<'a>(node: &'a Node, what: &str, allowed: &[&str]) -> Result<HashMap<&'a str, &'a Node>> {
    let Some(map) = node.as_map() else {
        return Err(Error::new(
            &node.loc,
            format!("expected {what} (a mapping), found {}", node.kind_name()),
        ));
    };
    let mut out = HashMap::new();
    for (k, v) in map {
        let Some(key) = k.as_str() else {
            return Err(Error::new(
                &k.loc,
                format!("keys of {what} must be strings"),
            ));
        };
        if !allowed.contains(&key) {
            return Err(Error::new(
                &k.loc,
                format!(
                    "unknown field `{key}` in {what} (expected one of: {})",
                    allowed.join(", ")
                ),
            ));
        }
        if out.insert(key, v).is_some() {
            return Err(Error::new(&k.loc, format!("field `{key}` given twice")));
        }
    }
    Ok(out)
}

fn opt_tmpl(node: Option<&&Node>) -> Result<Option<Template>> {
    node.map(|n| Template::from_node(n)).transpose()
}

/// The items of an optional list field (none when absent or null); `what` names the
/// expected list in the error (`a list of channels`).
fn items<'a>(node: Option<&&'a Node>, what: &str) -> Result<&'a [Node]> {
    let Some(node) = node else {
        return Ok(&[]);
    };
    match &node.kind {
        Kind::Null => Ok(&[]),
        Kind::Seq(items) => Ok(items),
        _ => Err(Error::new(
            &node.loc,
            format!("expected {what}, found {}", node.kind_name()),
        )),
    }
}

fn tmpl_list(node: Option<&&Node>) -> Result<Vec<Template>> {
    items(node, "a list")?
        .iter()
        .map(Template::from_node)
        .collect()
}

/// `defaults:` / `vars:` / a site profile. A value may be a mapping with `value:` (the anchor's
/// `!public` form, tagged or not); a list is kept as its JSON text.
pub fn var_block(node: Option<&&Node>) -> Result<VarBlock> {
    let mut block = HashMap::new();
    let mut meta = FastMap::default();
    let Some(node) = node else {
        return Ok(VarBlock::default());
    };
    let map = match &node.kind {
        Kind::Null => return Ok(VarBlock::default()),
        Kind::Map(m) => m,
        _ => {
            return Err(Error::new(
                &node.loc,
                format!(
                    "expected a mapping of variables, found {}",
                    node.kind_name()
                ),
            ));
        }
    };
    for (k, v) in map {
        let Some(name) = k.as_str() else {
            return Err(Error::new(&k.loc, "variable names must be strings"));
        };
        if !is_var_name(name) {
            return Err(Error::new(
                &k.loc,
                format!("`{name}` is not a variable name"),
            ));
        }
        let value = var_value(v)?;
        if let Some(m) = var_meta(v) {
            meta.insert(Arc::from(name), m);
        }
        block.insert(Arc::from(name), value);
    }
    let mut out = VarBlock::from_map(block);
    out.meta = Arc::new(meta);
    Ok(out)
}

fn is_var_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// A variable's declaration besides its value: `!public` and the other fields of a mapping.
fn var_meta(v: &Node) -> Option<VarMeta> {
    let public = v.tag.as_deref() == Some("public");
    let mut fields = std::collections::BTreeMap::new();
    if let Kind::Map(m) = &v.kind {
        for (k, f) in m {
            if let Some(key) = k.as_str()
                && key != "value"
            {
                fields.insert(key.to_string(), to_json(f));
            }
        }
    }
    (public || !fields.is_empty()).then_some(VarMeta { public, fields })
}

/// A YAML node as JSON (scalars as strings, as the anchor reads them).
fn to_json(n: &Node) -> serde_json::Value {
    match &n.kind {
        Kind::Null => serde_json::Value::Null,
        Kind::Scalar { value, .. } => serde_json::Value::String(value.clone()),
        Kind::Seq(items) => serde_json::Value::Array(items.iter().map(to_json).collect()),
        Kind::Map(m) => serde_json::Value::Object(
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_string(), to_json(v))))
                .collect(),
        ),
    }
}

fn var_value(v: &Node) -> Result<Template> {
    match &v.kind {
        Kind::Null | Kind::Scalar { .. } => Template::from_node(v),
        Kind::Map(_) => match v.get("value") {
            Some(inner) => var_value(inner),
            None => Err(Error::new(
                &v.loc,
                "a variable given as a mapping needs a `value:` field",
            )),
        },
        Kind::Seq(items) => {
            let mut out = Vec::new();
            for i in items {
                match i.as_str() {
                    Some(s) => out.push(serde_json::Value::String(s.to_string())),
                    None => {
                        return Err(Error::new(&i.loc, "a list variable may hold only strings"));
                    }
                }
            }
            let text = serde_json::Value::Array(out).to_string();
            Ok(Template::literal(&v.loc, &text))
        }
    }
}

fn channels(node: Option<&&Node>) -> Result<Vec<Channel>> {
    items(node, "a list of channels")?
        .iter()
        .map(|c| {
            let f = fields(c, "a channel", CHANNEL_FIELDS)?;
            let name = match f.get("name") {
                Some(n) => Template::from_node(n)?,
                None => return Err(Error::new(&c.loc, "channel without a `name`")),
            };
            Ok(Channel {
                loc: c.loc.clone(),
                name,
                r#type: opt_tmpl(f.get("type"))?,
                transport: opt_tmpl(f.get("transport"))?,
                addressing: opt_tmpl(f.get("addressing"))?,
                snd_buf_size: opt_tmpl(f.get("sndBufSize"))?,
                rcv_buf_size: opt_tmpl(f.get("rcvBufSize"))?,
                rate_logging: opt_tmpl(f.get("rateLogging"))?,
                target: opt_tmpl(f.get("target"))?,
                global: opt_tmpl(f.get("global"))?,
            })
        })
        .collect()
}

fn constraints(node: Option<&&Node>) -> Result<Vec<Constraint>> {
    items(node, "a list of constraints")?
        .iter()
        .map(|c| {
            let f = fields(c, "a constraint", &["attribute", "value"])?;
            match (f.get("attribute"), f.get("value")) {
                (Some(a), Some(v)) => Ok(Constraint {
                    attribute: Template::from_node(a)?,
                    value: Template::from_node(v)?,
                }),
                _ => Err(Error::new(
                    &c.loc,
                    "a constraint needs `attribute` and `value`",
                )),
            }
        })
        .collect()
}

//! Evaluates one task instance's fields: node, control mode, command, env, args, channels.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::reuse::{Own, Reuse, own_names};
use super::{ControlMode, EnvVar, names};
use crate::workflow::duration::parse_duration;
use crate::workflow::error::{Error, Loc, Result};
use crate::workflow::expand::{Expanded, Frame, TaskInstance};
use crate::workflow::expr::{Engine, is_falsy};
use crate::workflow::model::{Channel, Constraint};
use crate::workflow::scope::Scope;
use crate::workflow::template::Template;

/// A channel with its fields evaluated (shared strings: most are a class's values).
#[derive(Clone, Debug)]
pub struct EvalChannel {
    pub loc: Loc,
    pub name: Arc<str>,
    pub r#type: Arc<str>,
    pub transport: Option<Arc<str>>,
    pub tcp: bool,
    pub snd_buf_size: Option<Arc<str>>,
    pub rcv_buf_size: Option<Arc<str>>,
    pub rate_logging: Option<Arc<str>>,
    pub target: Option<(Arc<str>, Loc)>,
    pub global: Option<Arc<str>>,
}

/// A task with every field evaluated, before ports and endpoints are assigned.
#[derive(Clone, Debug)]
pub struct ResolvedTask {
    /// Task object name and task id ([`names::task_name`], [`names::task_id`]).
    pub name: String,
    pub id: String,
    pub path: String,
    pub loc: Loc,
    pub class: String,
    pub node: String,
    /// The `task_template` variable, if defined.
    pub template_var: Option<String>,
    /// The class's `name:` (else its file name): the template when nothing else names one.
    pub class_template: String,
    pub mode: ControlMode,
    pub critical: bool,
    pub command: String,
    pub shell: bool,
    pub user: Option<String>,
    pub env: Vec<EnvVar>,
    pub args: Vec<Arc<str>>,
    /// CONFIGURE-time properties besides channels.
    pub properties: BTreeMap<String, String>,
    pub bind: Vec<Arc<EvalChannel>>,
    pub connect: Vec<Arc<EvalChannel>>,
    pub trigger: Option<String>,
    pub r#await: Option<String>,
    pub timeout_seconds: Option<u32>,
}

/// How the anchor's control modes map onto ours (docs/workflow-language.md).
pub fn control_mode(mode: &str) -> Option<ControlMode> {
    Some(match mode {
        "direct" | "kubernetes_direct" | "kubectl_direct" => ControlMode::Direct,
        "fairmq" | "kubernetes_fairmq" | "kubectl_fairmq" => ControlMode::Fairmq,
        "basic" => ControlMode::Basic,
        "hook" => ControlMode::Hook,
        _ => return None,
    })
}

/// One task's evaluation: its own scope, and the values its class shares ([`Reuse`]).
struct TaskEval<'a, 'x, 'e> {
    scope: Scope<'e>,
    reuse: &'a Reuse<'x, 'e>,
    t: &'a TaskInstance,
    /// Names the task's own role layers define.
    own: Own<'a>,
}

impl TaskEval<'_, '_, '_> {
    /// A template written at `at`: the class's shared value when there is one.
    fn eval(&self, tmpl: &Template, at: &Arc<str>) -> Result<String> {
        if tmpl.as_literal().is_none()
            && let Some(v) = self.reuse.get(self.t, &self.own, tmpl, at)
        {
            return Ok(String::from(&*v));
        }
        self.scope.eval(tmpl, at)
    }

    /// [`TaskEval::eval`] as a shared string: the class's value itself, not a copy of it.
    fn eval_arc(&self, tmpl: &Template, at: &Arc<str>) -> Result<Arc<str>> {
        if let Some(lit) = tmpl.as_shared_literal() {
            return Ok(lit.clone());
        }
        if let Some(v) = self.reuse.get(self.t, &self.own, tmpl, at) {
            return Ok(v);
        }
        self.scope.eval_arc(tmpl, at)
    }
}

/// Evaluates every field of task `t`; `reuse` is shared by all tasks of one render.
pub fn resolve<'x, 'e>(
    engine: &'e Engine,
    x: &'x Expanded,
    reuse: &Reuse<'x, 'e>,
    t: &TaskInstance,
) -> Result<ResolvedTask> {
    let frames = t.chain.frames();
    let mut ev = TaskEval {
        scope: x.task_scope(engine, t, &frames),
        reuse,
        t,
        own: own_names(&frames),
    };
    let in_task = |e: Error| e.context(format_args!("in task `{}`", t.path));
    let node = node_of(&ev, t, &frames).map_err(in_task)?;
    ev.scope.set_hostname(Arc::from(node.as_str()));
    resolve_fields(&ev, t, node, &x.environment_id).map_err(in_task)
}

/// The node: the `machine_id` constraints of the role chain, else those of the class. Two
/// different values at one level are an error.
fn node_of(task: &TaskEval, t: &TaskInstance, frames: &[&Frame]) -> Result<String> {
    let roles = machine_ids(
        task,
        frames
            .iter()
            .flat_map(|f| f.constraints())
            .map(|(c, at)| (c, at)),
    )?;
    let class = machine_ids(task, t.class.constraints.iter().map(|c| (c, &t.path)))?;
    let chosen = if roles.is_empty() { class } else { roles };
    let mut it = chosen.into_iter();
    let Some((first, first_loc)) = it.next() else {
        return Err(Error::new(
            &t.loc,
            format!(
                "task `{}` has no node: neither its roles nor its class `{}` have a `machine_id` constraint",
                t.path, t.class.id
            ),
        ));
    };
    for (v, loc) in it {
        if v != first {
            return Err(Error::new(
                &loc,
                format!(
                    "conflicting `machine_id` constraints: `{v}` here, `{first}` at {first_loc}"
                ),
            ));
        }
    }
    Ok(first)
}

fn machine_ids<'a>(
    task: &TaskEval,
    items: impl Iterator<Item = (&'a Constraint, &'a Arc<str>)>,
) -> Result<Vec<(String, Loc)>> {
    let mut out = Vec::new();
    for (c, at) in items {
        let is_machine_id = match c.attribute.as_literal() {
            Some(lit) => lit == "machine_id",
            None => task.eval(&c.attribute, at)? == "machine_id",
        };
        if !is_machine_id {
            continue;
        }
        let mut v = task.eval(&c.value, at)?;
        if v.trim().is_empty() {
            return Err(Error::new(&c.value.loc, "`machine_id` constraint is empty"));
        }
        if v.trim().len() != v.len() {
            v = v.trim().to_string();
        }
        out.push((v, c.value.loc.clone()));
    }
    Ok(out)
}

fn resolve_fields(
    task: &TaskEval,
    t: &TaskInstance,
    node: String,
    env_id: &str,
) -> Result<ResolvedTask> {
    let class = &t.class;
    let path = &t.path;
    let scope = &task.scope;
    let ev = |tmpl: &Template| task.eval(tmpl, path);
    let opt =
        |tmpl: &Option<Template>| -> Result<Option<String>> { tmpl.as_ref().map(ev).transpose() };

    let mode_text = ev(&class.mode)?;
    let class_mode = control_mode(mode_text.trim()).ok_or_else(|| {
        Error::new(
            &class.mode.loc,
            format!(
                "unknown control mode `{mode_text}` (expected direct, fairmq, basic, hook, kubernetes_direct, \
                 kubernetes_fairmq, kubectl_direct or kubectl_fairmq)"
            ),
        )
    })?;

    let trigger = opt(&t.spec.trigger)?.filter(|s| !s.trim().is_empty());
    // The anchor: a basic task with a trigger is a hook.
    let mode = match class_mode {
        ControlMode::Basic if trigger.is_some() => ControlMode::Hook,
        m => m,
    };
    let mut env = Vec::with_capacity(class.command.env.len() + 3);
    for e in &class.command.env {
        env.push(match task.reuse.env(t, &task.own, e, path) {
            Some(var) => var,
            None => env_entry(&scope.eval(e, path)?, &e.loc)?,
        });
    }
    let mut args = Vec::with_capacity(class.command.arguments.len() + 10);
    for a in &class.command.arguments {
        let v = task.eval_arc(a, path)?;
        if !v.trim().is_empty() {
            args.push(v);
        }
    }
    let template_var = scope.var("task_template")?.map(|v| String::from(&*v));
    let class_template = match &class.name {
        Some(n) => ev(n)?,
        None => String::from(&*class.id),
    };
    let critical = match &t.spec.critical {
        Some(c) => !is_falsy(&ev(c)?),
        None => true,
    };
    let timeout_seconds = match &t.spec.timeout {
        // The anchor's default for a hook: 30 s.
        None if trigger.is_some() => Some(30),
        Some(tm) => {
            let text = ev(tm)?;
            Some(parse_duration(&text).ok_or_else(|| {
                Error::new(
                    &tm.loc,
                    format!("timeout `{text}` is not a duration (e.g. 30s, 2m, 90)"),
                )
            })?)
        }
        None => None,
    };
    let user = opt(&class.command.user)?.filter(|u| !u.trim().is_empty());
    let shell = match &class.command.shell {
        Some(s) => !is_falsy(&ev(s)?),
        None => false,
    };
    let bind = channels(task, &class.bind, path, &t.bind, false)?;
    let connect = channels(task, &class.connect, path, &t.connect, true)?;
    Ok(ResolvedTask {
        // Hashed here, where a large render runs on several threads.
        name: names::task_name(env_id, path, &class.id, &node),
        id: names::task_id(env_id, path),
        path: String::from(&**path),
        loc: t.loc.clone(),
        class: String::from(&*class.id),
        node,
        template_var,
        class_template,
        mode,
        critical,
        command: opt(&class.command.value)?
            .unwrap_or_default()
            .trim()
            .to_string(),
        shell,
        user,
        env,
        args,
        properties: properties(task, t, mode, env_id)?,
        bind,
        connect,
        // The anchor: a hook is awaited at its trigger unless it says otherwise.
        r#await: opt(&t.spec.r#await)?
            .filter(|s| !s.is_empty())
            .or_else(|| trigger.clone()),
        trigger,
        timeout_seconds,
    })
}

/// What the anchor sends at CONFIGURE besides channels: `environment_id`, the class's
/// `properties`, and `orbit-reset-time` where `pdp_override_run_start_time` is defined.
/// Tasks without a control protocol get none.
fn properties(
    task: &TaskEval,
    t: &TaskInstance,
    mode: ControlMode,
    env_id: &str,
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if !mode.has_protocol() {
        return Ok(out);
    }
    out.insert("environment_id".to_string(), env_id.to_string());
    for (k, v) in &t.class.properties {
        out.insert(k.to_string(), task.eval(v, &t.path)?);
    }
    if let Some(v) = task.scope.var("pdp_override_run_start_time")? {
        out.insert("orbit-reset-time".to_string(), v.to_string());
    }
    Ok(out)
}

/// Class channels, then the role's: a role channel replaces a class channel of the same name.
/// A channel whose every field its class shares ([`Reuse::channel`]) is evaluated once.
fn channels(
    task: &TaskEval,
    class: &[Channel],
    path: &Arc<str>,
    role: &[Channel],
    outbound: bool,
) -> Result<Vec<Arc<EvalChannel>>> {
    let mut out: BTreeMap<Arc<str>, Arc<EvalChannel>> = BTreeMap::new();
    // The role's channels are written at the task role itself, like the class's.
    for c in class.iter().chain(role) {
        let ch = match task.reuse.channel(task.t, &task.own, c, path, outbound) {
            Some(ch) => ch,
            None => Arc::new(eval_channel(&|t| task.eval_arc(t, path), c, outbound)?),
        };
        out.insert(ch.name.clone(), ch);
    }
    Ok(out.into_values().collect())
}

/// One `command.env` entry, `NAME=VALUE`, evaluated to `text` from the template at `loc`.
pub fn env_entry(text: &str, loc: &Loc) -> Result<EnvVar> {
    let Some((name, value)) = text.split_once('=') else {
        return Err(Error::new(
            loc,
            format!("env entry `{text}` is not NAME=VALUE"),
        ));
    };
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(Error::new(
            loc,
            format!("`{name}` is not an environment variable name"),
        ));
    }
    Ok(EnvVar {
        name: Arc::from(name),
        value: Arc::from(value),
    })
}

/// One channel's fields, evaluated by `ev`.
pub fn eval_channel(
    ev: &dyn Fn(&Template) -> Result<Arc<str>>,
    c: &Channel,
    outbound: bool,
) -> Result<EvalChannel> {
    let opt = |t: &Option<Template>| -> Result<Option<Arc<str>>> {
        Ok(t.as_ref()
            .map(ev)
            .transpose()?
            .filter(|s| !s.trim().is_empty()))
    };
    let name = ev(&c.name)?;
    if name.is_empty()
        || !name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_'))
    {
        return Err(Error::new(
            &c.name.loc,
            format!("channel name `{name}` may hold only letters, digits, - and _"),
        ));
    }
    let r#type = match opt(&c.r#type)? {
        Some(t) => t,
        None => {
            return Err(Error::new(
                &c.loc,
                format!("channel `{name}` has no `type`"),
            ));
        }
    };
    if !matches!(
        &*r#type,
        "push" | "pull" | "pub" | "sub" | "req" | "rep" | "pair"
    ) {
        return Err(Error::new(
            &c.loc,
            format!("channel `{name}` has unknown type `{type}`", type = r#type),
        ));
    }
    let addressing = opt(&c.addressing)?;
    let tcp = match addressing.as_deref().unwrap_or("tcp") {
        "tcp" => true,
        "ipc" => false,
        other => {
            return Err(Error::new(
                &c.loc,
                format!("channel `{name}`: unknown addressing `{other}` (tcp or ipc)"),
            ));
        }
    };
    let target = match &c.target {
        Some(t) if outbound => Some((ev(t)?, t.loc.clone())),
        Some(t) => {
            return Err(Error::new(
                &t.loc,
                "`target` belongs on an outbound (`connect`) channel",
            ));
        }
        None if outbound => {
            return Err(Error::new(
                &c.loc,
                format!("outbound channel `{name}` has no `target`"),
            ));
        }
        None => None,
    };
    let global = opt(&c.global)?;
    if outbound && global.is_some() {
        return Err(Error::new(
            &c.loc,
            "`global` belongs on an inbound (`bind`) channel",
        ));
    }
    Ok(EvalChannel {
        loc: c.loc.clone(),
        name,
        r#type,
        transport: opt(&c.transport)?,
        tcp,
        snd_buf_size: opt(&c.snd_buf_size)?,
        rcv_buf_size: opt(&c.rcv_buf_size)?,
        rate_logging: opt(&c.rate_logging)?,
        target,
        global,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Some(10));
        assert_eq!(parse_duration("1m30s"), Some(90));
        assert_eq!(parse_duration("45"), Some(45));
        assert_eq!(parse_duration("abc"), None);
        assert_eq!(parse_duration("10x"), None);
    }

    #[test]
    fn every_mode_maps() {
        for (m, want) in [
            ("direct", ControlMode::Direct),
            ("kubernetes_direct", ControlMode::Direct),
            ("kubectl_direct", ControlMode::Direct),
            ("fairmq", ControlMode::Fairmq),
            ("kubernetes_fairmq", ControlMode::Fairmq),
            ("kubectl_fairmq", ControlMode::Fairmq),
            ("basic", ControlMode::Basic),
            ("hook", ControlMode::Hook),
        ] {
            assert_eq!(control_mode(m), Some(want), "{m}");
        }
        assert_eq!(control_mode("mesos"), None);
    }
}

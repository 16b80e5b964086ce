//! Role-tree expansion: iterators, `enabled`, includes, call roles, sibling names.
//!
//! The result is a flat list of task instances (each with the cascade layers of its role
//! chain) and hooks; evaluating a task's own fields is `crate::plan`'s job.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Sources;
use super::error::{Error, Loc, Result};
use super::expr::{Engine, is_falsy};
use super::load;
use super::model::{Channel, Constraint, FastMap, Role, RoleKind, TaskClass, TaskSpec, VarBlock};
use super::scope::{Builtins, Layer, LayerRef, Scope};
use super::template::Template;

/// Most task and call roles one workflow may expand to.
const MAX_INSTANCES: usize = 200_000;
/// Deepest include chain.
const MAX_INCLUDES: usize = 32;

/// What one role adds to the cascade of everything below it. Shared by all its descendants
/// (a task holds its chain of frames, not copies of them).
#[derive(Debug, Default)]
pub struct Frame {
    parent: Option<Arc<Frame>>,
    /// The role's `defaults` (when not empty).
    defaults: Vec<Layer>,
    /// The role's `vars`, then its iterator variable (when not empty).
    vars: Vec<Layer>,
    /// The role's constraints with the path they were written at.
    constraints: Vec<(Constraint, Arc<str>)>,
}

/// What a role adds to a chain.
struct RoleVars<'r> {
    defaults: &'r VarBlock,
    vars: &'r VarBlock,
    constraints: &'r [Constraint],
}

impl<'r> RoleVars<'r> {
    fn of(role: &'r Role) -> Self {
        RoleVars {
            defaults: &role.defaults,
            vars: &role.vars,
            constraints: &role.constraints,
        }
    }
}

/// A chain of role frames, the innermost last.
#[derive(Clone, Debug, Default)]
pub struct Chain(Option<Arc<Frame>>);

impl Chain {
    /// This chain with one more role: its `defaults`, `vars`, iterator variable and
    /// constraints, written at `at`.
    fn with(&self, role: RoleVars, iter: Option<&Layer>, at: &Arc<str>) -> Chain {
        let RoleVars {
            defaults,
            vars,
            constraints,
        } = role;
        let mut f = Frame {
            parent: self.0.clone(),
            constraints: constraints
                .iter()
                .map(|c| (c.clone(), at.clone()))
                .collect(),
            ..Frame::default()
        };
        if !defaults.is_empty() {
            f.defaults.push(Layer::new(defaults, Some(at)));
        }
        if !vars.is_empty() {
            f.vars.push(Layer::new(vars, Some(at)));
        }
        f.vars.extend(iter.cloned());
        Chain(Some(Arc::new(f)))
    }

    /// The frames, root first.
    pub fn frames(&self) -> Vec<&Frame> {
        let mut out = Vec::with_capacity(8);
        let mut at = self.0.as_deref();
        while let Some(f) = at {
            out.push(f);
            at = f.parent.as_deref();
        }
        out.reverse();
        out
    }
}

impl Frame {
    pub fn defaults(&self) -> &[Layer] {
        &self.defaults
    }

    pub fn vars(&self) -> &[Layer] {
        &self.vars
    }

    pub fn constraints(&self) -> &[(Constraint, Arc<str>)] {
        &self.constraints
    }
}

/// One task role, expanded: everything needed to evaluate the task's fields.
#[derive(Clone, Debug)]
pub struct TaskInstance {
    pub path: Arc<str>,
    pub loc: Loc,
    pub class: Arc<TaskClass>,
    pub spec: Arc<TaskSpec>,
    /// The role chain: role `defaults`, `vars`, iterator variables and constraints.
    pub chain: Chain,
    /// The task role's own channels (written at `path`).
    pub bind: Arc<[Channel]>,
    pub connect: Arc<[Channel]>,
}

/// A call role: recorded, not deployed; run by an integration at its trigger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookInstance {
    pub path: String,
    /// As written (`dcs.StartOfRun()`).
    pub func: String,
    /// `dcs`, `StartOfRun`, and the arguments evaluated in the role's scope.
    pub plugin: String,
    pub function: String,
    pub arguments: Vec<String>,
    pub trigger: Option<String>,
    /// Defaults to the trigger.
    pub r#await: Option<String>,
    pub critical: bool,
    pub timeout_seconds: Option<u32>,
    /// The variables the call's role declares (`defaults`, `vars`), evaluated.
    pub variables: std::collections::BTreeMap<String, String>,
}

/// `plugin.Function(args...)`: the plugin, the function and the arguments, each argument
/// evaluated as an expression in `scope` (a string as it is, anything else as Go prints it).
fn call_parts(func: &str, scope: &Scope, loc: &Loc) -> Result<(String, String, Vec<String>)> {
    let f = func.trim();
    let shape = || {
        Error::new(
            loc,
            format!("call `func` `{func}`: expected plugin.Function(arguments)"),
        )
    };
    let open = f.find('(').ok_or_else(shape)?;
    let body = f[open + 1..].strip_suffix(')').ok_or_else(shape)?;
    let (plugin, function) = f[..open].trim().split_once('.').ok_or_else(shape)?;
    let arguments = if body.trim().is_empty() {
        Vec::new()
    } else {
        // Evaluated as one list, so that commas inside strings and calls stay where they are.
        let list = super::template::parse(&format!("{{{{ [{body}] }}}}"), loc, &|_| loc.clone())?;
        let text = scope.eval_here(&list)?;
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Array(items)) => items
                .into_iter()
                .map(|v| match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                })
                .collect(),
            _ => return Err(shape()),
        }
    };
    Ok((plugin.to_string(), function.to_string(), arguments))
}

/// An expanded workflow.
pub struct Expanded {
    /// The root role's name.
    pub name: String,
    pub tasks: Vec<TaskInstance>,
    pub hooks: Vec<HookInstance>,
    /// Site variables: profiles and the configuration store.
    pub site: Site,
    /// `--set` values.
    pub sets: Layer,
    pub environment_id: Arc<str>,
}

impl Expanded {
    /// The evaluation scope of one task: its whole [`cascade`]. `frames` are
    /// `t.chain.frames()`.
    pub fn task_scope<'a>(
        &'a self,
        engine: &'a Engine,
        t: &'a TaskInstance,
        frames: &[&'a Frame],
    ) -> Scope<'a> {
        Scope::new(
            engine,
            cascade(Some(&t.class), &self.site, frames, &self.sets),
            Builtins {
                environment_id: self.environment_id.clone(),
                task_hostname: None,
            },
            t.path.clone(),
        )
    }
}

/// The site's variables, beneath the workflow's: the anchor's global defaults and vars.
#[derive(Clone, Debug, Default)]
pub struct Site {
    /// Site profiles (`--defaults`, in order), then the store's `o2/runtime/aliecs/defaults`.
    pub defaults: Vec<Layer>,
    /// The store's `o2/runtime/aliecs/vars`.
    pub vars: Vec<Layer>,
}

/// The cascade, lowest priority first (docs/workflow-language.md), in the anchor's order:
/// every kind flattened over the whole ancestry, then the kinds layered. Class vars, class
/// defaults, site defaults, role defaults (root first), site vars, role vars (root first, each
/// role's iterator variable right after its vars), `--set`. Without a class (a role's own
/// values) the class layers are left out. Class values are relative to the task itself: the
/// scope's home (`at: None`).
pub fn cascade<'a>(
    class: Option<&'a TaskClass>,
    site: &'a Site,
    frames: &[&'a Frame],
    sets: &'a Layer,
) -> Vec<LayerRef<'a>> {
    let mut layers =
        Vec::with_capacity(4 + site.defaults.len() + site.vars.len() + 2 * frames.len());
    layers.extend(class.map(|c| LayerRef::new(&c.vars, None)));
    layers.extend(class.map(|c| LayerRef::new(&c.defaults, None)));
    layers.extend(site.defaults.iter().map(Layer::borrow));
    layers.extend(
        frames
            .iter()
            .flat_map(|f| f.defaults.iter().map(Layer::borrow)),
    );
    layers.extend(site.vars.iter().map(Layer::borrow));
    layers.extend(frames.iter().flat_map(|f| f.vars.iter().map(Layer::borrow)));
    layers.push(sets.borrow());
    layers
}

#[derive(Clone, Default)]
struct Ctx {
    path: Option<Arc<str>>,
    chain: Chain,
}

struct Instance<'r> {
    role: &'r Role,
    name: String,
    ctx: Ctx,
}

/// Expands `workflow` (a path) with the given sources, `--set` values and environment id.
pub fn expand(
    engine: &Engine,
    sources: &Sources,
    workflow: &Path,
    sets: &[(String, String)],
    environment_id: &str,
) -> Result<Expanded> {
    let wf = load::load_workflow(workflow)?;
    let mut site = Site::default();
    // What the anchor's environment creation adds beneath everything: `detectors`, the
    // inventory's detectors of the environment's hosts (evaluated only where used).
    let env_file: Arc<str> = Arc::from("<environment>");
    let env_loc = Loc::file_start(&env_file);
    let detectors = super::template::parse(
        "{{ inventory.DetectorsForHosts(hosts) }}",
        &env_loc,
        &|_| env_loc.clone(),
    )?;
    site.defaults.push(Layer::new(
        &VarBlock::from_map(HashMap::from([(Arc::from("detectors"), detectors)])),
        None,
    ));
    for f in &sources.defaults_files {
        site.defaults
            .push(Layer::new(&load::load_defaults(f)?, None));
    }
    // The store wins over the profiles where both set a variable.
    let store = engine.store();
    site.defaults.push(Layer::new(store.defaults(), None));
    site.vars.push(Layer::new(store.vars(), None));
    let set_file: Arc<str> = Arc::from("--set");
    let mut set_vars = HashMap::new();
    for (i, (k, v)) in sets.iter().enumerate() {
        let loc = Loc::new(&set_file, 1, i + 1);
        let t = super::template::parse(v, &loc, &|_| loc.clone())?;
        set_vars.insert(Arc::from(k.as_str()), t);
    }
    let workflows_dir = workflows_dir(sources, workflow);
    let mut x = Expander {
        engine,
        tasks_dir: sources.tasks_dir.clone(),
        workflows_dir,
        site,
        sets: Layer::new(&VarBlock::from_map(set_vars), None),
        env_id: Arc::from(environment_id),
        classes: FastMap::default(),
        generated_classes: FastMap::default(),
        includes: vec![workflow.to_path_buf()],
        include_sites: Vec::new(),
        tasks: Vec::new(),
        hooks: Vec::new(),
    };
    let root = x.instances(&wf.root, &Ctx::default())?;
    let mut name = String::new();
    for inst in root {
        name = inst.name.clone();
        x.walk(&inst.role.kind, &inst.ctx, inst.role)?;
    }
    Ok(Expanded {
        name,
        tasks: x.tasks,
        hooks: x.hooks,
        site: x.site,
        sets: x.sets,
        environment_id: x.env_id,
    })
}

/// Where a render's includes come from: `--workflows`, else the workflow's own directory.
pub fn workflows_dir(sources: &Sources, workflow: &Path) -> PathBuf {
    sources
        .workflows_dir
        .clone()
        .unwrap_or_else(|| workflow.parent().map(Path::to_path_buf).unwrap_or_default())
}

struct Expander<'e> {
    engine: &'e Engine,
    tasks_dir: PathBuf,
    workflows_dir: PathBuf,
    site: Site,
    sets: Layer,
    env_id: Arc<str>,
    classes: FastMap<String, Arc<TaskClass>>,
    /// Task classes a JIT generator wrote for the workflows included so far.
    generated_classes: FastMap<String, super::jit::Source>,
    includes: Vec<PathBuf>,
    /// How each workflow of `includes` but the first was included, for messages.
    include_sites: Vec<String>,
    tasks: Vec<TaskInstance>,
    hooks: Vec<HookInstance>,
}

impl<'e> Expander<'e> {
    fn scope<'a>(&'a self, ctx: &'a Ctx, home: &Arc<str>) -> Scope<'a> {
        Scope::new(
            self.engine,
            cascade(None, &self.site, &ctx.chain.frames(), &self.sets),
            Builtins {
                environment_id: self.env_id.clone(),
                task_hostname: None,
            },
            home.clone(),
        )
    }

    /// The enabled instances of one role (several for an iterator), named.
    fn instances<'r>(&self, role: &'r Role, parent: &Ctx) -> Result<Vec<Instance<'r>>> {
        let parent_path: Arc<str> = parent.path.clone().unwrap_or_else(|| Arc::from(""));
        // Constraints only matter on the instance itself, not while naming it.
        let with_own = |ctx: &Ctx, at: &Arc<str>, iter: Option<&Layer>| -> Ctx {
            let own = RoleVars {
                constraints: &[],
                ..RoleVars::of(role)
            };
            Ctx {
                path: ctx.path.clone(),
                chain: ctx.chain.with(own, iter, at),
            }
        };
        let items: Vec<Option<Layer>> = match &role.r#for {
            None => vec![None],
            // The anchor's parent keeps an iterator by its template's raw `enabled`: one that
            // is an expression (not literally true or 1) drops every role it generates.
            Some(_)
                if role
                    .enabled
                    .as_ref()
                    .is_some_and(|en| !en.as_literal().is_some_and(is_enabled_text)) =>
            {
                return Ok(Vec::new());
            }
            Some(f) => {
                let ctx = with_own(parent, &parent_path, None);
                let text = self.scope(&ctx, &parent_path).eval_here(&f.range)?;
                let list = parse_range(&text).ok_or_else(|| {
                    Error::new(
                        &f.range.loc,
                        format!(
                            "`for` range must be a JSON list (e.g. [\"flp001\"]), got `{text}`"
                        ),
                    )
                })?;
                list.into_iter()
                    .map(|item| {
                        let mut m = HashMap::new();
                        m.insert(f.var.clone(), Template::literal(&f.range.loc, &item));
                        Some(Layer {
                            block: VarBlock::from_map(m),
                            at: None,
                        })
                    })
                    .collect()
            }
        };
        let mut out = Vec::new();
        for iter in items {
            // A literal name (most roles) needs no scope.
            let name = match role.name.as_literal() {
                Some(lit) => lit.to_string(),
                None => {
                    let tmp = with_own(parent, &parent_path, iter.as_ref());
                    self.scope(&tmp, &parent_path).eval_here(&role.name)?
                }
            };
            check_role_name(&name, &role.name.loc)?;
            let path: Arc<str> = match &parent.path {
                Some(p) => Arc::from([p, ".", name.as_str()].concat()),
                None => Arc::from(name.as_str()),
            };
            let ctx = Ctx {
                path: Some(path.clone()),
                chain: parent.chain.with(RoleVars::of(role), iter.as_ref(), &path),
            };
            if let Some(en) = &role.enabled
                && !self.enabled(en, &ctx, &path)?
            {
                continue;
            }
            out.push(Instance { role, name, ctx });
        }
        Ok(out)
    }

    /// A role's `enabled`, as the anchor reads it: true when it evaluates to `true` or `1`
    /// (trimmed, any case). One whose evaluation fails names a variable or function the
    /// role's scope lacks: the anchor drops such a role silently; envbridge drops it too,
    /// with a warning in its log, except where the failure is a broken expression.
    fn enabled(&self, en: &Template, ctx: &Ctx, path: &Arc<str>) -> Result<bool> {
        match self.scope(ctx, path).eval_here(en) {
            Ok(v) => Ok(is_enabled_text(&v)),
            Err(e) if e.message.contains("unknown variable") => {
                tracing::warn!(role = %path, error = %e, "`enabled` names an undefined variable: role disabled, as the anchor does");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn walk(&mut self, kind: &RoleKind, ctx: &Ctx, role: &Role) -> Result<()> {
        if self.tasks.len() + self.hooks.len() > MAX_INSTANCES {
            return Err(Error::new(
                &role.loc,
                format!("workflow expands to more than {MAX_INSTANCES} tasks"),
            ));
        }
        let path = ctx.path.clone().unwrap_or_else(|| Arc::from(""));
        match kind {
            RoleKind::Aggregator(children) => {
                let mut all: Vec<Instance> = Vec::new();
                let mut seen: FastMap<String, Loc> = FastMap::default();
                for child in children {
                    for inst in self.instances(child, ctx)? {
                        if let Some(first) = seen.get(&inst.name) {
                            return Err(Error::new(
                                &child.loc,
                                format!(
                                    "two sibling roles named `{}` under `{path}` (the other at {first})",
                                    inst.name
                                ),
                            ));
                        }
                        seen.insert(inst.name.clone(), child.loc.clone());
                        all.push(inst);
                    }
                }
                for inst in all {
                    self.walk(&inst.role.kind, &inst.ctx, inst.role)?;
                }
            }
            RoleKind::Task(spec) => {
                let class = match spec.load.as_literal() {
                    Some(lit) => self.class(lit, &spec.load.loc)?,
                    None => {
                        let id = self.scope(ctx, &path).eval_here(&spec.load)?;
                        self.class(&id, &spec.load.loc)?
                    }
                };
                self.tasks.push(TaskInstance {
                    path: path.clone(),
                    loc: role.loc.clone(),
                    class,
                    spec: spec.clone(),
                    chain: ctx.chain.clone(),
                    bind: role.bind.clone(),
                    connect: role.connect.clone(),
                });
            }
            RoleKind::Call(call) => {
                let scope = self.scope(ctx, &path);
                let opt = |t: &Option<Template>| t.as_ref().map(|t| scope.eval_here(t)).transpose();
                let critical = match &call.critical {
                    Some(t) => !is_falsy(&scope.eval_here(t)?),
                    None => true,
                };
                // `func` is an expression without braces, run at the call's trigger.
                let func = scope.eval_here(&call.func)?;
                super::expr::check(&func, super::expr::Dialect::Call)
                    .map_err(|m| Error::new(&call.func.loc, format!("call `func`: {m}")))?;
                let (plugin, function, arguments) = call_parts(&func, &scope, &call.func.loc)?;
                let trigger = opt(&call.trigger)?.filter(|t| !t.trim().is_empty());
                let timeout_seconds = match &call.timeout {
                    Some(t) => {
                        let text = scope.eval_here(t)?;
                        Some(super::duration::parse_duration(&text).ok_or_else(|| {
                            Error::new(
                                &t.loc,
                                format!("timeout `{text}` is not a duration (e.g. 30s, 2m, 90)"),
                            )
                        })?)
                    }
                    // The anchor's default for a triggered call: 30 s.
                    None => trigger.as_ref().map(|_| 30),
                };
                // What the call's role and its parents below the workflow's root declare (where
                // the anchor's workflows keep a plugin's settings), as the integration receives it.
                let mut variables = std::collections::BTreeMap::new();
                let frames = ctx.chain.frames();
                let names = frames
                    .iter()
                    .skip(1)
                    .flat_map(|f| f.defaults().iter().chain(f.vars()))
                    .flat_map(|l| l.block.vars.keys());
                for name in names {
                    if let Ok(Some(v)) = scope.var(name) {
                        variables.insert(name.to_string(), v.to_string());
                    }
                }
                self.hooks.push(HookInstance {
                    path: path.to_string(),
                    func,
                    plugin,
                    function,
                    arguments,
                    r#await: opt(&call.r#await)?
                        .filter(|a| !a.trim().is_empty())
                        .or_else(|| trigger.clone()),
                    trigger,
                    critical,
                    timeout_seconds,
                    variables,
                });
            }
            RoleKind::Include(name) => {
                let scope = self.scope(ctx, &path);
                // Inside an included workflow, an error says how that one was included.
                let inc = scope
                    .eval_here(name)
                    .map_err(|e| match self.include_sites.last() {
                        Some(site) => e.context(format!("role `{path}`, in {site}")),
                        None => e,
                    })?;
                let site = format!(
                    "`{inc}` included at {}{}",
                    name.loc,
                    chosen_by(name, &scope, &inc)
                );
                drop(scope);
                if inc.is_empty() || inc.contains(['/', '\\']) || inc.starts_with('.') {
                    return Err(Error::new(
                        &name.loc,
                        format!("`{inc}` is not a workflow name"),
                    ));
                }
                let generated = self.engine.jit().generated(&inc);
                let file = match &generated {
                    Some(g) => PathBuf::from(&*g.workflow.label),
                    None => self.workflows_dir.join(format!("{inc}.yaml")),
                };
                if self.includes.contains(&file) {
                    let chain: Vec<String> = self
                        .includes
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect();
                    return Err(Error::new(
                        &name.loc,
                        format!(
                            "include cycle: {} -> {}",
                            chain.join(" -> "),
                            file.display()
                        ),
                    ));
                }
                if self.includes.len() >= MAX_INCLUDES {
                    return Err(Error::new(&name.loc, "includes nested too deeply"));
                }
                let wf = match &generated {
                    Some(g) => {
                        for (id, src) in &g.classes {
                            self.generated_classes.insert(id.clone(), src.clone());
                        }
                        load::workflow_from_node(&super::yaml::parse(
                            &g.workflow.label,
                            &g.workflow.text,
                        )?)?
                    }
                    None if !file.is_file() => {
                        // `dpl.GenerateFromUriOrFallbackToTemplate` gives the name itself
                        // when there is no JIT entry of that name.
                        let jit = match name.parts.iter().any(|p| {
                            matches!(p, super::template::Part::Expr { src, .. }
                                if src.contains("GenerateFromUriOrFallbackToTemplate"))
                        }) {
                            true => format!(
                                "; nor is there a JIT entry {}",
                                self.engine.jit().describe_entry(&inc)
                            ),
                            false => String::new(),
                        };
                        return Err(Error::new(
                            &name.loc,
                            format!(
                                "included workflow `{inc}` not found ({}{jit})",
                                file.display()
                            ),
                        ));
                    }
                    None => load::load_workflow(&file)?,
                };
                let sub = Ctx {
                    path: ctx.path.clone(),
                    chain: ctx.chain.with(RoleVars::of(&wf.root), None, &path),
                };
                self.includes.push(file);
                self.include_sites.push(site);
                let r = self.walk(&wf.root.kind, &sub, &wf.root);
                self.includes.pop();
                self.include_sites.pop();
                r?;
            }
        }
        Ok(())
    }

    fn class(&mut self, id: &str, loc: &Loc) -> Result<Arc<TaskClass>> {
        if let Some(c) = self.classes.get(id) {
            return Ok(c.clone());
        }
        if id.is_empty() || id.contains(['/', '\\']) || id.starts_with('.') {
            return Err(Error::new(loc, format!("`{id}` is not a task class name")));
        }
        // A class a JIT generator wrote with an included workflow (as the anchor's DPL writes
        // into the repository's `tasks/`).
        if let Some(src) = self.generated_classes.get(id) {
            let node = super::yaml::parse(&src.label, &src.text)?;
            let class = Arc::new(load::class_from_node(&node, id)?);
            self.classes.insert(id.to_string(), class.clone());
            return Ok(class);
        }
        let file = self.tasks_dir.join(format!("{id}.yaml"));
        if !file.is_file() {
            return Err(Error::new(
                loc,
                format!("task class `{id}` does not exist (no {})", file.display()),
            ));
        }
        let class = Arc::new(load::load_class(&file, id)?);
        self.classes.insert(id.to_string(), class.clone());
        Ok(class)
    }
}

/// ` by the variable `v`` when a variable the include's value names holds the included name
/// (`include: "{{ dpl_workflow }}"`), else nothing.
fn chosen_by(include: &Template, scope: &Scope, inc: &str) -> String {
    let names = include.parts.iter().flat_map(|p| match p {
        super::template::Part::Var { name, .. } => vec![name.to_string()],
        super::template::Part::Expr { src, .. } => {
            super::expr_scan::scan(src, &super::funcs::known)
                .map(|s| s.vars)
                .unwrap_or_default()
        }
        super::template::Part::Text(_) => Vec::new(),
    });
    for n in names {
        if let Ok(Some(v)) = scope.var(&n)
            && &*v == inc
        {
            return format!(" by the variable `{n}`");
        }
    }
    String::new()
}

/// The anchor's `enabled` rule: `true` or `1`, trimmed, any case.
pub fn is_enabled_text(v: &str) -> bool {
    matches!(v.trim().to_lowercase().as_str(), "true" | "1")
}

/// A JSON list of strings or numbers (how the anchor passes `hosts`); `null` is an empty list
/// (what the anchor's `inventory.CRUCardsForHost` gives a host without cards).
fn parse_range(text: &str) -> Option<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let items = match v {
        serde_json::Value::Array(items) => items,
        serde_json::Value::Null => Vec::new(),
        _ => return None,
    };
    items
        .into_iter()
        .map(|i| match i {
            serde_json::Value::String(s) => Some(s),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
        .collect()
}

fn check_role_name(name: &str, loc: &Loc) -> Result<()> {
    if name.is_empty() {
        return Err(Error::new(loc, "role name is empty"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| matches!(c, '.' | ':' | '/') || c.is_whitespace() || c.is_control())
    {
        return Err(Error::new(
            loc,
            format!("role name `{name}` contains `{}`", c.escape_default()),
        ));
    }
    Ok(())
}

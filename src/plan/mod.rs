//! Per-node task references: env, args, channel endpoints, control ports. No Kubernetes here
//! (the one adapter to the CRD types is [`crate::objects`]).
//!
//! Library API (what the daemon and the CLI call):
//! ```no_run
//! use envbridge::objects::render;
//! use envbridge::plan::RenderRequest;
//! use envbridge::workflow::Sources;
//!
//! let req = RenderRequest {
//!     sources: Sources { tasks_dir: "manifests/control-workflows/tasks".into(), ..Default::default() },
//!     workflow: "manifests/control-workflows/workflows/readout-dataflow.yaml".into(),
//!     sets: vec![("hosts".into(), r#"["flp001","flp002"]"#.into())],
//!     env_id: Some("E1".into()),
//!     ..Default::default()
//! };
//! let rendered = render(&req)?; // Environment + TaskSets + the flat task list
//! # Ok::<(), envbridge::plan::RenderError>(())
//! ```
//! Errors display as `FILE:LINE:COLUMN: message`.

mod channels;
pub mod names;
pub mod ports;
pub mod resolve;
mod reuse;
pub mod templates;
mod view;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;

use foldhash::fast::FixedState;

use crate::workflow::model::FastMap;

pub use crate::model::{ControlMode, EnvVar, TaskRef};
pub use view::{TaskView, tasks_json};

use crate::workflow::error::{Error, Loc};
use crate::workflow::expand::{self, HookInstance};
use crate::workflow::expr::Engine;
use crate::workflow::store::ConfigStore;
use crate::workflow::{self as wf, Sources};

/// An invalid input, displayed as `FILE:LINE:COLUMN: message`.
pub type RenderError = wf::Error;

/// Control ports: the anchor's default port 47100 and up.
pub const DEFAULT_CONTROL_PORTS: RangeInclusive<u16> = 47100..=47999;
/// TCP channel ports: a separate range so that channels never take a control port.
pub const DEFAULT_TCP_PORTS: RangeInclusive<u16> = 48000..=49999;
/// TaskSet size budget (serialized JSON of its tasks), far below etcd's 1.5 MiB.
pub const DEFAULT_TASK_SET_BUDGET: usize = 256 * 1024;
/// Most threads a render uses.
pub const MAX_THREADS: usize = 8;
/// Fewer tasks than this per thread are not worth a thread.
const MIN_TASKS_PER_THREAD: usize = 500;

/// What to render.
#[derive(Clone, Debug)]
pub struct RenderRequest {
    pub sources: Sources,
    /// A workflow file, or a name looked up as `<workflows_dir>/<name>.yaml`.
    pub workflow: PathBuf,
    /// `--set KEY=VALUE`: the highest-priority variables.
    pub sets: Vec<(String, String)>,
    /// The site's configuration store (site variables, inventory, component configuration).
    pub store: Arc<ConfigStore>,
    /// The site's mapping from task classes and control modes to TaskTemplates.
    pub templates: Arc<templates::TemplateMap>,
    /// Seeds every derived name; default: a hash of the workflow's name.
    pub env_id: Option<String>,
    /// Namespace of the objects (none: left to the applier).
    pub namespace: Option<String>,
    /// `O2_SYSTEM` unless the class sets it.
    pub system: String,
    pub control_ports: RangeInclusive<u16>,
    pub tcp_ports: RangeInclusive<u16>,
    /// Ports already used on each node (e.g. by other live environments): never allocated.
    pub reserved_ports: BTreeMap<String, BTreeSet<u16>>,
    pub task_set_budget: usize,
    /// Threads for the per-task work of a large render; 0: this machine's cores (at most
    /// [`MAX_THREADS`]). The output, and the error reported, are the same for any number.
    pub threads: usize,
    /// The `dpl.*` functions: the `jit/` directory and the site's generator, if any.
    pub jit: wf::jit::JitOptions,
}

impl Default for RenderRequest {
    fn default() -> Self {
        RenderRequest {
            sources: Sources::default(),
            workflow: PathBuf::new(),
            sets: Vec::new(),
            store: Arc::new(ConfigStore::empty()),
            templates: Arc::default(),
            env_id: None,
            namespace: None,
            system: "FLP".to_string(),
            control_ports: DEFAULT_CONTROL_PORTS,
            tcp_ports: DEFAULT_TCP_PORTS,
            reserved_ports: BTreeMap::new(),
            task_set_budget: DEFAULT_TASK_SET_BUDGET,
            threads: 0,
            jit: wf::jit::JitOptions::default(),
        }
    }
}

/// The pure result: fully resolved tasks (sorted by node, then role path) and hooks.
#[derive(Clone, Debug)]
pub struct Plan {
    pub environment_id: String,
    pub environment_name: String,
    /// The workflow's root role name.
    pub workflow: String,
    pub tasks: Vec<TaskRef>,
    pub hooks: Vec<HookInstance>,
    /// Every port this plan takes, per node (control and TCP).
    pub ports: BTreeMap<String, BTreeSet<u16>>,
}

/// [`build`], and whether packing the plan into objects may use a second thread (a large
/// plan on a machine with cores to spare; `crate::objects::render`).
pub fn build_sized(req: &RenderRequest) -> Result<(Plan, bool), RenderError> {
    // The machine's cores are looked up once (it reads cgroup files).
    let cores = cores(req.threads);
    let plan = build_on(req, cores)?;
    let parallel = threads_for(cores, plan.tasks.len()) > 1;
    Ok((plan, parallel))
}

/// Locates the workflow file of a request.
pub fn workflow_path(req: &RenderRequest) -> Result<PathBuf, RenderError> {
    if req.workflow.is_file() {
        return Ok(req.workflow.clone());
    }
    if let Some(dir) = &req.sources.workflows_dir {
        let name = req.workflow.to_string_lossy();
        let candidate = dir.join(format!("{}.yaml", name.trim_end_matches(".yaml")));
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    let file: Arc<str> = Arc::from(req.workflow.display().to_string());
    Err(Error::new(&Loc::file_start(&file), "no such workflow file"))
}

/// Expands and resolves a workflow into task references (no objects yet).
pub fn build(req: &RenderRequest) -> Result<Plan, RenderError> {
    build_on(req, cores(req.threads))
}

/// [`build`] with up to `cores` threads.
fn build_on(req: &RenderRequest, cores: usize) -> Result<Plan, RenderError> {
    let path = workflow_path(req)?;
    let jit = wf::jit::Jit::new(&req.jit, &expand::workflows_dir(&req.sources, &path));
    let engine = Engine::with_jit(req.store.clone(), Arc::new(jit));
    let env_id = match &req.env_id {
        Some(id) => id.clone(),
        None => names::default_env_id(
            &path
                .file_stem()
                .map(|s| s.to_string_lossy())
                .unwrap_or_default(),
        ),
    };
    let x = expand::expand(&engine, &req.sources, &path, &req.sets, &env_id)?;
    let mut resolved = resolve_all(&engine, &x, threads_for(cores, x.tasks.len()))?;
    // Usually sorted already (iterators run over hosts in order): then no sort, whose scratch
    // buffer alone is megabytes of fresh memory.
    fn key(t: &resolve::ResolvedTask) -> (&str, &str) {
        (&t.node, &t.path)
    }
    if !resolved.is_sorted_by(|a, b| key(a) <= key(b)) {
        resolved.sort_by(|a, b| key(a).cmp(&key(b)));
    }

    let mut book = ports::PortBook::new(&req.reserved_ports);
    let mut control = Vec::with_capacity(resolved.len());
    for t in &resolved {
        // Hook and basic tasks speak no control protocol: no control port (the anchor's 0).
        if !t.mode.has_protocol() {
            control.push(0);
            continue;
        }
        let port = book.take(&t.node, &req.control_ports).ok_or_else(|| {
            Error::new(
                &t.loc,
                format!(
                    "no free control port left on node `{}` in {}-{} for task `{}`",
                    t.node,
                    req.control_ports.start(),
                    req.control_ports.end(),
                    t.path
                ),
            )
        })?;
        control.push(port);
    }
    let chans = channels::wire(&env_id, &resolved, &mut book, &req.tcp_ports)?;

    let mut tasks = Vec::with_capacity(resolved.len());
    let mut locs = Vec::with_capacity(resolved.len());
    let mut strings = TaskStrings::new(&req.system);
    for ((t, port), channels) in resolved.into_iter().zip(control).zip(chans) {
        locs.push(t.loc.clone());
        tasks.push(task_ref(t, port, channels, &mut strings, &req.templates));
    }
    // Names and ids are checked once all are made (borrowed, not copied); the first task
    // whose name or id is taken is reported, as before.
    let mut names_seen: HashSet<&str, FixedState> =
        HashSet::with_capacity_and_hasher(tasks.len(), FixedState::default());
    let mut ids_seen: HashSet<&str, FixedState> =
        HashSet::with_capacity_and_hasher(tasks.len(), FixedState::default());
    for (t, loc) in tasks.iter().zip(&locs) {
        if !names_seen.insert(&t.name) || !ids_seen.insert(&t.id) {
            return Err(Error::new(
                loc,
                format!(
                    "task `{}` gets a name or id already taken: `{}`",
                    t.path, t.name
                ),
            ));
        }
    }
    Ok(Plan {
        environment_name: names::environment_name(&env_id),
        environment_id: env_id,
        workflow: x.name.clone(),
        tasks,
        hooks: x.hooks,
        ports: book.into_taken(),
    })
}

/// The strings [`task_ref`] adds to every task, made once per render: env names, FairMQ
/// arguments, `O2_SYSTEM`, port numbers, and the node of the previous task (tasks come
/// sorted by node).
struct TaskStrings {
    o2_role: Arc<str>,
    o2_system: Arc<str>,
    occ_control_port: Arc<str>,
    system: Arc<str>,
    /// `--id`, `-S`, `-P`, `OCClite`, `--color`, `false`, `--control-port`.
    fairmq: [Arc<str>; 7],
    default_plugin: Arc<str>,
    ports: FastMap<u16, Arc<str>>,
    node: Option<Arc<str>>,
}

impl TaskStrings {
    fn new(system: &str) -> Self {
        TaskStrings {
            o2_role: Arc::from("O2_ROLE"),
            o2_system: Arc::from("O2_SYSTEM"),
            occ_control_port: Arc::from("OCC_CONTROL_PORT"),
            system: Arc::from(system),
            fairmq: [
                "--id",
                "-S",
                "-P",
                "OCClite",
                "--color",
                "false",
                "--control-port",
            ]
            .map(Arc::from),
            default_plugin: Arc::from("$CONTROL_OCCPLUGIN_ROOT/lib/"),
            ports: FastMap::default(),
            node: None,
        }
    }

    fn port(&mut self, port: u16) -> Arc<str> {
        self.ports
            .entry(port)
            .or_insert_with(|| Arc::from(port.to_string()))
            .clone()
    }

    fn node(&mut self, node: &str) -> Arc<str> {
        match &self.node {
            Some(n) if &**n == node => n.clone(),
            _ => self.node.insert(Arc::from(node)).clone(),
        }
    }
}

/// The most threads a render may use when `requested` ([`RenderRequest::threads`]; 0: this
/// machine's cores, at most [`MAX_THREADS`]).
fn cores(requested: usize) -> usize {
    match requested {
        0 => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS),
        n => n,
    }
}

/// How many threads a render of `tasks` uses, with at most `cores` ([`cores`]).
fn threads_for(cores: usize, tasks: usize) -> usize {
    cores.min(tasks / MIN_TASKS_PER_THREAD).max(1)
}

/// Resolves every task, in consecutive chunks on `threads` threads, each with its own engine
/// (sharing `main`'s compiled programs; on one thread, `main` itself) and caches. The result,
/// and the error reported (the first failing task's), do not depend on the number of threads.
fn resolve_all(
    main: &Engine,
    x: &expand::Expanded,
    threads: usize,
) -> Result<Vec<resolve::ResolvedTask>, RenderError> {
    let chunk = |engine: &Engine, tasks: &[expand::TaskInstance]| -> Result<Vec<_>, RenderError> {
        let reuse = reuse::Reuse::new(engine, x);
        tasks
            .iter()
            .map(|t| resolve::resolve(engine, x, &reuse, t))
            .collect()
    };
    if threads <= 1 {
        return chunk(main, &x.tasks);
    }
    let per = x.tasks.len().div_ceil(threads);
    let parts: Vec<Result<Vec<_>, RenderError>> = std::thread::scope(|s| {
        let workers: Vec<_> = x
            .tasks
            .chunks(per)
            .map(|c| {
                let engine = main.sharing_programs();
                s.spawn(move || chunk(&engine, c))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let mut out = Vec::with_capacity(x.tasks.len());
    for part in parts {
        out.extend(part?);
    }
    Ok(out)
}

fn task_ref(
    t: resolve::ResolvedTask,
    port: u16,
    channels: channels::ChannelArgs,
    strings: &mut TaskStrings,
    templates: &templates::TemplateMap,
) -> TaskRef {
    // The site's class entry, the `task_template` variable, the site's mode entry, the class.
    let template = match templates.for_class(&t.class) {
        Some(m) => m.to_string(),
        None => t
            .template_var
            .clone()
            .or_else(|| templates.for_mode(t.mode).map(str::to_string))
            .unwrap_or_else(|| t.class_template.clone()),
    };
    let mut env = t.env;
    // The anchor's rule: a default is added unless an entry's name starts with its name.
    let has = |env: &[EnvVar], n: &str| env.iter().any(|e| e.name.starts_with(n));
    let port_text = strings.port(port);
    if !has(&env, "O2_ROLE") {
        env.push(EnvVar {
            name: strings.o2_role.clone(),
            value: strings.node(&t.node),
        });
    }
    if !has(&env, "O2_SYSTEM") {
        env.push(EnvVar {
            name: strings.o2_system.clone(),
            value: strings.system.clone(),
        });
    }
    if t.mode.has_protocol() {
        env.retain(|e| &*e.name != "OCC_CONTROL_PORT");
        env.push(EnvVar {
            name: strings.occ_control_port.clone(),
            value: port_text.clone(),
        });
    }
    let mut args = t.args;
    if t.mode == ControlMode::Fairmq {
        // What the anchor adds to FairMQ devices: the id (unless given), the OCC plugin, the
        // control port. The plugin path is the anchor's, for the process's shell to expand.
        let [id_flag, s, p, occlite, color, no, control_port] = strings.fairmq.clone();
        if !args.iter().any(|a| &**a == "--id") {
            args.extend([id_flag, Arc::from(t.id.as_str())]);
        }
        args.extend([
            s,
            strings.default_plugin.clone(),
            p,
            occlite,
            color,
            no,
            control_port,
            port_text,
        ]);
    }
    TaskRef {
        name: t.name,
        id: t.id,
        path: t.path,
        class: t.class,
        node: t.node,
        template: names::dns_label(&template, names::DNS_LABEL_MAX),
        control_mode: t.mode,
        control_port: port,
        critical: t.critical,
        command: t.command,
        shell: t.shell,
        user: t.user,
        env,
        args,
        channels,
        trigger: t.trigger,
        r#await: t.r#await,
        timeout_seconds: t.timeout_seconds,
        properties: t.properties,
    }
}

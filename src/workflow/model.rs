//! The input model: task classes and workflow roles, every value a located [`Template`].

use std::collections::HashMap;
use std::sync::Arc;

use super::error::Loc;
use super::template::Template;

/// A hash map with a fast, fixed-seed hasher: the cascade looks names up for every value of
/// every task, and SipHash's DoS resistance buys nothing on our own input files.
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// One bit per name (a 64-bit Bloom filter): a set of names whose mask lacks a name's bit
/// does not hold that name. Settles most lookups in the cascade without hashing into a map.
pub fn name_bit(name: &str) -> u64 {
    use std::hash::BuildHasher;
    1u64 << (foldhash::fast::FixedState::default().hash_one(name) & 63)
}

/// Variables written in one place (a class's `defaults`, a role's `vars`, a site profile...).
/// Keyed by name; where names repeat, the later one wins.
#[derive(Clone, Debug, Default)]
pub struct VarBlock {
    /// Shared: blocks are referenced by every task's cascade, never copied.
    pub vars: Arc<FastMap<Arc<str>, Template>>,
    /// [`name_bit`] of every name in `vars`.
    pub mask: u64,
    /// What a variable written as a mapping declares besides its `value` (the anchor's
    /// `!public` metadata: label, description, type, widget, values, panel, index, visibleif,
    /// ...), by name: what a caller may set and how a form shows it.
    pub meta: Arc<FastMap<Arc<str>, VarMeta>>,
}

/// A variable's declaration besides its value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VarMeta {
    /// Tagged `!public` (a run-control client may set it).
    pub public: bool,
    /// Every other field of the mapping, as written (YAML scalars as strings, lists and
    /// mappings as JSON).
    pub fields: std::collections::BTreeMap<String, serde_json::Value>,
}

impl VarBlock {
    pub fn from_map(vars: HashMap<Arc<str>, Template>) -> Self {
        VarBlock {
            mask: vars.keys().fold(0, |m, k| m | name_bit(k)),
            vars: Arc::new(vars.into_iter().collect()),
            meta: Arc::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&Template> {
        self.vars.get(name)
    }
}

/// A FairMQ channel: `bind` (inbound) or `connect` (outbound).
#[derive(Clone, Debug)]
pub struct Channel {
    pub loc: Loc,
    pub name: Template,
    pub r#type: Option<Template>,
    pub transport: Option<Template>,
    pub addressing: Option<Template>,
    pub snd_buf_size: Option<Template>,
    pub rcv_buf_size: Option<Template>,
    pub rate_logging: Option<Template>,
    /// Outbound: `<role path>:<channel>` or `::<alias>`.
    pub target: Option<Template>,
    /// Inbound: publishes the alias `::<global>`.
    pub global: Option<Template>,
}

#[derive(Clone, Debug)]
pub struct Constraint {
    pub attribute: Template,
    pub value: Template,
}

#[derive(Clone, Debug, Default)]
pub struct Command {
    pub env: Vec<Template>,
    pub shell: Option<Template>,
    pub value: Option<Template>,
    pub user: Option<Template>,
    pub arguments: Vec<Template>,
}

/// A task class, identified by its file name (what `load:` names).
#[derive(Clone, Debug)]
pub struct TaskClass {
    pub id: Arc<str>,
    pub file: Arc<str>,
    /// The `name:` field (several corpus files share one); the default TaskTemplate name.
    pub name: Option<Template>,
    pub defaults: VarBlock,
    pub vars: VarBlock,
    pub mode: Template,
    pub command: Command,
    pub bind: Vec<Channel>,
    pub connect: Vec<Channel>,
    pub constraints: Vec<Constraint>,
    /// CONFIGURE-time properties (name, value), in file order.
    pub properties: Vec<(Arc<str>, Template)>,
}

#[derive(Clone, Debug)]
pub struct TaskSpec {
    pub load: Template,
    pub critical: Option<Template>,
    pub timeout: Option<Template>,
    pub trigger: Option<Template>,
    pub r#await: Option<Template>,
}

#[derive(Clone, Debug)]
pub struct CallSpec {
    pub func: Template,
    pub critical: Option<Template>,
    pub timeout: Option<Template>,
    pub trigger: Option<Template>,
    pub r#await: Option<Template>,
}

#[derive(Clone, Debug)]
pub struct ForSpec {
    pub range: Template,
    pub var: Arc<str>,
}

#[derive(Clone, Debug)]
pub enum RoleKind {
    /// Shared with every task instance of the role.
    Task(Arc<TaskSpec>),
    Call(CallSpec),
    Include(Template),
    Aggregator(Vec<Role>),
}

/// One role of a workflow tree (the workflow's root is a role too).
#[derive(Clone, Debug)]
pub struct Role {
    pub loc: Loc,
    pub name: Template,
    pub enabled: Option<Template>,
    pub r#for: Option<ForSpec>,
    pub defaults: VarBlock,
    pub vars: VarBlock,
    pub constraints: Vec<Constraint>,
    /// Shared with every task instance of the role.
    pub bind: Arc<[Channel]>,
    pub connect: Arc<[Channel]>,
    pub kind: RoleKind,
}

/// A workflow template file: its root role.
#[derive(Clone, Debug)]
pub struct Workflow {
    pub file: Arc<str>,
    pub root: Role,
    /// Its `name` is tagged `!public`: offered to run-control clients (as the anchor lists
    /// only such templates unless asked for all).
    pub public: bool,
    /// Its `description`, when tagged `!public` (the only one the anchor shows).
    pub description: Option<String>,
}

//! Values evaluated once per task class instead of once per task.
//!
//! Most of a class's values (arguments, env, channels) read only variables that every task of
//! the class resolves alike: class defaults and vars, the site profile, `--set`. Such a value
//! is evaluated once, in a scope of just those layers, remembering every name it read. A task
//! reuses it unless one of its own role layers (role `defaults`/`vars`, iterator variables)
//! defines one of those names; a value that read `task_hostname`, `Parent()`, `Up(n)` or
//! `uid.New()`, or that failed, is never reused. Otherwise the task evaluates it itself,
//! exactly as without this cache, so output and errors are unchanged.

use std::cell::RefCell;
use std::sync::Arc;

use super::EnvVar;
use super::resolve::{EvalChannel, env_entry, eval_channel};
use crate::workflow::error::Result;
use crate::workflow::expand::{Expanded, Frame, TaskInstance, cascade};
use crate::workflow::expr::Engine;
use crate::workflow::model::{Channel, FastMap, name_bit};
use crate::workflow::scope::{Builtins, Scope};
use crate::workflow::template::Template;

/// A value shared by the tasks of one class, with the names it read.
struct Shared<T> {
    value: T,
    reads: Box<[Arc<str>]>,
    /// [`mask`] of `reads`: most checks end with it.
    mask: u64,
}

/// The names a task's own role layers define, and their [`mask`].
pub struct Own<'a> {
    names: Vec<&'a str>,
    mask: u64,
}

/// [`name_bit`] of every name: two sets whose masks share no bit share no name.
fn mask<'n>(names: impl IntoIterator<Item = &'n str>) -> u64 {
    names.into_iter().fold(0, |m, n| m | name_bit(n))
}

/// By (class, what was evaluated): `None` when the value cannot be shared.
type Cache<T> = RefCell<FastMap<(usize, usize), Option<Shared<T>>>>;

/// The per-render cache (one per [`Expanded`]).
pub struct Reuse<'x, 'e> {
    engine: &'e Engine,
    x: &'x Expanded,
    values: Cache<Arc<str>>,
    envs: Cache<EnvVar>,
    channels: Cache<Arc<EvalChannel>>,
}

impl<'x, 'e> Reuse<'x, 'e> {
    pub fn new(engine: &'e Engine, x: &'x Expanded) -> Self {
        Reuse {
            engine,
            x,
            values: RefCell::default(),
            envs: RefCell::default(),
            channels: RefCell::default(),
        }
    }

    /// `tmpl` (written at `at`) for task `t` whose role layers define `own`, when shared.
    pub fn get(
        &self,
        t: &TaskInstance,
        own: &Own,
        tmpl: &Template,
        at: &Arc<str>,
    ) -> Option<Arc<str>> {
        let what = Arc::as_ptr(&tmpl.parts).cast::<u8>() as usize;
        self.shared(&self.values, t, own, what, |scope| scope.eval_arc(tmpl, at))
    }

    /// The `command.env` entry `tmpl` of task `t`, split into name and value, when shared
    /// (an entry that is no `NAME=VALUE` is not: the task reports it).
    pub fn env(
        &self,
        t: &TaskInstance,
        own: &Own,
        tmpl: &Template,
        at: &Arc<str>,
    ) -> Option<EnvVar> {
        let what = Arc::as_ptr(&tmpl.parts).cast::<u8>() as usize;
        self.shared(&self.envs, t, own, what, |scope| {
            env_entry(&scope.eval(tmpl, at)?, &tmpl.loc)
        })
    }

    /// Channel `c` (written at `at`) of task `t`, when every field of it is shared.
    pub fn channel(
        &self,
        t: &TaskInstance,
        own: &Own,
        c: &Channel,
        at: &Arc<str>,
        outbound: bool,
    ) -> Option<Arc<EvalChannel>> {
        // A channel lives in one list (bind or connect) of its class or role: its address
        // tells them apart.
        let what = std::ptr::from_ref(c) as usize;
        self.shared(&self.channels, t, own, what, |scope| {
            eval_channel(&|tmpl| scope.eval_arc(tmpl, at), c, outbound).map(Arc::new)
        })
    }

    fn shared<T: Clone>(
        &self,
        cache: &Cache<T>,
        t: &TaskInstance,
        own: &Own,
        what: usize,
        eval: impl FnOnce(&Scope) -> Result<T>,
    ) -> Option<T> {
        let key = (Arc::as_ptr(&t.class).cast::<u8>() as usize, what);
        if let Some(entry) = cache.borrow().get(&key) {
            return usable(entry.as_ref()?, own);
        }
        let entry = self.evaluate(t, eval);
        let out = entry.as_ref().and_then(|s| usable(s, own));
        cache.borrow_mut().insert(key, entry);
        out
    }

    /// Evaluates with only the layers every task of the class shares.
    fn evaluate<T>(
        &self,
        t: &TaskInstance,
        eval: impl FnOnce(&Scope) -> Result<T>,
    ) -> Option<Shared<T>> {
        let x = self.x;
        // The task's cascade without its role layers.
        let scope = Scope::tracked(
            self.engine,
            cascade(Some(&t.class), &x.site, &[], &x.sets),
            Builtins {
                environment_id: x.environment_id.clone(),
                task_hostname: None,
            },
            t.path.clone(),
        );
        let value = eval(&scope);
        let reads = scope.take_reads();
        match value {
            Ok(value) if !reads.contextual => Some(Shared {
                value,
                mask: mask(reads.names.iter().map(|n| &**n)),
                reads: reads.names.into_boxed_slice(),
            }),
            _ => None,
        }
    }
}

fn usable<T: Clone>(s: &Shared<T>, own: &Own) -> Option<T> {
    let shadowed = s.mask & own.mask != 0 && s.reads.iter().any(|r| own.names.contains(&&**r));
    (!shadowed).then(|| s.value.clone())
}

/// The names a task's own role layers (`frames`) define (they may differ between tasks of one
/// class).
pub fn own_names<'a>(frames: &[&'a Frame]) -> Own<'a> {
    let mut out: Vec<&str> = Vec::new();
    let mut mask = 0;
    for l in frames
        .iter()
        .flat_map(|f| f.defaults().iter().chain(f.vars()))
    {
        mask |= l.block.mask;
        for k in l.block.vars.keys() {
            if !out.contains(&&**k) {
                out.push(k);
            }
        }
    }
    Own { names: out, mask }
}

//! Values evaluated once per task class instead of once per task.
//!
//! Most of a class's values (arguments, env, channel fields) read only variables that every
//! task of the class resolves alike: class defaults and vars, the site profile, `--set`. Such a
//! value is evaluated once, in a scope of just those layers, remembering every name it read.
//! A task reuses it unless one of its own role layers (role `defaults`/`vars`, iterator
//! variables) defines one of those names; a value that read `task_hostname`, `Parent()`,
//! `Up(n)` or `uid.New()` is never reused. Otherwise the task evaluates it itself, exactly as
//! without this cache, so output and errors are unchanged.

use std::cell::RefCell;
use std::sync::Arc;

use crate::workflow::error::Result;
use crate::workflow::expand::{Expanded, Frame, TaskInstance};
use crate::workflow::expr::Engine;
use crate::workflow::model::FastMap;
use crate::workflow::scope::{Builtins, Layer, LayerRef, Scope};
use crate::workflow::template::Template;

/// A value shared by the tasks of one class, with the names it read.
struct Shared {
    value: Arc<str>,
    reads: Box<[Arc<str>]>,
}

/// The per-render cache (one per [`Expanded`]).
pub struct Reuse<'x, 'e> {
    engine: &'e Engine,
    x: &'x Expanded,
    /// By (class, template text): `None` when the value cannot be shared.
    values: RefCell<FastMap<(usize, usize), Option<Shared>>>,
}

impl<'x, 'e> Reuse<'x, 'e> {
    pub fn new(engine: &'e Engine, x: &'x Expanded) -> Self {
        Reuse {
            engine,
            x,
            values: RefCell::default(),
        }
    }

    /// `tmpl` (written at `at`) for task `t` whose role layers define `own`, when shared.
    pub fn get(
        &self,
        t: &TaskInstance,
        own: &[&str],
        tmpl: &Template,
        at: &Arc<str>,
    ) -> Option<String> {
        let key = (
            Arc::as_ptr(&t.class).cast::<u8>() as usize,
            Arc::as_ptr(&tmpl.parts).cast::<u8>() as usize,
        );
        if let Some(entry) = self.values.borrow().get(&key) {
            return usable(entry.as_ref()?, own);
        }
        let entry = self.evaluate(t, tmpl, at);
        let out = entry.as_ref().and_then(|s| usable(s, own));
        self.values.borrow_mut().insert(key, entry);
        out
    }

    /// Evaluates `tmpl` with only the layers every task of the class shares.
    fn evaluate(&self, t: &TaskInstance, tmpl: &Template, at: &Arc<str>) -> Option<Shared> {
        let x = self.x;
        let mut layers = Vec::with_capacity(3 + x.site.len());
        layers.push(LayerRef::new(&t.class.defaults, None));
        layers.extend(x.site.iter().map(Layer::borrow));
        layers.push(LayerRef::new(&t.class.vars, None));
        layers.push(x.sets.borrow());
        let scope = Scope::tracked(
            self.engine,
            layers,
            Builtins {
                environment_id: x.environment_id.clone(),
                task_hostname: None,
            },
            t.path.clone(),
        );
        let value: Result<String> = scope.eval(tmpl, at);
        let reads = scope.take_reads();
        match value {
            Ok(v) if !reads.contextual => Some(Shared {
                value: Arc::from(v),
                reads: reads.names.into_boxed_slice(),
            }),
            _ => None,
        }
    }
}

fn usable(s: &Shared, own: &[&str]) -> Option<String> {
    let shadowed = s.reads.iter().any(|r| own.contains(&&**r));
    // `String::from`, not `to_string`: the latter formats an `Arc<str>` through `Display`.
    (!shadowed).then(|| String::from(&*s.value))
}

/// The names a task's own role layers (`frames`) define (they may differ between tasks of one
/// class).
pub fn own_names<'a>(frames: &[&'a Frame]) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for f in frames {
        for k in f
            .defaults()
            .iter()
            .chain(f.vars())
            .flat_map(|l| l.block.vars.keys())
        {
            if !out.contains(&&**k) {
                out.push(k);
            }
        }
    }
    out
}

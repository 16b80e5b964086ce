//! The variable cascade and lazy evaluation.
//!
//! A scope is a list of layers, lowest priority first (docs/workflow-language.md gives the
//! order). A variable is evaluated where it is used, once per scope (memoised), relative to
//! the role where its value was written (`Parent()`, `Up(n)`). A value naming its own variable
//! (`user: "{{ user }}-x"`) reads the next lower definition; other cycles are errors.

use std::cell::RefCell;
use std::sync::Arc;

use super::error::{Error, Result};
use super::expr::{CallSite, Engine, Lookup, MAX_VALUE, UidSeed};
use super::model::{FastMap, VarBlock, name_bit};
use super::template::{Part, Template};

/// Longest chain of variables evaluating each other.
const MAX_CHAIN: usize = 64;

/// Variables written in one place, and the role path they were written at.
#[derive(Clone, Debug)]
pub struct Layer {
    pub block: VarBlock,
    /// `None`: site profile and `--set` values, relative to the role using them.
    pub at: Option<Arc<str>>,
}

impl Layer {
    pub fn new(block: &VarBlock, at: Option<&Arc<str>>) -> Self {
        Layer {
            block: block.clone(),
            at: at.cloned(),
        }
    }

    pub fn borrow(&self) -> LayerRef<'_> {
        LayerRef::new(&self.block, self.at.as_ref())
    }
}

/// A layer as a scope reads it: borrowed, so that building a task's cascade copies nothing.
#[derive(Clone, Copy, Debug)]
pub struct LayerRef<'a> {
    pub vars: &'a FastMap<Arc<str>, Template>,
    /// [`VarBlock::mask`]: most layers are passed over without a lookup.
    pub mask: u64,
    /// `None`: relative to the role using the value (the scope's home).
    pub at: Option<&'a Arc<str>>,
}

impl<'a> LayerRef<'a> {
    pub fn new(block: &'a VarBlock, at: Option<&'a Arc<str>>) -> Self {
        LayerRef {
            vars: &block.vars,
            mask: block.mask,
            at,
        }
    }
}

/// Built-in variables, above every layer.
#[derive(Clone, Debug)]
pub struct Builtins {
    pub environment_id: Arc<str>,
    pub task_hostname: Option<Arc<str>>,
}

/// What a tracked scope's evaluations read: every variable name looked up (found or not,
/// transitively), and whether anything read where it was evaluated. A value with no
/// contextual read is the same in every scope whose layers define those names alike.
#[derive(Clone, Debug, Default)]
pub struct Reads {
    pub names: Vec<Arc<str>>,
    /// `task_hostname`, `Parent()`, `Up(n)` or `uid.New()` was read.
    pub contextual: bool,
}

/// One definition (a name in one layer): the address of its template, which the layer owns
/// for the scope's whole life, and the layer. Cheaper to hash than the name, no allocation.
type VarKey = (usize, usize);

pub struct Scope<'a> {
    engine: &'a Engine,
    layers: Vec<LayerRef<'a>>,
    builtins: Builtins,
    /// The role (or task) path evaluating: `Parent()` for values without a place of their own.
    home: Arc<str>,
    memo: RefCell<FastMap<VarKey, Arc<str>>>,
    /// Definitions being evaluated (with their names, for the cycle message).
    active: RefCell<Vec<(VarKey, Arc<str>)>>,
    /// Recorded only by a tracked scope ([`Scope::tracked`]).
    reads: Option<RefCell<Reads>>,
}

impl<'a> Scope<'a> {
    pub fn new(
        engine: &'a Engine,
        layers: impl IntoIterator<Item = LayerRef<'a>>,
        builtins: Builtins,
        home: Arc<str>,
    ) -> Self {
        let layers = layers.into_iter().filter(|l| !l.vars.is_empty()).collect();
        Scope {
            engine,
            layers,
            builtins,
            home,
            // Allocated on first use: a task whose values its class shares reads few variables.
            memo: RefCell::default(),
            active: RefCell::default(),
            reads: None,
        }
    }

    /// A scope that records what its evaluations read ([`Scope::take_reads`]).
    pub fn tracked(
        engine: &'a Engine,
        layers: impl IntoIterator<Item = LayerRef<'a>>,
        builtins: Builtins,
        home: Arc<str>,
    ) -> Self {
        let mut s = Scope::new(engine, layers, builtins, home);
        s.reads = Some(RefCell::default());
        s
    }

    /// What was read since the last call (empty for an untracked scope).
    pub fn take_reads(&self) -> Reads {
        self.reads.as_ref().map(RefCell::take).unwrap_or_default()
    }

    pub fn home(&self) -> &Arc<str> {
        &self.home
    }

    /// Sets `task_hostname` once the node is known (constraints are evaluated before).
    pub fn set_hostname(&mut self, host: Arc<str>) {
        self.builtins.task_hostname = Some(host);
    }

    /// A variable's value, `None` when undefined.
    pub fn var(&self, name: &str) -> Result<Option<Arc<str>>> {
        self.resolve(name, self.layers.len())
    }

    /// Highest definition of `name` in the layers below `limit`.
    fn resolve(&self, name: &str, limit: usize) -> Result<Option<Arc<str>>> {
        if let Some(reads) = &self.reads {
            let mut r = reads.borrow_mut();
            r.contextual |= name == "task_hostname";
            if !r.names.iter().any(|n| &**n == name) {
                r.names.push(Arc::from(name));
            }
        }
        match name {
            "environment_id" => return Ok(Some(self.builtins.environment_id.clone())),
            "task_hostname" => {
                if let Some(h) = &self.builtins.task_hostname {
                    return Ok(Some(h.clone()));
                }
            }
            _ => {}
        }
        let bit = name_bit(name);
        let found = self.layers[..limit.min(self.layers.len())]
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, l)| l.mask & bit != 0)
            .find_map(|(i, l)| l.vars.get_key_value(name).map(|(k, t)| (i, l, k, t)));
        let Some((level, layer, var_name, tmpl)) = found else {
            return Ok(None);
        };
        let key: VarKey = (std::ptr::from_ref(tmpl) as usize, level);
        if let Some(v) = self.memo.borrow().get(&key) {
            return Ok(Some(v.clone()));
        }
        {
            let active = self.active.borrow();
            if active.iter().any(|(k, _)| *k == key) {
                let chain: Vec<&str> = active.iter().map(|(_, n)| &**n).collect();
                return Err(Error::new(
                    &tmpl.loc,
                    format!(
                        "variable `{name}` depends on itself ({} -> {name})",
                        chain.join(" -> ")
                    ),
                ));
            }
            if active.len() >= MAX_CHAIN {
                return Err(Error::new(
                    &tmpl.loc,
                    format!("variables nested deeper than {MAX_CHAIN} levels"),
                ));
            }
        }
        // A literal needs no evaluation and no copy: its shared text is the value.
        if let Some(lit) = tmpl.as_shared_literal() {
            self.memo.borrow_mut().insert(key, lit.clone());
            return Ok(Some(lit.clone()));
        }
        self.active.borrow_mut().push((key, var_name.clone()));
        let at = layer.at.unwrap_or(&self.home);
        let out = self.eval_shared(tmpl, at, Some((name, level)));
        self.active.borrow_mut().pop();
        let value = out?;
        self.memo.borrow_mut().insert(key, value.clone());
        Ok(Some(value))
    }

    /// [`Scope::eval_in`] as a shared string: a value that is just another variable
    /// (`{{ name }}`) is that variable's value, not a copy.
    fn eval_shared(
        &self,
        tmpl: &Template,
        at: &Arc<str>,
        own: Option<(&str, usize)>,
    ) -> Result<Arc<str>> {
        if let [Part::Var { name, loc }] = &*tmpl.parts {
            let lookup = ScopeLookup { scope: self, own };
            return match lookup.lookup(name)? {
                Some(v) if v.len() > MAX_VALUE => Err(Error::new(
                    &tmpl.loc,
                    format!("value longer than {MAX_VALUE} bytes"),
                )),
                Some(v) => Ok(v),
                None => Err(Error::new(loc, format!("unknown variable `{name}`"))),
            };
        }
        self.eval_in(tmpl, at, own).map(Arc::from)
    }

    /// Evaluates a template written at role `at` (a class's values: the task's own path).
    pub fn eval(&self, tmpl: &Template, at: &Arc<str>) -> Result<String> {
        self.eval_in(tmpl, at, None)
    }

    /// [`Scope::eval`] as a shared string: a literal is its text and `{{ name }}` is the
    /// variable's value, neither copied (most arguments of a task are one or the other).
    pub fn eval_arc(&self, tmpl: &Template, at: &Arc<str>) -> Result<Arc<str>> {
        match tmpl.as_shared_literal() {
            Some(lit) => Ok(lit.clone()),
            None => self.eval_shared(tmpl, at, None),
        }
    }

    /// Evaluates a template written at the home role.
    pub fn eval_here(&self, tmpl: &Template) -> Result<String> {
        self.eval_in(tmpl, &self.home.clone(), None)
    }

    fn eval_in(
        &self,
        tmpl: &Template,
        at: &Arc<str>,
        own: Option<(&str, usize)>,
    ) -> Result<String> {
        if let Some(lit) = tmpl.as_literal() {
            return Ok(lit.to_string());
        }
        let lookup = ScopeLookup { scope: self, own };
        // Room for the text and a short value per expression: most values fit without growing.
        let room: usize = tmpl
            .parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.len(),
                _ => 32,
            })
            .sum();
        let mut out = String::with_capacity(room);
        for part in tmpl.parts.iter() {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Var { name, loc } => match lookup.lookup(name)? {
                    Some(v) => out.push_str(&v),
                    None => return Err(Error::new(loc, format!("unknown variable `{name}`"))),
                },
                Part::Expr { src, loc } => {
                    let site = || CallSite {
                        role_path: at.clone(),
                        uid_seed: UidSeed::At {
                            environment_id: self.builtins.environment_id.clone(),
                            home: self.home.clone(),
                            loc: loc.clone(),
                        },
                    };
                    self.engine.eval_into(src, loc, &lookup, site, &mut out)?;
                    if let Some(reads) = &self.reads
                        && !self.engine.context_free(src, loc)?
                    {
                        reads.borrow_mut().contextual = true;
                    }
                }
            }
            if out.len() > MAX_VALUE {
                return Err(Error::new(
                    &tmpl.loc,
                    format!("value longer than {MAX_VALUE} bytes"),
                ));
            }
        }
        Ok(out)
    }
}

struct ScopeLookup<'s, 'a> {
    scope: &'s Scope<'a>,
    own: Option<(&'s str, usize)>,
}

impl Lookup for ScopeLookup<'_, '_> {
    fn lookup(&self, name: &str) -> Result<Option<Arc<str>>> {
        match self.own {
            Some((own, level)) if own == name => self.scope.resolve(name, level),
            _ => self.scope.var(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::error::Loc;
    use crate::workflow::template;

    fn block(vars: &[(&str, &str)]) -> VarBlock {
        let f: Arc<str> = Arc::from("v.yaml");
        let loc = Loc::new(&f, 1, 1);
        VarBlock::from_map(
            vars.iter()
                .map(|(k, v)| {
                    (
                        Arc::from(*k),
                        template::parse(v, &loc, &|_| loc.clone()).unwrap(),
                    )
                })
                .collect(),
        )
    }

    #[test]
    fn cascade_laziness_and_self_reference() {
        let engine = Engine::new();
        let low = Layer::new(
            &block(&[("user", "flp"), ("unused", "{{ undefined_thing }}")]),
            None,
        );
        let path: Arc<str> = Arc::from("w.a.b");
        let high = Layer::new(
            &block(&[("user", "{{ user }}-x"), ("p", "{{ Parent().Path }}")]),
            Some(&path),
        );
        let scope = Scope::new(
            &engine,
            [low.borrow(), high.borrow()],
            Builtins {
                environment_id: Arc::from("E1"),
                task_hostname: None,
            },
            Arc::from("w.a.b.c"),
        );
        assert_eq!(scope.var("user").unwrap().as_deref(), Some("flp-x"));
        assert_eq!(scope.var("p").unwrap().as_deref(), Some("w.a"));
        assert_eq!(scope.var("environment_id").unwrap().as_deref(), Some("E1"));
        assert!(scope.var("unused").is_err());
        assert_eq!(scope.var("nothing").unwrap(), None);
    }

    #[test]
    fn cycles_are_errors() {
        let engine = Engine::new();
        let l = Layer::new(&block(&[("a", "{{ b }}"), ("b", "x{{ a }}")]), None);
        let scope = Scope::new(
            &engine,
            [l.borrow()],
            Builtins {
                environment_id: Arc::from("E"),
                task_hostname: None,
            },
            Arc::from("w"),
        );
        let e = scope.var("a").unwrap_err();
        assert!(e.message.contains("depends on itself"), "{e}");
    }

    #[test]
    fn doubling_chains_are_bounded() {
        let engine = Engine::new();
        let mut vars = vec![("v0".to_string(), "x".repeat(64))];
        for i in 1..40 {
            vars.push((format!("v{i}"), format!("{{{{ v{p} + v{p} }}}}", p = i - 1)));
        }
        let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let l = Layer::new(&block(&pairs), None);
        let scope = Scope::new(
            &engine,
            [l.borrow()],
            Builtins {
                environment_id: Arc::from("E"),
                task_hostname: None,
            },
            Arc::from("w"),
        );
        let e = scope.var("v39").unwrap_err();
        assert!(e.message.contains("longer than"), "{e}");
    }
}

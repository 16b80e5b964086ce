//! The expression engine: the anchor's expression language, expr (the `expr-lang` crate, with
//! Go-compatible semantics), and the anchor's function library ([`super::funcs`]).
//!
//! Why expr: the anchor evaluates every `{{ }}` with expr-lang, so its syntax (infix
//! `contains`, `in`, `matches`, `??`, ternaries) and coercions come with it; results are
//! written as the anchor writes them ([`super::gofmt`]: Go's `%v`, lists as JSON).
//!
//! Safety: expressions are bounded in size and nesting BEFORE the parser sees them (the parser
//! is recursive); a token scan ([`super::expr_scan`]) names the variables and functions, and
//! refuses unknown functions and the builtins that loop or allocate without bound (predicates
//! such as `map`/`filter`, `repeat`, ranges); parsing and execution run under `catch_unwind`.
//! Compiled programs are cached by source identity; pure expressions (no `Parent`, `Up`,
//! `uid.New`, no variable read by name, no `dpl.*`) are memoised by the values of the variables
//! they name. A `dpl.*` call that needs a generation is answered between runs of its
//! expression ([`super::jit`]), as variables read by name are.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use expr::{Context, Environment, Program, Value};
use sha2::{Digest, Sha256};

use super::error::{Error, Loc, Result};
use super::jit::{Jit, JitCall};
use super::model::FastMap;
use super::store::ConfigStore;
use super::template::{MAX_EXPR_LEN, Part};
use super::{expr_scan, funcs, gofmt};

/// Deepest bracket nesting accepted in an expression.
pub const MAX_NESTING: usize = 24;
/// Longest run of prefix operators (`!!!!x`) accepted: each is one parser recursion.
const MAX_PREFIX_RUN: usize = 8;
/// Longest value an expression or a template may produce (bytes): stops doubling chains.
pub const MAX_VALUE: usize = 256 * 1024;
/// Most distinct (expression, inputs) results kept.
const MEMO_LIMIT: usize = 200_000;

/// Where an expression was written: what `Parent()`, `Up(n)` and `uid.New()` are relative to.
#[derive(Clone, Debug)]
pub struct CallSite {
    /// Role path the value was written at (a task's own path for class values).
    pub role_path: Arc<str>,
    /// Seed for `uid.New()`: environment id, task path and the expression's location.
    pub uid_seed: UidSeed,
}

/// What `uid.New()` hashes; formatted only when `uid.New()` runs.
#[derive(Clone, Debug)]
pub enum UidSeed {
    Text(String),
    /// The environment id, the path of the task (or role) evaluating, and where the expression
    /// was written (the file's name, not its path: output must not depend on where the
    /// manifests are checked out).
    At {
        environment_id: Arc<str>,
        home: Arc<str>,
        loc: Loc,
    },
}

impl From<&str> for UidSeed {
    fn from(s: &str) -> Self {
        UidSeed::Text(s.to_string())
    }
}

impl UidSeed {
    /// `uid.New()`: [`short_id`] of the seed text, `<environment id>\0<home>\0<file name>:<line>:<col>`
    /// for `At`, hashed piecewise (the text itself is never made).
    pub fn short_id(&self) -> String {
        match self {
            UidSeed::Text(s) => short_id(s),
            UidSeed::At {
                environment_id,
                home,
                loc,
            } => {
                let (mut line, mut col) = (itoa::Buffer::new(), itoa::Buffer::new());
                short_id_of(&[
                    environment_id,
                    "\0",
                    home,
                    "\0",
                    file_name(&loc.file),
                    ":",
                    line.format(loc.line),
                    ":",
                    col.format(loc.col),
                ])
            }
        }
    }
}

/// The last component of a path as written (`a/b/c.yaml` -> `c.yaml`).
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Answers variable lookups during evaluation. `Ok(None)` means undefined.
pub trait Lookup {
    fn lookup(&self, name: &str) -> Result<Option<Arc<str>>>;
}

#[derive(Clone)]
struct Compiled {
    id: usize,
    program: Program,
    /// Variables it names (namespaces excluded), sorted, deduplicated.
    vars: Vec<String>,
    /// No context-dependent functions: the result depends only on `vars`' values.
    pure: bool,
    /// The whole expression is one of the context functions most workflows use per task.
    shortcut: Option<Shortcut>,
}

/// Expressions computed without running the program (same result; where the program would
/// fail, it runs, so that the error is its own).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shortcut {
    /// `uid.New()`
    UidNew,
    /// `Parent().Path` (1) or `Up(n).Path`
    UpPath(usize),
}

impl Shortcut {
    fn of(src: &str) -> Option<Self> {
        let compact: String = src.chars().filter(|c| !c.is_whitespace()).collect();
        if compact == "uid.New()" {
            return Some(Shortcut::UidNew);
        }
        if compact == "Parent().Path" {
            return Some(Shortcut::UpPath(1));
        }
        let digits = compact.strip_prefix("Up(")?.strip_suffix(").Path")?;
        let plain = !digits.is_empty()
            && digits.len() <= 6
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        plain
            .then(|| digits.parse().ok().map(Shortcut::UpPath))
            .flatten()
    }

    /// The value, or `None` where the program must run (it then reports its own error).
    fn value(self, site: &CallSite) -> Option<String> {
        match self {
            Shortcut::UidNew => Some(site.uid_seed.short_id()),
            Shortcut::UpPath(n) => {
                let path = ancestor(&site.role_path, n)?;
                (path.len() <= MAX_VALUE).then_some(path)
            }
        }
    }
}

/// (compiled expression id, values of the variables it names).
type MemoKey = (usize, Vec<Arc<str>>);

/// Address of a source text -> (that text, kept alive; its program).
type ByAddr = FastMap<usize, (Arc<str>, Arc<Compiled>)>;

/// Source text -> its program: shared by the engines of one render (compiled once, whatever
/// thread meets it first).
type Programs = Arc<Mutex<HashMap<Arc<str>, Arc<Compiled>>>>;

/// Most rounds of looking up variables that an expression reads by name.
const MAX_BY_NAME_ROUNDS: usize = 16;

thread_local! {
    static CALL_SITES: RefCell<Vec<CallSite>> = const { RefCell::new(Vec::new()) };
}

/// Which functions an expression may call: outside `call:` roles, or inside (plugin
/// functions too, never run by a render).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Template,
    Call,
}

/// Compiles and evaluates expressions; one per render and thread. The engines of one render
/// share their compiled programs and function library ([`Engine::sharing_programs`]);
/// evaluation caches are per engine.
pub struct Engine {
    env: Arc<Environment<'static>>,
    store: Arc<ConfigStore>,
    jit: Arc<Jit>,
    compiled: Programs,
    /// By the address of the source's shared text; the entry holds that `Arc`, so the address
    /// cannot be reused by another text while the engine lives.
    by_addr: RefCell<ByAddr>,
    memo: RefCell<FastMap<MemoKey, Arc<str>>>,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    /// An engine with an empty configuration store.
    pub fn new() -> Self {
        Self::with_store(Arc::new(ConfigStore::empty()))
    }

    /// An engine whose `inventory.*`, `config.*` and `runtime.*` read `store` (no `jit/`
    /// directory: `dpl.GenerateFromUriOrFallbackToTemplate` always falls back).
    pub fn with_store(store: Arc<ConfigStore>) -> Self {
        Self::with_jit(store, Arc::new(Jit::none()))
    }

    /// [`Engine::with_store`] whose `dpl.*` functions read `jit`'s entries and run its
    /// generator.
    pub fn with_jit(store: Arc<ConfigStore>, jit: Arc<Jit>) -> Self {
        let mut env = Environment::new();
        funcs::register(&mut env, &store, &jit);
        env.add_function("uid__New", |c| {
            if !c.args.is_empty() {
                return Err(expr::Error::ExprError("uid.New takes no argument".into()));
            }
            let site = current_site().ok_or_else(|| expr_error("uid.New: no context"))?;
            Ok(Value::String(site.uid_seed.short_id()))
        });
        env.add_function("NewID", |_| {
            let site = current_site().ok_or_else(|| expr_error("NewID: no context"))?;
            Ok(Value::String(site.uid_seed.short_id()))
        });
        env.add_function("Parent", |c| {
            if !c.args.is_empty() {
                return Err(expr_error("Parent takes no argument"));
            }
            up(1)
        });
        env.add_function("Up", |c| match c.args.as_slice() {
            [Value::Integer(n)] => up(*n),
            _ => Err(expr_error("Up takes one integer argument")),
        });
        Engine {
            env: Arc::new(env),
            store,
            jit,
            compiled: Programs::default(),
            by_addr: RefCell::default(),
            memo: RefCell::default(),
        }
    }

    /// A new engine (for another thread) that reuses the programs this one compiled, and
    /// shares those it compiles from now on.
    pub fn sharing_programs(&self) -> Self {
        Engine {
            env: self.env.clone(),
            store: self.store.clone(),
            jit: self.jit.clone(),
            compiled: self.compiled.clone(),
            by_addr: RefCell::default(),
            memo: RefCell::default(),
        }
    }

    /// The configuration store the engine's functions read.
    pub fn store(&self) -> &Arc<ConfigStore> {
        &self.store
    }

    /// The JIT settings the `dpl.*` functions use (and what they generated).
    pub fn jit(&self) -> &Arc<Jit> {
        &self.jit
    }

    fn compile(&self, src: &Arc<str>, loc: &Loc) -> Result<Arc<Compiled>> {
        let addr = Arc::as_ptr(src).cast::<u8>() as usize;
        if let Some((_, c)) = self.by_addr.borrow().get(&addr) {
            return Ok(c.clone());
        }
        let c = self.compile_text(src, loc)?;
        self.by_addr
            .borrow_mut()
            .insert(addr, (src.clone(), c.clone()));
        Ok(c)
    }

    fn compile_text(&self, src: &Arc<str>, loc: &Loc) -> Result<Arc<Compiled>> {
        // Held while compiling: another thread wanting the same text waits for this program
        // rather than compiling its own. (A panic in the parser is caught below, so the lock
        // is never poisoned by it; should it be, the map is still consistent.)
        let mut compiled = self
            .compiled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = compiled.get(src) {
            return Ok(c.clone());
        }
        let mut c = compile_source(src, Dialect::Template).map_err(|m| Error::new(loc, m))?;
        c.id = compiled.len();
        let c = Arc::new(c);
        compiled.insert(src.clone(), c.clone());
        Ok(c)
    }

    /// Whether an expression's value depends only on the variables it names: no `Parent()`,
    /// `Up(n)`, `uid.New()` or variable read by name, which depend on where it is evaluated.
    pub fn context_free(&self, src: &Arc<str>, loc: &Loc) -> Result<bool> {
        let c = self.compile(src, loc)?;
        Ok(c.pure && c.shortcut.is_none())
    }

    /// Evaluates one expression to its string form (`true`/`false` for booleans).
    ///
    /// The variables it names are looked up first (each lookup is lazy and memoised by the
    /// caller); a failed or undefined one only matters if the expression really reads it, so
    /// an untaken branch naming an undefined variable is harmless.
    pub fn eval(
        &self,
        src: &Arc<str>,
        loc: &Loc,
        lookup: &dyn Lookup,
        site: &CallSite,
    ) -> Result<String> {
        let mut out = String::new();
        self.eval_into(src, loc, lookup, || site.clone(), &mut out)?;
        Ok(out)
    }

    /// [`Engine::eval`], appending to `out`; the call site is only built when the program runs
    /// (a memoised result needs none).
    pub fn eval_into(
        &self,
        src: &Arc<str>,
        loc: &Loc,
        lookup: &dyn Lookup,
        site: impl FnOnce() -> CallSite,
        out: &mut String,
    ) -> Result<()> {
        let c = self.compile(src, loc)?;
        if let Some(sc) = c.shortcut {
            let site = site();
            if let Some(v) = sc.value(&site) {
                out.push_str(&v);
                return Ok(());
            }
            let text = self.run(&c, src, loc, &[], lookup, &site)?;
            out.push_str(&text);
            return Ok(());
        }
        let values: Vec<Result<Option<Arc<str>>>> =
            c.vars.iter().map(|v| lookup.lookup(v)).collect();
        let complete: Option<Vec<Arc<str>>> = match c.pure {
            true => values
                .iter()
                .map(|v| v.as_ref().ok().and_then(|o| o.clone()))
                .collect(),
            false => None,
        };
        let key = match complete {
            Some(vals) => {
                let key = (c.id, vals);
                if let Some(hit) = self.memo.borrow().get(&key) {
                    out.push_str(hit);
                    return Ok(());
                }
                Some(key)
            }
            None => None,
        };
        let text = self.run(&c, src, loc, &values, lookup, &site())?;
        out.push_str(&text);
        if let Some(key) = key {
            let mut memo = self.memo.borrow_mut();
            if memo.len() < MEMO_LIMIT {
                memo.insert(key, Arc::from(text));
            }
        }
        Ok(())
    }

    fn run(
        &self,
        c: &Compiled,
        src: &str,
        loc: &Loc,
        values: &[Result<Option<Arc<str>>>],
        lookup: &dyn Lookup,
        site: &CallSite,
    ) -> Result<String> {
        // Variables that are defined become strings (as in the anchor); an undefined or failed
        // one is left out, and reported only if the program reads it.
        let mut ctx = Context::default();
        let mut failed: Vec<(&str, &Error)> = Vec::new();
        for (name, v) in c.vars.iter().zip(values) {
            match v {
                Ok(Some(v)) => ctx.insert(name.clone(), Value::String(v.to_string())),
                Ok(None) => {}
                Err(e) => failed.push((name, e)),
            }
        }
        let mut by_name: HashMap<String, Option<String>> = HashMap::new();
        let mut generated: HashMap<JitCall, std::result::Result<String, String>> = HashMap::new();
        let mut rounds = 0;
        let result = loop {
            let ((result, wanted), jit_wanted) = funcs::with_jit_answers(generated.clone(), || {
                funcs::with_vars_by_name(by_name.clone(), || {
                    CALL_SITES.with(|s| s.borrow_mut().push(site.clone()));
                    let r = catch_unwind(AssertUnwindSafe(|| self.env.run(&c.program, &ctx)));
                    CALL_SITES.with(|s| s.borrow_mut().pop());
                    r
                })
            });
            if (wanted.is_empty() && jit_wanted.is_empty()) || rounds >= MAX_BY_NAME_ROUNDS {
                break result;
            }
            rounds += 1;
            for name in wanted {
                let v = lookup.lookup(&name)?;
                by_name.insert(name, v.map(|v| v.to_string()));
            }
            for call in jit_wanted {
                let answer = self.answer_jit(&call, lookup, site)?;
                let answer = answer.map_err(|m| format!("{m}{}", chosen_by(&call, c, values)));
                generated.insert(call, answer);
            }
        };
        let value = match result {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                let text = e.to_string();
                // A variable that failed to evaluate: its own error is the cause.
                if let Some(name) = text.strip_prefix("unknown variable: ")
                    && let Some((_, e)) = failed.iter().find(|(n, _)| *n == name.trim())
                {
                    return Err((*e).clone());
                }
                return Err(Error::new(loc, describe(src, &text)));
            }
            Err(_) => {
                return Err(Error::new(
                    loc,
                    format!("expression `{src}` failed to evaluate"),
                ));
            }
        };
        let text = gofmt::result_text(&value);
        if text.len() > MAX_VALUE {
            return Err(Error::new(
                loc,
                format!("expression `{src}` gives a value longer than {MAX_VALUE} bytes"),
            ));
        }
        Ok(text)
    }
}

impl Engine {
    /// Answers a JIT generation an expression asked for, templating the command in the
    /// expression's scope (`lookup`, `site`). Generation nested in a JIT entry is refused.
    fn answer_jit(
        &self,
        call: &JitCall,
        lookup: &dyn Lookup,
        site: &CallSite,
    ) -> Result<std::result::Result<String, String>> {
        thread_local! {
            static ANSWERING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        if ANSWERING.with(|a| a.replace(true)) {
            return Ok(Err(format!(
                "{}: a JIT command may not itself call the JIT functions",
                call.func
            )));
        }
        let template = |text: &str, file: &Arc<str>| self.template_text(text, file, lookup, site);
        let out = self.jit.answer(call, lookup, &template);
        ANSWERING.with(|a| a.set(false));
        out
    }

    /// A text read from `file` (a JIT entry), its `{{ }}` parts evaluated with `lookup`.
    fn template_text(
        &self,
        text: &str,
        file: &Arc<str>,
        lookup: &dyn Lookup,
        site: &CallSite,
    ) -> Result<String> {
        let start = Loc::file_start(file);
        let t = super::template::parse(text, &start, &|o| super::jit::loc_at(file, text, o))?;
        let mut out = String::with_capacity(text.len());
        for part in t.parts.iter() {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Var { name, loc } => match lookup.lookup(name)? {
                    Some(v) => out.push_str(&v),
                    None => return Err(Error::new(loc, format!("unknown variable `{name}`"))),
                },
                Part::Expr { src, loc } => {
                    self.eval_into(src, loc, lookup, || site.clone(), &mut out)?;
                }
            }
            if out.len() > MAX_VALUE {
                return Err(Error::new(
                    &start,
                    format!("value longer than {MAX_VALUE} bytes"),
                ));
            }
        }
        Ok(out)
    }
}

/// Which variable of the expression chose a JIT call's argument, for its error: the one
/// whose value it is, else the expression itself.
fn chosen_by(call: &JitCall, c: &Compiled, values: &[Result<Option<Arc<str>>>]) -> String {
    let arg = call.argument();
    let by = c.vars.iter().zip(values).find_map(|(name, v)| match v {
        Ok(Some(v)) if &**v == arg => Some(name),
        _ => None,
    });
    match by {
        Some(name) if arg.len() <= 200 => format!(" (chosen by the variable `{name}` = `{arg}`)"),
        Some(name) => format!(" (given by the variable `{name}`)"),
        None => " (named in the expression itself)".to_string(),
    }
}

/// Checks and compiles one expression (no caching); the error is the message alone.
fn compile_source(src: &str, dialect: Dialect) -> std::result::Result<Compiled, String> {
    check_shape(src)?;
    let known: &dyn Fn(&str) -> bool = match dialect {
        Dialect::Template => &funcs::known,
        Dialect::Call => &funcs::known_in_call,
    };
    let scan = expr_scan::scan(src, known).map_err(|m| format!("expression `{src}`: {m}"))?;
    let parsed = catch_unwind(AssertUnwindSafe(|| expr::compile(&scan.rewritten)));
    let program = match parsed {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            let msg = e.to_string();
            let first = msg
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with("-->") && !l.starts_with('|'))
                .unwrap_or("syntax error")
                .to_string();
            return Err(format!("expression `{src}` does not parse: {first}"));
        }
        Err(_) => return Err(format!("expression `{src}` does not parse")),
    };
    refuse_unbounded(&program).map_err(|m| format!("expression `{src}`: {m}"))?;
    let contextual = scan.funcs.iter().any(|f| {
        matches!(f.as_str(), "Parent" | "Up" | "uid.New" | "NewID")
            || funcs::READS_VARIABLES.contains(&f.as_str())
            || funcs::JIT_FUNCTIONS.contains(&f.as_str())
    });
    let shortcut = match scan.vars.is_empty() {
        true => Shortcut::of(src),
        false => None,
    };
    Ok(Compiled {
        id: 0,
        program,
        vars: scan.vars,
        pure: !contextual,
        shortcut,
    })
}

/// What the parsed program may not hold, however it was written (spacing, comments, method or
/// pipe syntax): a predicate (a closure the engine runs per element: `map`, `filter`,
/// `all`, `existsOne`, ... nest into unbounded work), a range (`a..b` builds the whole list)
/// or a method call (the anchor's language has none; namespaced functions are rewritten to
/// plain calls before parsing). The engine keeps its syntax tree private, so the check reads
/// the tree's debug form, which names every node kind.
fn refuse_unbounded(program: &Program) -> std::result::Result<(), String> {
    let tree = format!("{program:?}");
    for (marker, what) in [
        (
            "predicate: Some(",
            "a predicate (map, filter, all, any, existsOne, ...)",
        ),
        ("Range(", "a range (a..b)"),
        ("Method {", "a method call"),
    ] {
        if tree.contains(marker) {
            return Err(format!(
                "{what} is not accepted: it can loop or allocate without bound (docs/workflow-language.md, \"Limits\")"
            ));
        }
    }
    Ok(())
}

/// Checks that `src` is an expression of the given dialect (parses, names known functions).
pub fn check(src: &str, dialect: Dialect) -> std::result::Result<(), String> {
    compile_source(src, dialect).map(|_| ())
}

fn expr_error(msg: impl Into<String>) -> expr::Error {
    expr::Error::ExprError(msg.into())
}

/// Rejects what could drive the recursive parser too deep, before it runs.
fn check_shape(src: &str) -> std::result::Result<(), String> {
    if src.len() > MAX_EXPR_LEN {
        return Err(format!("expression longer than {MAX_EXPR_LEN} bytes"));
    }
    let (mut depth, mut max_depth, mut run, mut max_run) = (0usize, 0usize, 0usize, 0usize);
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for ch in src.chars() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if ch == '\\' && q != '`' {
                escaped = true;
            } else if ch == q {
                quote = None;
            }
            continue;
        }
        match ch {
            '\'' | '"' | '`' => quote = Some(ch),
            '(' | '[' | '{' => {
                depth += 1;
                max_depth = max_depth.max(depth);
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if matches!(ch, '!' | '-' | '+') {
            run += 1;
            max_run = max_run.max(run);
        } else if !ch.is_whitespace() {
            run = 0;
        }
    }
    if max_depth > MAX_NESTING {
        return Err(format!(
            "expression nested deeper than {MAX_NESTING} brackets"
        ));
    }
    if max_run > MAX_PREFIX_RUN {
        return Err(format!(
            "expression has more than {MAX_PREFIX_RUN} prefix operators in a row"
        ));
    }
    // Operators chain recursively too (`a ? b : c ? d : ...`, `a + b + ...`): bound their count.
    let ops = src
        .matches([
            '?', '+', '&', '|', '=', '<', '>', '.', ',', '*', '/', '%', '^',
        ])
        .count();
    if ops > 256 {
        return Err("expression has too many operators".to_string());
    }
    Ok(())
}

fn describe(src: &str, text: &str) -> String {
    if let Some(name) = text.strip_prefix("unknown variable: ") {
        return format!("unknown variable `{}` in `{src}`", name.trim());
    }
    // Namespaced functions are named as written, not as the engine calls them.
    let text = text.replace(expr_scan::NS_SEP, ".");
    format!("expression `{src}`: {text}")
}

/// Falsy strings, as the anchor's `strings.IsFalsy` (after trimming, any case): empty,
/// `false`, `no`, `n`, `0`, `off`, `none`.
pub fn is_falsy(s: &str) -> bool {
    funcs::is_falsy(s)
}

fn current_site() -> Option<CallSite> {
    CALL_SITES.with(|s| s.borrow().last().cloned())
}

fn up(n: i64) -> std::result::Result<Value, expr::Error> {
    let site = current_site().ok_or_else(|| expr_error("Up: no context"))?;
    let n = usize::try_from(n).map_err(|_| expr_error("Up: negative level"))?;
    let path = ancestor(&site.role_path, n).ok_or_else(|| {
        expr_error(format!(
            "role `{}` has no ancestor {n} levels up",
            site.role_path
        ))
    })?;
    let mut map = expr::__private::IndexMap::new();
    map.insert("Path".to_string(), Value::String(path));
    Ok(Value::Map(map))
}

/// The path `n` levels above `role_path` (`None`: there is none).
fn ancestor(role_path: &str, n: usize) -> Option<String> {
    let segments: Vec<&str> = role_path.split('.').collect();
    if n >= segments.len() {
        return None;
    }
    Some(segments[..segments.len() - n].join("."))
}

/// A short lowercase id (base32 of SHA-256), stable for one seed: what `uid.New()` gives.
pub fn short_id(seed: &str) -> String {
    short_id_of(&[seed])
}

/// [`short_id`] of the concatenation of `parts`.
pub fn short_id_of(parts: &[&str]) -> String {
    const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
    }
    let digest = h.finalize();
    let mut bits: u64 = 0;
    for b in &digest[..8] {
        bits = (bits << 8) | u64::from(*b);
    }
    let id: [u8; 12] = std::array::from_fn(|i| ALPHABET[((bits >> (i * 5)) & 31) as usize]);
    // ASCII, so valid UTF-8 as it is (no replacement ever happens).
    String::from_utf8_lossy(&id).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_of_one_render_compile_a_text_once() {
        let file: Arc<str> = Arc::from("f.yaml");
        let loc = Loc::new(&file, 1, 1);
        let main = Engine::new();
        let other = main.sharing_programs();
        // Compiled on another thread, by an engine sharing the main one's programs.
        let there = std::thread::scope(|s| {
            s.spawn(move || {
                other
                    .compile(&Arc::from("a + b"), &loc)
                    .map_err(|e| e.to_string())
            })
            .join()
            .unwrap()
        })
        .unwrap();
        let loc = Loc::new(&file, 1, 1);
        let here = main.compile(&Arc::from("a + b"), &loc).unwrap();
        assert!(Arc::ptr_eq(&there, &here), "the same program");
        let apart = Engine::new().compile(&Arc::from("a + b"), &loc).unwrap();
        assert!(
            !Arc::ptr_eq(&apart, &here),
            "another render compiles its own"
        );
    }

    #[test]
    fn a_uid_is_the_short_id_of_its_seed_text() {
        let seed = UidSeed::At {
            environment_id: "E1".into(),
            home: "w.host-flp001.stfb".into(),
            loc: Loc {
                file: "/some/dir/readout.yaml".into(),
                line: 12,
                col: 345,
            },
        };
        let want = short_id("E1\0w.host-flp001.stfb\0readout.yaml:12:345");
        assert_eq!(seed.short_id(), want);
        assert_eq!(UidSeed::from("x").short_id(), short_id("x"));
        assert_ne!(short_id("x"), short_id("y"));
        assert_eq!(short_id_of(&["a", "bc"]), short_id("abc"));
        assert!(want.len() == 12 && want.bytes().all(|b| b.is_ascii_alphanumeric()));
    }

    struct Vars(Vec<(&'static str, &'static str)>);
    impl Lookup for Vars {
        fn lookup(&self, name: &str) -> Result<Option<Arc<str>>> {
            Ok(self
                .0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| Arc::from(*v)))
        }
    }

    fn eval(src: &str, vars: &Vars) -> Result<String> {
        let f: Arc<str> = Arc::from("t.yaml");
        let site = CallSite {
            role_path: Arc::from("a.b.c"),
            uid_seed: "seed".into(),
        };
        Engine::new().eval(&Arc::from(src), &Loc::new(&f, 1, 1), vars, &site)
    }

    #[test]
    fn corpus_syntax() {
        let v = Vars(vec![
            ("modulepath", ""),
            ("a", "x"),
            ("b", "y"),
            ("flag", "true"),
            ("sp", " Default "),
        ]);
        assert_eq!(eval("len(modulepath)>0 ? a : b", &v).unwrap(), "y");
        assert_eq!(
            eval("flag == 'true' ? '--d=' +  a : ' '", &v).unwrap(),
            "--d=x"
        );
        assert_eq!(
            eval("!strings.IsFalsy(flag) && a != b", &v).unwrap(),
            "true"
        );
        assert_eq!(
            eval("strings.ToLower(strings.TrimSpace(sp))", &v).unwrap(),
            "default"
        );
        assert_eq!(
            eval("Parent().Path + ':' + Up(2).Path", &v).unwrap(),
            "a.b:a"
        );
        assert_eq!(
            eval("uid.New()", &v).unwrap(),
            eval("uid.New()", &v).unwrap()
        );
    }

    #[test]
    fn shortcuts_match_the_program() {
        let engine = Engine::new();
        let f: Arc<str> = Arc::from("t.yaml");
        let loc = Loc::new(&f, 1, 1);
        for path in ["w.host-a.chain0.stfb", "w", ""] {
            let site = CallSite {
                role_path: Arc::from(path),
                uid_seed: "seed".into(),
            };
            for src in [
                "uid.New()",
                "Parent().Path",
                " Parent( ) . Path ",
                "Up(0).Path",
                "Up(2).Path",
                "Up(9).Path",
            ] {
                let c = engine.compile(&Arc::from(src), &loc).unwrap();
                let sc = c.shortcut.expect(src);
                let by_program = engine.run(&c, src, &loc, &[], &Vars(vec![]), &site);
                match sc.value(&site) {
                    Some(v) => assert_eq!(v, by_program.unwrap(), "{src} at {path:?}"),
                    None => assert!(by_program.is_err(), "{src} at {path:?}"),
                }
            }
        }
        for src in [
            "Up(01).Path",
            "Up(-1).Path",
            "Parent().Path + ''",
            "uid.New() + x",
        ] {
            assert_eq!(Shortcut::of(src), None, "{src}");
        }
    }

    #[test]
    fn errors() {
        let v = Vars(vec![]);
        let e = eval("nope == 'x'", &v).unwrap_err();
        assert!(e.message.contains("unknown variable `nope`"), "{e}");
        let e = eval("a ==", &v).unwrap_err();
        assert!(e.message.contains("does not parse"), "{e}");
        let e = eval(&format!("{}1{}", "(".repeat(100), ")".repeat(100)), &v).unwrap_err();
        assert!(e.message.contains("nested"), "{e}");
        let e = eval("map([1, 2], map([1, 2], #))", &v).unwrap_err();
        assert!(e.message.contains("unknown function `map`"), "{e}");
        assert_eq!(eval("'a.map(b)' + ''", &v).unwrap(), "a.map(b)");
        let e = eval("inventory.DetectorForHost('x')", &v).unwrap_err();
        assert!(e.message.contains("inventory"), "{e}");
        let e = eval(
            "x ? dpl.GenerateFromUri('a') : ''",
            &Vars(vec![("x", "true")]),
        );
        assert!(e.unwrap_err().message.contains("dpl.GenerateFromUri"));
        // An unknown function is an error even in a branch that is not taken.
        let e = eval("false ? nope.Fn() : ''", &v).unwrap_err();
        assert!(e.message.contains("nope.Fn"), "{e}");
    }
}

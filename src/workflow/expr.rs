//! The expression engine: CEL (the `cel` crate) with the functions workflows use.
//!
//! Why CEL: it is the Kubernetes ecosystem's expression language, well kept, and covers the
//! syntax in the corpus (ternary, `== != && || !`, `+` on strings, comparisons, calls, `in`).
//! Added functions: `len`, `strings.IsFalsy`, `strings.ToLower`, `strings.ToUpper`,
//! `strings.TrimSpace`, `uid.New`, `Parent()`, `Up(n)` (maps with `.Path`).
//!
//! Safety: expressions are bounded in size and nesting BEFORE the parser sees them (the parser
//! is recursive), and parsing and execution run under `catch_unwind`. Compiled programs are
//! cached by source identity (the shared text of a template: one lookup by address per use,
//! by text only the first time); pure expressions (no `Parent`, `Up`, `uid.New`) are memoised
//! by the values of the variables they name, since most tasks of a class evaluate the same thing.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use cel::common::value::CowVal;
use cel::context::VariableResolver;
use cel::objects::Map;
use cel::{Context, ExecutionError, FunctionContext, Program, Value};
use sha2::{Digest, Sha256};

use super::error::{Error, Loc, Result};
use super::model::FastMap;
use super::template::MAX_EXPR_LEN;

/// Deepest bracket nesting accepted in an expression.
pub const MAX_NESTING: usize = 24;
/// Longest run of prefix operators (`!!!!x`) accepted: each is one parser recursion.
const MAX_PREFIX_RUN: usize = 8;
/// Longest value an expression or a template may produce (bytes): stops doubling chains.
pub const MAX_VALUE: usize = 256 * 1024;
/// Most distinct (expression, inputs) results kept.
const MEMO_LIMIT: usize = 200_000;

/// Names that are function namespaces, never variables.
const NAMESPACES: &[&str] = &["strings", "uid"];

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

thread_local! {
    static CALL_SITES: RefCell<Vec<CallSite>> = const { RefCell::new(Vec::new()) };
}

/// Compiles and evaluates expressions; one per render and thread. The engines of one render
/// share their compiled programs ([`Engine::sharing_programs`]); evaluation caches are
/// per engine.
pub struct Engine {
    root: Context<'static, 'static>,
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
    pub fn new() -> Self {
        Self::with_programs(Programs::default())
    }

    /// A new engine (for another thread) that reuses the programs this one compiled, and
    /// shares those it compiles from now on.
    pub fn sharing_programs(&self) -> Self {
        Self::with_programs(self.compiled.clone())
    }

    fn with_programs(compiled: Programs) -> Self {
        let mut root = Context::default();
        // Registration only fails on a name clash with the standard library: none of these.
        let _ = root.add_function("len", len);
        let _ = root.add_function("strings.IsFalsy", |s: Arc<String>| is_falsy(&s));
        let _ = root.add_function("strings.ToLower", |s: Arc<String>| s.to_lowercase());
        let _ = root.add_function("strings.ToUpper", |s: Arc<String>| s.to_uppercase());
        let _ = root.add_function("strings.TrimSpace", |s: Arc<String>| s.trim().to_string());
        let _ = root.add_function("uid.New", uid_new);
        let _ = root.add_function("Parent", |ftx: &FunctionContext| up(ftx, 1));
        let _ = root.add_function("Up", |ftx: &FunctionContext, n: i64| up(ftx, n));
        Engine {
            root,
            compiled,
            by_addr: RefCell::default(),
            memo: RefCell::default(),
        }
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
        check_shape(src).map_err(|m| Error::new(loc, m))?;
        let parsed = catch_unwind(AssertUnwindSafe(|| Program::compile(src)));
        let program = match parsed {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                let msg = e.to_string();
                let first = msg
                    .lines()
                    .next()
                    .unwrap_or("syntax error")
                    .trim()
                    .to_string();
                return Err(Error::new(
                    loc,
                    format!("expression `{src}` does not parse: {first}"),
                ));
            }
            Err(_) => {
                return Err(Error::new(
                    loc,
                    format!("expression `{src}` does not parse"),
                ));
            }
        };
        let refs = program.references();
        let mut vars: Vec<String> = refs
            .variables()
            .into_iter()
            .filter(|v| !NAMESPACES.contains(v))
            .map(str::to_string)
            .collect();
        vars.sort();
        vars.dedup();
        let pure = !refs
            .functions()
            .iter()
            .any(|f| matches!(*f, "Parent" | "Up" | "New"));
        let id = compiled.len();
        let shortcut = match vars.is_empty() {
            true => Shortcut::of(src),
            false => None,
        };
        let c = Arc::new(Compiled {
            id,
            program,
            vars,
            pure,
            shortcut,
        });
        compiled.insert(src.clone(), c.clone());
        Ok(c)
    }

    /// Whether an expression's value depends only on the variables it names: no `Parent()`,
    /// `Up(n)` or `uid.New()`, which read where it is evaluated.
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
            let text = self.run(&c, src, loc, &[], &site)?;
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
        let text = self.run(&c, src, loc, &values, &site())?;
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
        site: &CallSite,
    ) -> Result<String> {
        let resolver = Resolver {
            names: &c.vars,
            values,
            needed: Mutex::new(None),
        };
        let result = {
            let mut scope = self.root.new_inner_scope();
            scope.set_variable_resolver(&resolver);
            CALL_SITES.with(|s| s.borrow_mut().push(site.clone()));
            let result = catch_unwind(AssertUnwindSafe(|| c.program.execute(&scope)));
            CALL_SITES.with(|s| s.borrow_mut().pop());
            result
        };
        if let Some(inner) = resolver.needed.lock().ok().and_then(|mut g| g.take()) {
            return Err(inner);
        }
        let value = match result {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(Error::new(loc, describe(src, &e))),
            Err(_) => {
                return Err(Error::new(
                    loc,
                    format!("expression `{src}` failed to evaluate"),
                ));
            }
        };
        if let Value::String(text) = &value
            && text.len() > MAX_VALUE
        {
            return Err(Error::new(
                loc,
                format!("expression `{src}` gives a value longer than {MAX_VALUE} bytes"),
            ));
        }
        to_text(&value).ok_or_else(|| {
            Error::new(
                loc,
                format!(
                    "expression `{src}` gives {}, expected a string, number or boolean",
                    type_name(&value)
                ),
            )
        })
    }
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
            } else if ch == '\\' {
                escaped = true;
            } else if ch == q {
                quote = None;
            }
            continue;
        }
        match ch {
            '\'' | '"' => quote = Some(ch),
            '(' | '[' | '{' => {
                depth += 1;
                max_depth = max_depth.max(depth);
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if matches!(ch, '!' | '-') {
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
        .matches(['?', '+', '&', '|', '=', '<', '>', '.', ','])
        .count();
    if ops > 256 {
        return Err("expression has too many operators".to_string());
    }
    // Comprehensions (`.map(x, ...)`, nested) can loop without bound; workflows need none.
    let bare = unquoted(src);
    for m in [
        "map",
        "filter",
        "all",
        "exists",
        "exists_one",
        "transformList",
        "transformMap",
    ] {
        if bare.contains(&format!(".{m}(")) {
            return Err(format!(
                "`{m}` comprehensions are not supported in workflow expressions"
            ));
        }
    }
    Ok(())
}

/// The source with string literals blanked out.
fn unquoted(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for ch in src.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if ch == '\\' {
                    escaped = true;
                } else if ch == q {
                    quote = None;
                }
                out.push(' ');
            }
            None => {
                if ch == '\'' || ch == '"' {
                    quote = Some(ch);
                }
                out.push(ch);
            }
        }
    }
    out
}

fn describe(src: &str, e: &ExecutionError) -> String {
    let text = e.to_string();
    if let Some(name) = text
        .strip_prefix("Undeclared reference to '")
        .and_then(|r| r.split('\'').next())
    {
        return format!("unknown variable or function `{name}` in `{src}`");
    }
    if let Some(name) = text
        .strip_prefix("Function '")
        .and_then(|r| r.split('\'').next())
    {
        return format!("unknown function `{name}` in `{src}`");
    }
    format!("expression `{src}`: {text}")
}

/// Serves the pre-resolved variables; remembers the first failed one the program reads.
struct Resolver<'a> {
    names: &'a [String],
    values: &'a [Result<Option<Arc<str>>>],
    needed: Mutex<Option<Error>>,
}

impl VariableResolver for Resolver<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let i = self.names.iter().position(|n| n == variable)?;
        match self.values.get(i)? {
            Ok(Some(v)) => string_val(v),
            Ok(None) => None,
            Err(e) => {
                if let Ok(mut g) = self.needed.lock()
                    && g.is_none()
                {
                    *g = Some(e.clone());
                }
                None
            }
        }
    }
}

fn string_val<'b>(v: &str) -> Option<CowVal<'b, 'b>> {
    let value = Value::String(Arc::new(v.to_string()));
    value.try_into().ok().map(CowVal::Owned)
}

fn to_text(v: &Value) -> Option<String> {
    Some(match v {
        Value::String(s) => s.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Null => String::new(),
        _ => return None,
    })
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "a list",
        Value::Map(_) => "a map",
        _ => "a value",
    }
}

/// Falsy strings (after trimming, case-insensitive): empty, `false`, `no`, `off`, `0`,
/// `none`, `null`, `nil`.
pub fn is_falsy(s: &str) -> bool {
    matches!(
        s.trim().to_ascii_lowercase().as_str(),
        "" | "false" | "no" | "off" | "0" | "none" | "null" | "nil"
    )
}

fn len(v: Value) -> std::result::Result<i64, ExecutionError> {
    let n = match &v {
        Value::String(s) => s.chars().count(),
        Value::List(l) => l.len(),
        Value::Map(m) => m.map.len(),
        Value::Bytes(b) => b.len(),
        Value::Null => 0,
        _ => {
            return Err(ExecutionError::function_error(
                "len",
                "expects a string, list or map",
            ));
        }
    };
    Ok(i64::try_from(n).unwrap_or(i64::MAX))
}

fn current_site() -> Option<CallSite> {
    CALL_SITES.with(|s| s.borrow().last().cloned())
}

fn uid_new(_ftx: &FunctionContext) -> std::result::Result<Value, ExecutionError> {
    let site =
        current_site().ok_or_else(|| ExecutionError::function_error("uid.New", "no context"))?;
    Ok(Value::String(Arc::new(site.uid_seed.short_id())))
}

fn up(_ftx: &FunctionContext, n: i64) -> std::result::Result<Value, ExecutionError> {
    let site = current_site().ok_or_else(|| ExecutionError::function_error("Up", "no context"))?;
    let n =
        usize::try_from(n).map_err(|_| ExecutionError::function_error("Up", "negative level"))?;
    let path = ancestor(&site.role_path, n).ok_or_else(|| {
        ExecutionError::function_error(
            "Up",
            format!("role `{}` has no ancestor {n} levels up", site.role_path),
        )
    })?;
    let mut map: HashMap<String, Value> = HashMap::new();
    map.insert("Path".to_string(), Value::String(Arc::new(path)));
    Ok(Value::Map(Map::from(map)))
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
                let by_program = engine.run(&c, src, &loc, &[], &site);
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
        assert!(
            e.message.contains("unknown variable or function `nope`"),
            "{e}"
        );
        let e = eval("a ==", &v).unwrap_err();
        assert!(e.message.contains("does not parse"), "{e}");
        let e = eval(&format!("{}1{}", "(".repeat(100), ")".repeat(100)), &v).unwrap_err();
        assert!(e.message.contains("nested"), "{e}");
        let e = eval("[1, 2].map(x, [1, 2].map(y, y))", &v).unwrap_err();
        assert!(e.message.contains("comprehensions"), "{e}");
        assert_eq!(eval("'a.map(b)' + ''", &v).unwrap(), "a.map(b)");
        let e = eval("inventory.DetectorForHost(x)", &v).unwrap_err();
        assert!(e.message.contains("inventory"), "{e}");
    }
}

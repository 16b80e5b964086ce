//! The anchor's template function library, by the anchor's names, with its results
//! (docs/workflow-language.md lists each with its counterpart and any difference).
//!
//! Namespaced functions reach the engine as `ns__Fn` ([`super::expr_scan`]). The `dpl.*`
//! functions read the repository's `jit/` entries and fall back to workflow templates as the
//! anchor does; generating from an entry needs a site's generator ([`super::jit`]).
//! `odc.GenerateEPN*` need the experiment's own software: known but unavailable, calling one
//! is an error naming it. Integration plugin functions (`odc.Configure`,
//! `bookkeeping.StartOfRun`, ...) are known so that `call:` roles parse; they run at their
//! trigger through the integration interface, never inside a render.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use expr::{Environment, Value};

use super::expr_scan::NS_SEP;
use super::gofmt;
use super::jit::{Jit, JitCall, JitWhat};
use super::store::ConfigStore;

/// Functions with the anchor's semantics (namespace, names).
const LIBRARY: &[(&str, &[&str])] = &[
    (
        "strings",
        &[
            "Atoi",
            "Itoa",
            "TrimQuotes",
            "TrimSpace",
            "ToUpper",
            "ToLower",
            "IsTruthy",
            "IsFalsy",
        ],
    ),
    (
        "json",
        &["Unmarshal", "Marshal", "Sort", "Deserialize", "Serialize"],
    ),
    ("uid", &["New"]),
    (
        "util",
        &["PrefixedOverride", "Nullable", "SuffixInRange", "Dump"],
    ),
    ("config", &["Get", "GetLegacy", "Resolve", "ResolvePath"]),
    (
        "inventory",
        &[
            "DetectorForHost",
            "DetectorsForHosts",
            "CRUCardsForHost",
            "EndpointsForCRUCard",
        ],
    ),
    ("runtime", &["Get", "Set"]),
    (
        "dpl",
        &[
            "Generate",
            "GenerateFromUri",
            "GenerateFromUriOrFallbackToTemplate",
        ],
    ),
];

/// Known but needing the experiment's own software: an error when a taken branch calls one.
const UNAVAILABLE: &[(&str, &[&str])] = &[(
    "odc",
    &["GenerateEPNTopologyFullname", "GenerateEPNWorkflowScript"],
)];

/// The JIT functions, by every name they have: their result depends on the `jit/` entries
/// and, where one is generated, on the variables its command names (never memoised, never
/// shared between tasks).
pub const JIT_FUNCTIONS: &[&str] = &[
    "dpl.Generate",
    "dpl.GenerateFromUri",
    "dpl.GenerateFromUriOrFallbackToTemplate",
    "GenerateDplSubworkflow",
    "GenerateDplSubworkflowFromUri",
];

/// The anchor's legacy top-level names, each an alias of a namespaced function.
const LEGACY: &[(&str, &str)] = &[
    ("Atoi", "strings.Atoi"),
    ("Itoa", "strings.Itoa"),
    ("TrimQuotes", "strings.TrimQuotes"),
    ("TrimSpace", "strings.TrimSpace"),
    ("ToUpper", "strings.ToUpper"),
    ("ToLower", "strings.ToLower"),
    ("IsTruthy", "strings.IsTruthy"),
    ("IsFalsy", "strings.IsFalsy"),
    ("FromJson", "json.Unmarshal"),
    ("ToJson", "json.Marshal"),
    ("NewID", "uid.New"),
    ("PrefixedOverride", "util.PrefixedOverride"),
    ("Nullable", "util.Nullable"),
    ("SuffixInRange", "util.SuffixInRange"),
    ("Dump", "util.Dump"),
    ("GetConfig", "config.Get"),
    ("GetConfigLegacy", "config.GetLegacy"),
    ("ResolveConfigPath", "config.ResolvePath"),
    ("DetectorForHost", "inventory.DetectorForHost"),
    ("DetectorsForHosts", "inventory.DetectorsForHosts"),
    ("CRUCardsForHost", "inventory.CRUCardsForHost"),
    ("EndpointsForCRUCard", "inventory.EndpointsForCRUCard"),
    ("GetRuntimeConfig", "runtime.Get"),
    ("GenerateDplSubworkflow", "dpl.Generate"),
    ("GenerateDplSubworkflowFromUri", "dpl.GenerateFromUri"),
];

/// Integration plugins whose functions `call:` roles name (run at their trigger, not here).
pub const PLUGINS: &[&str] = &[
    "bookkeeping",
    "ccdb",
    "dcs",
    "ddsched",
    "kafka",
    "lhc",
    "odc",
    "trg",
    "testplugin",
];

/// Role-context functions of the engine itself (`Parent().Path`, `Up(2).Path`).
const CONTEXT: &[&str] = &["Parent", "Up"];

/// expr-lang's builtins that workflows may use. Those taking predicates (`map`, `filter`,
/// `all`, ...) and `repeat` are left out: they can loop or allocate without bound.
const BUILTINS: &[&str] = &[
    "len",
    "abs",
    "ceil",
    "floor",
    "round",
    "int",
    "float",
    "string",
    "trim",
    "trimPrefix",
    "trimSuffix",
    "upper",
    "lower",
    "split",
    "splitAfter",
    "replace",
    "indexOf",
    "lastIndexOf",
    "hasPrefix",
    "hasSuffix",
    "max",
    "min",
    "first",
    "last",
    "get",
    "keys",
    "values",
    "join",
    "reverse",
    "sort",
    "type",
    "concat",
    "flatten",
    "uniq",
];

/// Functions whose result depends on variables they read by name at run time (not on their
/// arguments alone): never memoised, never shared between tasks.
pub const READS_VARIABLES: &[&str] = &["util.PrefixedOverride", "PrefixedOverride"];

/// Whether `name` (as written: `strings.IsFalsy`, `len`) is a function a workflow may call
/// outside a `call:` role.
pub fn known(name: &str) -> bool {
    match name.split_once('.') {
        Some((ns, f)) => LIBRARY
            .iter()
            .chain(UNAVAILABLE)
            .any(|(n, fs)| *n == ns && fs.contains(&f)),
        None => {
            BUILTINS.contains(&name)
                || CONTEXT.contains(&name)
                || LEGACY.iter().any(|(l, _)| *l == name)
        }
    }
}

/// Whether `name` may be called in a `call:` role's `func` (plugin functions too).
pub fn known_in_call(name: &str) -> bool {
    known(name)
        || name
            .split_once('.')
            .is_some_and(|(ns, f)| PLUGINS.contains(&ns) && !f.is_empty())
}

/// The engine's name of a function written `name`.
fn engine_name(name: &str) -> String {
    name.replacen('.', NS_SEP, 1)
}

type Fail = expr::Error;

/// One library function over its arguments.
type LibFn = Box<dyn Fn(&[Value]) -> Result<Value, Fail> + Send + Sync>;

fn fail(msg: impl Into<String>) -> Fail {
    expr::Error::ExprError(msg.into())
}

/// One string argument, as the anchor's Go signatures take it.
fn string_arg(name: &str, args: &[Value], i: usize) -> Result<String, Fail> {
    match args.get(i) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(fail(format!(
            "{name}: argument {} must be a string, got {}",
            i + 1,
            gofmt::percent_v(other)
        ))),
        None => Err(fail(format!("{name}: missing argument {}", i + 1))),
    }
}

/// Exactly `n` arguments, all strings.
fn string_args(name: &str, args: &[Value], n: usize) -> Result<Vec<String>, Fail> {
    arity(name, args, n)?;
    (0..n).map(|i| string_arg(name, args, i)).collect()
}

fn arity(name: &str, args: &[Value], n: usize) -> Result<(), Fail> {
    if args.len() != n {
        return Err(fail(format!(
            "{name} takes {n} argument(s), got {}",
            args.len()
        )));
    }
    Ok(())
}

/// `strings.IsFalsy`: empty, `false`, `no`, `n`, `0`, `off`, `none` (trimmed, any case).
pub fn is_falsy(s: &str) -> bool {
    matches!(
        s.trim().to_lowercase().as_str(),
        "" | "false" | "no" | "n" | "0" | "off" | "none"
    )
}

/// `strings.IsTruthy`: `true`, `yes`, `y`, `1`, `on`, `ok` (trimmed, any case).
pub fn is_truthy(s: &str) -> bool {
    matches!(
        s.trim().to_lowercase().as_str(),
        "true" | "yes" | "y" | "1" | "on" | "ok"
    )
}

/// `util.SuffixInRange(input, prefix, min, max)`: "true" when `input` is `prefix` followed by
/// a number within [min, max]; "false" otherwise (also when an argument is not a number).
pub fn suffix_in_range(input: &str, prefix: &str, min: &str, max: &str) -> &'static str {
    let Some(rest) = input.strip_prefix(prefix) else {
        return "false";
    };
    if prefix.is_empty() {
        return "false";
    }
    let (Some(id), Some(lo), Some(hi)) = (go_atoi(rest), go_atoi(min), go_atoi(max)) else {
        return "false";
    };
    if lo <= id && id <= hi {
        "true"
    } else {
        "false"
    }
}

/// Go's `strconv.Atoi`: optional sign, decimal digits, nothing else.
fn go_atoi(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The run types the anchor's configuration knows; any other name resolves as `NULL`.
const RUN_TYPES: &[&str] = &[
    "NULL",
    "PHYSICS",
    "TECHNICAL",
    "PEDESTAL",
    "PULSER",
    "LASER",
    "CALIBRATION_ITHR_TUNING",
    "CALIBRATION_VCASN_TUNING",
    "CALIBRATION_THR_SCAN",
    "CALIBRATION_DIGITAL_SCAN",
    "CALIBRATION_ANALOG_SCAN",
    "CALIBRATION_FHR",
    "CALIBRATION_ALPIDE_SCAN",
    "CALIBRATION",
    "COSMICS",
    "SYNTHETIC",
    "NOISE",
    "CALIBRATION_PULSE_LENGTH",
    "CALIBRATION_VRESETD",
    "ANY",
];

// Variables read by name at run time (`util.PrefixedOverride`): the engine fills this map
// and runs the expression again with what a run asked for ([`VarRequests`]).
thread_local! {
    static BY_NAME: RefCell<Option<VarRequests>> = const { RefCell::new(None) };
}

/// Variables a running expression read by name: found values, and names still wanted.
#[derive(Debug, Default)]
pub struct VarRequests {
    pub values: HashMap<String, Option<String>>,
    pub wanted: Vec<String>,
}

/// Runs `f` with `values` as the variables readable by name; returns its result and the
/// names it asked for that were not in `values`.
pub fn with_vars_by_name<T>(
    values: HashMap<String, Option<String>>,
    f: impl FnOnce() -> T,
) -> (T, Vec<String>) {
    BY_NAME.with(|b| {
        *b.borrow_mut() = Some(VarRequests {
            values,
            wanted: Vec::new(),
        })
    });
    let out = f();
    let wanted = BY_NAME.with(|b| b.borrow_mut().take().map(|r| r.wanted).unwrap_or_default());
    (out, wanted)
}

/// A variable by name: `Ok(value)` when known, `Err` when the engine must look it up first.
fn var_by_name(name: &str) -> Result<Option<String>, Fail> {
    BY_NAME.with(|b| {
        let mut b = b.borrow_mut();
        let Some(r) = b.as_mut() else {
            return Err(fail("variables by name are not available here"));
        };
        match r.values.get(name) {
            Some(v) => Ok(v.clone()),
            None => {
                r.wanted.push(name.to_string());
                Err(fail(format!("{WANTED_MARK}{name}")))
            }
        }
    })
}

/// Marks the error of a run that needs more variables (never shown to a user).
pub const WANTED_MARK: &str = "\u{0}wanted:";

/// Marks the error of a run that needs a JIT generation (never shown to a user).
pub const JIT_WANTED_MARK: &str = "\u{0}jit-wanted";

// JIT generations a running expression asked for: the engine answers them between runs
// (templating a JIT entry evaluates other expressions, which cannot happen inside a run).
thread_local! {
    static JIT_RUN: RefCell<Option<JitRequests>> = const { RefCell::new(None) };
}

/// The generations answered so far, and those still wanted.
#[derive(Debug, Default)]
struct JitRequests {
    answers: HashMap<JitCall, Result<String, String>>,
    wanted: Vec<JitCall>,
}

/// Runs `f` with `answers` as the JIT generations known; returns its result and the
/// generations it asked for that were not answered.
pub fn with_jit_answers<T>(
    answers: HashMap<JitCall, Result<String, String>>,
    f: impl FnOnce() -> T,
) -> (T, Vec<JitCall>) {
    JIT_RUN.with(|j| {
        *j.borrow_mut() = Some(JitRequests {
            answers,
            wanted: Vec::new(),
        })
    });
    let out = f();
    let wanted = JIT_RUN.with(|j| j.borrow_mut().take().map(|r| r.wanted).unwrap_or_default());
    (out, wanted)
}

/// The generated workflow's name once the engine answered `call`; until then an error that
/// makes the engine answer it and run the expression again.
fn jit_request(call: JitCall) -> Result<Value, Fail> {
    JIT_RUN.with(|j| {
        let mut j = j.borrow_mut();
        let Some(r) = j.as_mut() else {
            return Err(fail(format!("{}: not available here", call.func)));
        };
        match r.answers.get(&call) {
            Some(Ok(name)) => Ok(Value::String(name.clone())),
            Some(Err(msg)) => Err(fail(msg.clone())),
            None => {
                r.wanted.push(call);
                Err(fail(JIT_WANTED_MARK))
            }
        }
    })
}

/// `dpl.GenerateFromUri(name)` and, with `fallback`, `dpl.GenerateFromUriOrFallbackToTemplate`:
/// a generation of `jit/<name>` where that file exists; else `name` itself (the include then
/// takes `workflows/<name>.yaml`), or, without `fallback`, an error.
fn dpl_from_uri(
    jit: &Jit,
    func: &'static str,
    fallback: bool,
    args: &[Value],
) -> Result<Value, Fail> {
    let uri = string_args(func, args, 1)?.remove(0);
    if uri == "none" {
        return Err(fail(format!(
            "{func}: the DPL workflow is `none` (a workflow name is expected)"
        )));
    }
    match jit.entry(func, &uri) {
        Ok(Some(_)) => jit_request(JitCall {
            func,
            what: JitWhat::Entry(uri),
        }),
        // The anchor falls back whenever `jit/<name>` cannot be read; a name that cannot be
        // an entry is not one either (the include then judges it as a workflow name).
        Ok(None) | Err(_) if fallback => Ok(Value::String(uri)),
        Ok(None) => Err(fail(format!(
            "{func}: no JIT entry {} to read a DPL command from",
            jit.describe_entry(&uri)
        ))),
        Err(e) => Err(fail(e)),
    }
}

/// `util.PrefixedOverride(varname, prefix)`: `<prefix>_<varname>` unless it is absent, blank
/// or `none`; else `varname` under the same rule; else "".
fn prefixed_override(varname: &str, prefix: &str) -> Result<String, Fail> {
    let usable = |v: Option<String>| v.filter(|s| s != "none" && !s.trim().is_empty());
    let prefixed = usable(var_by_name(&format!("{prefix}_{varname}"))?);
    if let Some(p) = prefixed {
        return Ok(p);
    }
    Ok(usable(var_by_name(varname)?).unwrap_or_default())
}

/// Registers the library on an engine's environment; `store` answers `inventory.*`,
/// `config.*` and `runtime.*`, `jit` the `dpl.*` functions.
pub fn register(env: &mut Environment<'static>, store: &Arc<ConfigStore>, jit: &Arc<Jit>) {
    let add = |env: &mut Environment<'static>, name: &'static str, f: LibFn| {
        let f = Arc::new(f);
        let g = f.clone();
        env.add_function(&engine_name(name), move |c| g(&c.args));
        for (legacy, target) in LEGACY {
            if *target == name {
                let h = f.clone();
                env.add_function(legacy, move |c| h(&c.args));
            }
        }
    };
    let s1 = |name: &'static str, f: fn(&str) -> Value| -> LibFn {
        Box::new(move |args: &[Value]| Ok(f(&string_args(name, args, 1)?[0])))
    };
    add(
        env,
        "strings.Atoi",
        s1("strings.Atoi", |s| Value::Integer(go_atoi(s).unwrap_or(0))),
    );
    add(
        env,
        "strings.Itoa",
        Box::new(|args: &[Value]| {
            arity("strings.Itoa", args, 1)?;
            match &args[0] {
                Value::Integer(i) => Ok(Value::String(i.to_string())),
                other => Err(fail(format!(
                    "strings.Itoa: argument must be an integer, got {}",
                    gofmt::percent_v(other)
                ))),
            }
        }),
    );
    add(
        env,
        "strings.TrimQuotes",
        s1("strings.TrimQuotes", |s| s.trim_matches('"').into()),
    );
    add(
        env,
        "strings.TrimSpace",
        s1("strings.TrimSpace", |s| s.trim().into()),
    );
    add(
        env,
        "strings.ToUpper",
        s1("strings.ToUpper", |s| s.to_uppercase().into()),
    );
    add(
        env,
        "strings.ToLower",
        s1("strings.ToLower", |s| s.to_lowercase().into()),
    );
    add(
        env,
        "strings.IsTruthy",
        s1("strings.IsTruthy", |s| is_truthy(s).into()),
    );
    add(
        env,
        "strings.IsFalsy",
        s1("strings.IsFalsy", |s| is_falsy(s).into()),
    );
    let unmarshal: fn(&str) -> Value = |s| match serde_json::from_str::<serde_json::Value>(s) {
        Ok(v) => gofmt::from_json(&v),
        // The anchor logs the error and gives nil.
        Err(_) => Value::Nil,
    };
    add(env, "json.Unmarshal", s1("json.Unmarshal", unmarshal));
    add(env, "json.Deserialize", s1("json.Deserialize", unmarshal));
    let marshal = |args: &[Value]| -> Result<Value, Fail> {
        arity("json.Marshal", args, 1)?;
        Ok(Value::String(gofmt::json(&args[0])))
    };
    add(env, "json.Marshal", Box::new(marshal));
    add(env, "json.Serialize", Box::new(marshal));
    add(
        env,
        "json.Sort",
        Box::new(|args: &[Value]| {
            arity("json.Sort", args, 1)?;
            Ok(match &args[0] {
                Value::Array(items) => {
                    let mut s: Vec<String> = items.iter().map(gofmt::percent_v).collect();
                    s.sort();
                    Value::Array(s.into_iter().map(Value::String).collect())
                }
                other => other.clone(),
            })
        }),
    );
    add(
        env,
        "util.PrefixedOverride",
        Box::new(|args: &[Value]| {
            let a = string_args("util.PrefixedOverride", args, 2)?;
            prefixed_override(&a[0], &a[1]).map(Value::String)
        }),
    );
    add(
        env,
        "util.Nullable",
        Box::new(|args: &[Value]| {
            arity("util.Nullable", args, 1)?;
            Ok(match &args[0] {
                Value::Nil => Value::String(String::new()),
                other => other.clone(),
            })
        }),
    );
    add(
        env,
        "util.SuffixInRange",
        Box::new(|args: &[Value]| {
            let a = string_args("util.SuffixInRange", args, 4)?;
            Ok(suffix_in_range(&a[0], &a[1], &a[2], &a[3]).into())
        }),
    );
    add(
        env,
        "util.Dump",
        Box::new(|_| {
            Err(fail(
                "util.Dump writes a file on the control host: not available in envbridge",
            ))
        }),
    );

    let st = store.clone();
    add(
        env,
        "inventory.DetectorForHost",
        Box::new(move |args: &[Value]| {
            let host = string_args("inventory.DetectorForHost", args, 1)?.remove(0);
            st.detector_for_host(&host).map(Value::String).map_err(fail)
        }),
    );
    let st = store.clone();
    add(
        env,
        "inventory.DetectorsForHosts",
        Box::new(move |args: &[Value]| {
            let text = string_args("inventory.DetectorsForHosts", args, 1)?.remove(0);
            let hosts: Vec<String> = serde_json::from_str(&text).map_err(|e| {
                fail(format!(
                    "inventory.DetectorsForHosts: `{text}` is not a JSON list of host names: {e}"
                ))
            })?;
            let dets = st.detectors_for_hosts(&hosts).map_err(fail)?;
            Ok(Value::String(gofmt::json(&Value::Array(
                dets.into_iter().map(Value::String).collect(),
            ))))
        }),
    );
    let st = store.clone();
    add(
        env,
        "inventory.CRUCardsForHost",
        Box::new(move |args: &[Value]| {
            let host = string_args("inventory.CRUCardsForHost", args, 1)?.remove(0);
            let cards = st.cru_cards_for_host(&host).map_err(fail)?;
            // Go marshals a nil slice as null.
            Ok(Value::String(if cards.is_empty() {
                "null".to_string()
            } else {
                gofmt::json(&Value::Array(
                    cards.into_iter().map(Value::String).collect(),
                ))
            }))
        }),
    );
    let st = store.clone();
    add(
        env,
        "inventory.EndpointsForCRUCard",
        Box::new(move |args: &[Value]| {
            let a = string_args("inventory.EndpointsForCRUCard", args, 2)?;
            let eps = st.endpoints_for_cru_card(&a[0], &a[1]).map_err(fail)?;
            Ok(Value::String(eps.join(" ")))
        }),
    );
    let st = store.clone();
    add(
        env,
        "config.Resolve",
        Box::new(move |args: &[Value]| {
            let a = string_args("config.Resolve", args, 4)?;
            let rt = if RUN_TYPES.contains(&a[1].as_str()) {
                a[1].as_str()
            } else {
                "NULL"
            };
            st.resolve(&a[0], rt, &a[2], &a[3])
                .map(Value::String)
                .map_err(fail)
        }),
    );
    let st = store.clone();
    add(
        env,
        "config.ResolvePath",
        Box::new(move |args: &[Value]| {
            let path = string_args("config.ResolvePath", args, 1)?.remove(0);
            let parts: Vec<&str> = path.trim().split('/').collect();
            match parts.as_slice() {
                [c, rt, r, entry @ ..] if !entry.is_empty() && RUN_TYPES.contains(rt) => st
                    .resolve(c, rt, r, &entry.join("/"))
                    .map(Value::String)
                    .map_err(fail),
                _ => Err(fail(format!(
                    "config.ResolvePath: `{path}` is not component/RUNTYPE/role/entry"
                ))),
            }
        }),
    );
    for name in ["config.Get", "config.GetLegacy"] {
        let st = store.clone();
        add(
            env,
            name,
            Box::new(move |args: &[Value]| {
                let path = string_args(name, args, 1)?.remove(0);
                match st.get(&format!("o2/components/{}", path.trim())) {
                    Some(n) => Ok(Value::String(n.as_str().unwrap_or_default().to_string())),
                    None => Err(fail(format!(
                        "{name}: no configuration entry o2/components/{path} in {}",
                        st.name()
                    ))),
                }
            }),
        );
    }
    let st = store.clone();
    add(
        env,
        "runtime.Get",
        Box::new(move |args: &[Value]| {
            let a = string_args("runtime.Get", args, 2)?;
            st.runtime_get(&a[0], &a[1])
                .map(Value::String)
                .map_err(fail)
        }),
    );
    add(
        env,
        "runtime.Set",
        Box::new(|_| {
            Err(fail(
                "runtime.Set writes to the configuration store: not available in a render",
            ))
        }),
    );
    for (name, fallback) in [
        ("dpl.GenerateFromUri", false),
        ("dpl.GenerateFromUriOrFallbackToTemplate", true),
    ] {
        let jit = jit.clone();
        add(
            env,
            name,
            Box::new(move |args: &[Value]| dpl_from_uri(&jit, name, fallback, args)),
        );
    }
    add(
        env,
        "dpl.Generate",
        Box::new(|args: &[Value]| {
            let cmd = string_args("dpl.Generate", args, 1)?.remove(0);
            if cmd == "none" {
                return Err(fail(
                    "dpl.Generate: the DPL command is `none` (a command is expected)",
                ));
            }
            jit_request(JitCall {
                func: "dpl.Generate",
                what: JitWhat::Command(cmd),
            })
        }),
    );
    for (ns, fs) in UNAVAILABLE {
        for f in *fs {
            let full = format!("{ns}.{f}");
            let msg = format!(
                "{full} needs the experiment's own software (the anchor's {ns} generator): not available in envbridge"
            );
            env.add_function(&engine_name(&full), move |_| Err(fail(msg.clone())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falsy_and_truthy_as_the_anchor() {
        for s in ["", " ", "false", "No", "n", "0", "OFF", "none"] {
            assert!(is_falsy(s), "{s:?}");
        }
        for s in ["true", "nil", "null", "x"] {
            assert!(!is_falsy(s), "{s:?}");
        }
        for s in ["true", "YES", "y", "1", "on", "ok"] {
            assert!(is_truthy(s), "{s:?}");
        }
        assert!(!is_truthy("false"));
    }

    #[test]
    fn suffix_in_range_as_the_anchor() {
        assert_eq!(
            suffix_in_range("alio2-cr1-flp072", "alio2-cr1-flp", "001", "072"),
            "true"
        );
        assert_eq!(
            suffix_in_range("alio2-cr1-flp073", "alio2-cr1-flp", "001", "072"),
            "false"
        );
        assert_eq!(
            suffix_in_range("other073", "alio2-cr1-flp", "001", "144"),
            "false"
        );
        assert_eq!(suffix_in_range("flpx", "flp", "1", "2"), "false");
        assert_eq!(suffix_in_range("flp1", "flp", "a", "2"), "false");
    }

    #[test]
    fn names() {
        assert!(known("strings.IsFalsy"));
        assert!(known("dpl.GenerateFromUri"));
        assert!(known("len"));
        assert!(known("DetectorForHost"));
        assert!(!known("odc.Configure"));
        assert!(known_in_call("odc.Configure"));
        assert!(!known("map"));
        assert!(!known("strings.Nope"));
        assert!(!known_in_call("nope.Fn"));
    }
}

//! The data flows one way (docs/architecture.md): the pure core has no Kubernetes in it, and
//! no two top-level modules of the library import each other, directly or around a circle.
//! Read from the source text (code only, comments stripped).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules that must not know Kubernetes, nor the CRD types.
const PURE: [&str; 5] = ["model", "workflow", "plan", "roster", "state"];
const KUBERNETES: [&str; 3] = ["kube::", "k8s_openapi::", "crate::crd"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir` (or `dir` itself when it is a file).
fn files(dir: &Path) -> Vec<PathBuf> {
    if dir.is_file() {
        return vec![dir.to_path_buf()];
    }
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            out.extend(files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out
}

/// The code of a file: `//` comments (doc comments included) removed, line by line. A `//`
/// inside a string literal would cut the line short; that only hides text, never adds it.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read");
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The library's top-level modules (what `src/lib.rs` declares), each with its files.
fn modules() -> BTreeMap<String, Vec<PathBuf>> {
    let lib = code(&src().join("lib.rs"));
    let mut out = BTreeMap::new();
    for line in lib.lines() {
        let Some(name) = line.trim().strip_prefix("pub mod ") else {
            continue;
        };
        let name = name.trim_end_matches(';').trim().to_string();
        let dir = src().join(&name);
        let path = if dir.is_dir() {
            dir
        } else {
            src().join(format!("{name}.rs"))
        };
        out.insert(name, files(&path));
    }
    assert!(out.len() > 5, "src/lib.rs lists its modules: {out:?}");
    out
}

/// The top-level modules a piece of code names through `crate::`.
fn imports(code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `envbridge_crate::`
        }
        let rest = &code[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if known.contains(&name) {
            out.insert(name);
        }
        // `crate::{a, b::c}`
        if rest.starts_with('{') {
            let group = &rest[1..rest.find('}').unwrap_or(rest.len())];
            for part in group.split(',') {
                let head = part.trim().split("::").next().unwrap_or("").trim();
                if known.contains(head) {
                    out.insert(head.to_string());
                }
            }
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules();
    let known: BTreeSet<String> = mods.keys().cloned().collect();
    mods.iter()
        .map(|(name, files)| {
            let mut deps = BTreeSet::new();
            for f in files {
                deps.extend(imports(&code(f), &known));
            }
            deps.remove(name);
            (name.clone(), deps)
        })
        .collect()
}

/// A circle through `start`, if any (depth-first).
fn circle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        at: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == at) {
            let mut c = path[i..].to_vec();
            c.push(at.to_string());
            return Some(c);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_string());
        for next in g.get(at).into_iter().flatten() {
            if let Some(c) = visit(g, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(at.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for start in g.keys() {
        if let Some(c) = visit(g, start, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_pure_core_has_no_kubernetes() {
    let mods = modules();
    let mut found = Vec::new();
    for m in PURE {
        let files = mods
            .get(m)
            .unwrap_or_else(|| panic!("src/lib.rs declares no module {m}"));
        for f in files {
            let code = code(f);
            for k in KUBERNETES {
                if code.contains(k) || code.contains(&format!("use {}", k.trim_end_matches("::"))) {
                    found.push(format!("{}: {k}", f.display()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "Kubernetes in the pure core:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_two_top_level_modules_import_each_other() {
    let g = graph();
    eprintln!("{g:#?}");
    if let Some(c) = circle(&g) {
        panic!(
            "modules import each other: {}\ngraph: {g:#?}",
            c.join(" -> ")
        );
    }
    // The reader sees real imports (else the checks above prove nothing).
    assert!(
        g["bridge"].contains("crd") && g["operator"].contains("model"),
        "{g:#?}"
    );
    // What the core may know: the vocabulary, and the layers below it in the flow.
    assert!(g["model"].is_empty(), "model imports {:?}", g["model"]);
    assert!(!g["plan"].contains("crd"), "plan imports crd");
}

#[test]
fn the_checks_see_a_circle_and_an_import() {
    // The checker itself: a circle of three, and imports in every spelling it must catch.
    let g: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), BTreeSet::from([v.to_string()])))
        .collect();
    assert_eq!(circle(&g).map(|c| c.len()), Some(4));
    let known: BTreeSet<String> = ["crd", "plan", "state"].map(String::from).into();
    let seen = imports(
        "use crate::{plan::TaskRef, state};\nfn f(x: crate::crd::Task) {}\nmy_crate::crd",
        &known,
    );
    assert_eq!(seen, known);
}

/// The sibling files of `dir` that a piece of code names through `super::` or
/// `crate::<module>::` (also inside `{...}` groups).
fn sibling_imports(code: &str, module: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let qualified = format!("crate::{module}::");
    heads_after(code, &["super::", qualified.as_str()], known)
}

/// The names in `known` that follow one of `prefixes` in `code` (also inside `{...}` groups);
/// a prefix counts only where it starts a path (`super::super::`, `foo_super::` do not).
fn heads_after(code: &str, prefixes: &[&str], known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for prefix in prefixes {
        for (i, _) in code.match_indices(prefix) {
            if !at_path_start(code, i) {
                continue;
            }
            out.extend(
                path_heads(&code[i + prefix.len()..])
                    .into_iter()
                    .filter(|h| known.contains(*h))
                    .map(str::to_string),
            );
        }
    }
    out
}

/// The first segment of the path that `rest` starts, or of each path of a `{...}` group.
fn path_heads(rest: &str) -> Vec<&str> {
    if let Some(group) = rest.strip_prefix('{') {
        group[..group.find('}').unwrap_or(group.len())]
            .split(',')
            .map(|p| p.trim().split("::").next().unwrap_or("").trim())
            .filter(|h| !h.is_empty())
            .collect()
    } else {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '*'))
            .unwrap_or(rest.len());
        vec![&rest[..end]]
    }
}

/// Whether `code[i..]` starts a path (`super::super::`, `foo_super::` do not).
fn at_path_start(code: &str, i: usize) -> bool {
    !code[..i]
        .chars()
        .next_back()
        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
}

/// Whether `prefix` occurs in `code` where a path starts.
fn starts_path(code: &str, prefix: &str) -> bool {
    code.match_indices(prefix)
        .any(|(i, _)| at_path_start(code, i))
}

/// A file's code before its unit tests (they may use anything).
fn before_tests(f: &Path) -> String {
    let code = code(f);
    code.split("#[cfg(test)]").next().unwrap_or("").to_string()
}

/// The files of a directory module (`dir/mod.rs` and its children), by stem.
fn module_files(dir: &Path) -> BTreeMap<String, PathBuf> {
    files(dir)
        .into_iter()
        .filter(|f| f.parent() == Some(dir))
        .filter_map(|f| Some((f.file_stem()?.to_str()?.to_string(), f.clone())))
        .collect()
}

/// Inside a directory module: which file names which. `mod.rs` names a child by its bare
/// path (`status::`, `use status::{..}`); a child names a sibling through `super::<child>`,
/// and anything else after `super::` is `mod.rs`'s.
fn inner_graph(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = module_files(dir);
    let children: BTreeSet<String> = files.keys().filter(|k| *k != "mod").cloned().collect();
    files
        .iter()
        .map(|(stem, f)| {
            let code = before_tests(f);
            let mut deps = if stem == "mod" {
                children
                    .iter()
                    .filter(|c| starts_path(&code, &format!("{c}::")))
                    .cloned()
                    .collect()
            } else {
                let mut named = heads_after(&code, &["super::"], &children);
                // Any other head after `super::` (`reconcile`, `*`, one inside a group) is
                // mod.rs's own; `super::super::` leaves the directory.
                let to_parent = code.match_indices("super::").any(|(i, _)| {
                    at_path_start(&code, i)
                        && path_heads(&code[i + "super::".len()..])
                            .iter()
                            .any(|h| *h != "super" && !children.contains(*h))
                });
                if to_parent {
                    named.insert("mod".into());
                }
                named
            };
            deps.remove(stem);
            (stem.clone(), deps)
        })
        .collect()
}

#[test]
fn the_operators_files_do_not_import_each_other_around_a_circle() {
    // kube-rs/controller-rs's shape: the runtime builds the one context and runs the
    // controllers; the controllers read the context and never the runtime.
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        sibling_imports(
            "use super::{runtime::Ctx, pod};\nlet x = crate::operator::hooks::gate();\nsuper::super::y",
            "operator",
            &names(&["runtime", "pod", "hooks", "y"]),
        ),
        names(&["runtime", "pod", "hooks"]),
        "the reader of sibling imports"
    );
    // A file or a directory module (`env_controller/`) is one node; a directory's children
    // reach the operator's files only as `crate::operator::` (their `super::` is the
    // directory's `mod.rs`).
    let dir = src().join("operator");
    let mut nodes: BTreeMap<String, Vec<(PathBuf, bool)>> = BTreeMap::new();
    for (stem, f) in module_files(&dir).into_iter().filter(|(s, _)| s != "mod") {
        nodes.insert(stem, vec![(f, true)]);
    }
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("operator dir") {
        let p = entry.expect("entry").path();
        if p.join("mod.rs").is_file() {
            let stem = p
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_string();
            let files = module_files(&p)
                .into_iter()
                .map(|(s, f)| (f, s == "mod"))
                .collect();
            nodes.insert(stem, files);
            dirs.push(p);
        }
    }
    let known: BTreeSet<String> = nodes.keys().cloned().collect();
    let qualified = ["crate::operator::"];
    let g: BTreeMap<String, BTreeSet<String>> = nodes
        .iter()
        .map(|(stem, files)| {
            let mut deps = BTreeSet::new();
            for (f, top) in files {
                let code = before_tests(f);
                deps.extend(if *top {
                    sibling_imports(&code, "operator", &known)
                } else {
                    heads_after(&code, &qualified, &known)
                });
            }
            deps.remove(stem);
            (stem.clone(), deps)
        })
        .collect();
    if let Some(c) = circle(&g) {
        panic!("operator files import each other: {}", c.join(" -> "));
    }
    assert!(
        g["runtime"].contains("env_controller") && g["env_controller"].contains("context"),
        "the reader sees real imports: {g:#?}"
    );
    // Inside each directory module, its files do not import each other around a circle
    // either: `mod.rs` uses its children, they never use it back.
    assert!(!dirs.is_empty(), "the directory modules are seen");
    for d in &dirs {
        let inner = inner_graph(d);
        if let Some(c) = circle(&inner) {
            panic!(
                "{}: files import each other: {}",
                d.display(),
                c.join(" -> ")
            );
        }
        assert!(
            inner["mod"].len() >= 2 && inner.values().all(|deps| !deps.contains("mod")),
            "{}: mod.rs uses its children, none uses mod.rs: {inner:#?}",
            d.display()
        );
    }
}

#[test]
fn the_inner_reader_sees_a_child_using_its_parent() {
    // The checker of a directory module: a child naming `super::reconcile` uses mod.rs.
    let dir = std::env::temp_dir().join(format!("layering-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("mod.rs"),
        "mod a;\nmod b;\nuse a::x;\nuse b::{y};\nfn reconcile() {}\n",
    )
    .expect("write");
    std::fs::write(dir.join("a.rs"), "use super::b::y;\npub fn x() {}\n").expect("write");
    std::fs::write(dir.join("b.rs"), "use super::reconcile;\npub fn y() {}\n").expect("write");
    std::fs::write(dir.join("c.rs"), "use super::{a::x, Ctx};\n").expect("write");
    let g = inner_graph(&dir);
    std::fs::remove_dir_all(&dir).ok();
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(g["mod"], names(&["a", "b"]));
    assert_eq!(g["a"], names(&["b"]));
    assert_eq!(g["b"], names(&["mod"]));
    assert_eq!(
        g["c"],
        names(&["a", "mod"]),
        "a parent's name inside a group counts"
    );
    assert!(circle(&g).is_some(), "mod -> b -> mod is a circle");
}

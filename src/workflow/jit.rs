//! The anchor's just-in-time DPL workflows, the `dpl.*` functions.
//!
//! A workflow repository keeps DPL commands in `jit/<name>` beside `workflows/`.
//! `dpl.GenerateFromUri(name)` and `dpl.GenerateFromUriOrFallbackToTemplate(name)` read
//! `jit/<name>`, `dpl.Generate(command)` takes the command itself; the anchor templates the
//! command in the calling role's variables and runs it with the experiment's software, which
//! writes a workflow template (and its task classes) that the role then includes. When
//! `jit/<name>` cannot be read, the fallback variant gives `name` itself, so the include takes
//! `workflows/<name>.yaml`; `dpl.GenerateFromUri` fails.
//!
//! envbridge cannot run the experiment's software. Where generation is needed, a site may
//! configure a [`Generator`]: a program run with the templated command on its standard input,
//! in an empty directory where it writes the workflow as the anchor's DPL does
//! (`workflows/<name>.yaml`, `tasks/*.yaml`), under a deadline and a bound on what it writes.
//! Without one, generation is an error naming the JIT entry (docs/workflow-language.md).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::error::{Loc, Result};
use super::expr::Lookup;
use super::jit_generator::{read_bounded, run_generator};

/// A generator's default deadline.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);
/// A generator's default bound on what it writes (all files together, bytes).
pub const DEFAULT_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Largest JIT entry read (bytes): the bound of any value.
const MAX_ENTRY: u64 = super::expr::MAX_VALUE as u64;
/// Most files a generator may write.
pub(super) const MAX_FILES: usize = 1000;
/// Most stderr bytes kept for an error message.
pub(super) const STDERR_TAIL: usize = 2048;
/// Most generated workflows kept (shared by the renders of one daemon).
const MAX_CACHED: usize = 256;

/// A site's JIT generator: the program, its deadline and its output bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generator {
    pub program: PathBuf,
    pub deadline: Duration,
    pub max_bytes: usize,
}

impl Generator {
    /// `program` with the default deadline and bound.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Generator {
            program: program.into(),
            deadline: DEFAULT_DEADLINE,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// How renders treat the `dpl.*` functions. Clones share the generated workflows, so a
/// daemon's renders reuse what an earlier one generated (as the anchor reuses its files).
#[derive(Clone, Debug, Default)]
pub struct JitOptions {
    /// The repository's `jit/` directory; default: `jit` beside the workflows directory.
    pub dir: Option<PathBuf>,
    /// Runs where generation is needed; none: generation is an error.
    pub generator: Option<Generator>,
    cache: Arc<Mutex<Cache>>,
}

impl JitOptions {
    pub fn new(dir: Option<PathBuf>, generator: Option<Generator>) -> Self {
        JitOptions {
            dir,
            generator,
            cache: Arc::default(),
        }
    }
}

/// One file a generator wrote: a label for messages, and its text.
#[derive(Clone, Debug)]
pub struct Source {
    pub label: Arc<str>,
    pub text: Arc<str>,
}

/// What one generation gave: the workflow template and the task classes in `tasks/`.
#[derive(Debug)]
pub struct Generated {
    pub name: String,
    pub workflow: Source,
    /// By class name (the file name without `.yaml`, what `load:` names).
    pub classes: Vec<(String, Source)>,
}

#[derive(Debug, Default)]
struct Cache {
    by_name: HashMap<String, Arc<Generated>>,
    order: VecDeque<String>,
}

/// A generation a `dpl.*` call asked for, answered by the engine between runs of the
/// expression ([`Jit::answer`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JitCall {
    /// The function as written (`dpl.GenerateFromUri`).
    pub func: &'static str,
    pub what: JitWhat,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum JitWhat {
    /// `jit/<name>` exists.
    Entry(String),
    /// A DPL command given inline (`dpl.Generate`).
    Command(String),
}

impl JitCall {
    /// The function's argument.
    pub fn argument(&self) -> &str {
        match &self.what {
            JitWhat::Entry(s) | JitWhat::Command(s) => s,
        }
    }
}

/// One render's JIT settings.
#[derive(Debug, Default)]
pub struct Jit {
    dir: Option<PathBuf>,
    generator: Option<Generator>,
    cache: Arc<Mutex<Cache>>,
}

/// Whether `name` may name a JIT entry (a file directly in `jit/`).
pub(super) fn is_entry_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0'])
        && name.trim() == name
}

impl Jit {
    /// No `jit/` directory and no generator.
    pub fn none() -> Self {
        Jit::default()
    }

    /// The settings of a render whose includes come from `workflows_dir`.
    pub fn new(opts: &JitOptions, workflows_dir: &Path) -> Self {
        let dir = opts.dir.clone().or_else(|| {
            Some(match workflows_dir.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.join("jit"),
                // `workflows` (relative): its parent is the current directory.
                Some(_) => PathBuf::from("jit"),
                // The current directory itself, or `/`.
                None => workflows_dir.join("..").join("jit"),
            })
        });
        Jit {
            dir,
            generator: opts.generator.clone(),
            cache: opts.cache.clone(),
        }
    }

    /// `jit/<name>` when it is a file; `None` when it is not there (or not readable as one).
    /// An error when `name` cannot name an entry.
    pub fn entry(&self, func: &str, name: &str) -> std::result::Result<Option<PathBuf>, String> {
        if !is_entry_name(name) {
            return Err(format!(
                "{func}: `{name}` is not the name of a JIT entry (a file in `jit/`)"
            ));
        }
        let Some(dir) = &self.dir else {
            return Ok(None);
        };
        let path = dir.join(name);
        Ok(std::fs::File::open(&path)
            .ok()
            .and_then(|f| f.metadata().ok())
            .filter(|m| m.is_file())
            .map(|_| path))
    }

    /// Where `jit/<name>` would be, for messages.
    pub fn describe_entry(&self, name: &str) -> String {
        match &self.dir {
            Some(d) => format!("`jit/{name}` ({})", d.join(name).display()),
            None => format!("`jit/{name}` (no JIT directory)"),
        }
    }

    /// The workflow generated under `name`, if any.
    pub fn generated(&self, name: &str) -> Option<Arc<Generated>> {
        self.cache.lock().ok()?.by_name.get(name).cloned()
    }

    /// Answers one generation: the name of the generated workflow, or why there is none
    /// (`Ok(Err)`, the `dpl.*` call's error). `template` evaluates a text in the calling
    /// role's scope (the anchor templates the command before running it); an error of that
    /// is an input error of its own (`Err`), naming the JIT entry's line and column.
    pub fn answer(
        &self,
        call: &JitCall,
        lookup: &dyn Lookup,
        template: &dyn Fn(&str, &Arc<str>) -> Result<String>,
    ) -> Result<std::result::Result<String, String>> {
        let Some(generator) = &self.generator else {
            return Ok(Err(self.unavailable(call)));
        };
        let (text, file): (String, Arc<str>) = match &call.what {
            JitWhat::Entry(name) => {
                let Some(path) = self.dir.as_ref().map(|d| d.join(name)) else {
                    return Ok(Err(self.unavailable(call)));
                };
                match read_bounded(&path, MAX_ENTRY) {
                    Ok(t) => (t, Arc::from(path.display().to_string())),
                    Err(e) => {
                        return Ok(Err(format!(
                            "{}: cannot read the JIT entry {}: {e}",
                            call.func,
                            self.describe_entry(name)
                        )));
                    }
                }
            }
            JitWhat::Command(cmd) => (cmd.clone(), Arc::from(format!("{}(...)", call.func))),
        };
        let command = template(&text, &file)?;
        let env_vars = lookup
            .lookup("jit_env_vars")?
            .map(|v| v.to_string())
            .unwrap_or_default();
        let name = generated_name(&command, &env_vars);
        if self.generated(&name).is_some() {
            return Ok(Ok(name));
        }
        let entry = match &call.what {
            JitWhat::Entry(n) => n.as_str(),
            JitWhat::Command(_) => "",
        };
        match run_generator(generator, &name, entry, &command, &env_vars) {
            Ok(g) => {
                let mut cache = self
                    .cache
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if cache.order.len() >= MAX_CACHED
                    && let Some(old) = cache.order.pop_front()
                {
                    cache.by_name.remove(&old);
                }
                cache.order.push_back(name.clone());
                cache.by_name.insert(name.clone(), Arc::new(g));
                Ok(Ok(name))
            }
            Err(e) => Ok(Err(format!(
                "{}: the JIT generator {} failed for {}: {e}",
                call.func,
                generator.program.display(),
                match &call.what {
                    JitWhat::Entry(n) => self.describe_entry(n),
                    JitWhat::Command(_) => "the DPL command given".to_string(),
                }
            ))),
        }
    }

    /// Why a generation cannot happen without a generator.
    fn unavailable(&self, call: &JitCall) -> String {
        let what = match &call.what {
            JitWhat::Entry(n) => format!("the JIT entry {}", self.describe_entry(n)),
            JitWhat::Command(_) => "the DPL command given".to_string(),
        };
        format!(
            "{}: {what} needs generation by the experiment's own software (the anchor runs the DPL command to write the workflow), and no JIT generator is configured (`envbridge render --jit-generator`, the daemon's `jit-generator`)",
            call.func
        )
    }
}

/// `jit-<40 hex>` of the templated command and the JIT environment variables (the anchor
/// hashes these, with its software's versions, into `jit-<sha1>`).
pub fn generated_name(command: &str, env_vars: &str) -> String {
    let mut h = Sha256::new();
    h.update(command.as_bytes());
    h.update([0]);
    h.update(env_vars.as_bytes());
    format!("jit-{}", &hex::encode(h.finalize())[..40])
}

/// The location of byte `offset` of a text read from `file` (line and column, 1-based).
pub fn loc_at(file: &Arc<str>, text: &str, offset: usize) -> Loc {
    let upto = &text.as_bytes()[..offset.min(text.len())];
    let line = upto.iter().filter(|b| **b == b'\n').count() + 1;
    let col = upto.iter().rev().take_while(|b| **b != b'\n').count() + 1;
    Loc::new(file, line, col)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::jit_generator::run_generator;
    use std::time::Instant;

    struct NoVars;
    impl Lookup for NoVars {
        fn lookup(&self, _: &str) -> Result<Option<Arc<str>>> {
            Ok(None)
        }
    }

    fn script(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("gen.sh");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn tmp(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("envbridge-jit-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entry_call(name: &str) -> JitCall {
        JitCall {
            func: "dpl.GenerateFromUri",
            what: JitWhat::Entry(name.to_string()),
        }
    }

    #[test]
    fn entries_are_files_directly_in_jit() {
        let d = tmp("entries");
        std::fs::create_dir_all(d.join("jit/sub")).unwrap();
        std::fs::create_dir_all(d.join("workflows")).unwrap();
        std::fs::write(d.join("jit/minimal"), "o2-dpl-raw-proxy -b").unwrap();
        let jit = Jit::new(&JitOptions::default(), &d.join("workflows"));
        let f = "dpl.GenerateFromUri";
        assert_eq!(
            jit.entry(f, "minimal").unwrap(),
            Some(d.join("jit/minimal"))
        );
        assert_eq!(jit.entry(f, "absent").unwrap(), None);
        // A directory is no entry (the anchor's read fails, so it falls back).
        assert_eq!(jit.entry(f, "sub").unwrap(), None);
        for bad in ["", "../workflows", "sub/x", ".hidden", " x"] {
            assert!(jit.entry(f, bad).is_err(), "{bad:?}");
        }
        // An explicit directory wins over the default.
        let other = Jit::new(
            &JitOptions::new(Some(d.join("jit/sub")), None),
            &d.join("workflows"),
        );
        assert_eq!(other.entry(f, "minimal").unwrap(), None);
        assert_eq!(Jit::none().entry(f, "minimal").unwrap(), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn without_a_generator_the_error_names_the_entry() {
        let d = tmp("nogen");
        let jit = Jit::new(
            &JitOptions::new(Some(d.join("jit")), None),
            &d.join("workflows"),
        );
        let templ = |t: &str, _: &Arc<str>| Ok(t.to_string());
        let e = jit
            .answer(&entry_call("tpc-idc-a"), &NoVars, &templ)
            .unwrap()
            .unwrap_err();
        assert!(e.contains("`jit/tpc-idc-a`"), "{e}");
        assert!(e.contains("no JIT generator is configured"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_generator_writes_the_workflow_and_its_classes() {
        let d = tmp("gen");
        std::fs::create_dir_all(d.join("jit")).unwrap();
        std::fs::write(d.join("jit/e1"), "cmd --host {{ it }}").unwrap();
        let prog = script(
            &d,
            r#"cmd=$(cat)
printf 'name: x\nroles:\n  - name: p\n    task:\n      load: %s-proxy\n' "$ENVBRIDGE_JIT_NAME" > "workflows/$ENVBRIDGE_JIT_NAME.yaml"
printf 'name: p\ncommand:\n  value: "%s"\n' "$cmd [$ENVBRIDGE_JIT_ENTRY]" > "tasks/$ENVBRIDGE_JIT_NAME-proxy.yaml""#,
        );
        let opts = JitOptions::new(Some(d.join("jit")), Some(Generator::new(prog)));
        let jit = Jit::new(&opts, &d.join("workflows"));
        let templ = |t: &str, _: &Arc<str>| Ok(t.replace("{{ it }}", "flp001"));
        let name = jit
            .answer(&entry_call("e1"), &NoVars, &templ)
            .unwrap()
            .unwrap();
        assert_eq!(name, generated_name("cmd --host flp001", ""));
        let g = jit.generated(&name).expect("kept");
        assert!(g.workflow.text.contains(&format!("load: {name}-proxy")));
        assert_eq!(g.classes.len(), 1);
        assert_eq!(g.classes[0].0, format!("{name}-proxy"));
        assert!(
            g.classes[0].1.text.contains("cmd --host flp001 [e1]"),
            "{}",
            g.classes[0].1.text
        );
        // Another render with the same options reuses it.
        let again = Jit::new(&opts.clone(), &d.join("workflows"));
        assert!(again.generated(&name).is_some());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_generator_is_bounded_in_time_and_output() {
        let d = tmp("bounds");
        let slow = script(&d, "sleep 30");
        let g = Generator {
            program: slow,
            deadline: Duration::from_millis(300),
            max_bytes: 1000,
        };
        let t = Instant::now();
        let e = run_generator(&g, "jit-a", "e", "cmd", "").unwrap_err();
        assert!(e.contains("deadline"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

        let big = script(
            &d,
            r#"head -c 5000 /dev/zero | tr '\0' 'a' > "workflows/$ENVBRIDGE_JIT_NAME.yaml""#,
        );
        let g = Generator {
            program: big,
            deadline: Duration::from_secs(10),
            max_bytes: 1000,
        };
        let e = run_generator(&g, "jit-a", "e", "cmd", "").unwrap_err();
        assert!(e.contains("at most 1000 bytes"), "{e}");

        let failing = script(&d, "echo 'no O2 here' >&2; exit 3");
        let e = run_generator(&Generator::new(failing), "jit-a", "e", "cmd", "").unwrap_err();
        assert!(
            e.contains("exit status: 3") && e.contains("no O2 here"),
            "{e}"
        );

        // What it leaves running is stopped with it: nothing keeps its pipes open.
        let forks = script(
            &d,
            r#"sleep 30 & printf 'name: x\nroles: []\n' > "workflows/$ENVBRIDGE_JIT_NAME.yaml""#,
        );
        let t = Instant::now();
        let g = run_generator(&Generator::new(forks), "jit-a", "e", "cmd", "").unwrap();
        assert!(g.classes.is_empty() && g.workflow.text.contains("roles"));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

        let silent = script(&d, "true");
        let e = run_generator(&Generator::new(silent), "jit-a", "e", "cmd", "").unwrap_err();
        assert!(e.contains("wrote no workflows/jit-a.yaml"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
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

    fn engine(jit: Jit) -> super::super::expr::Engine {
        super::super::expr::Engine::with_jit(
            Arc::new(super::super::store::ConfigStore::empty()),
            Arc::new(jit),
        )
    }

    fn eval(e: &super::super::expr::Engine, src: &str, vars: &Vars) -> Result<String> {
        let f: Arc<str> = Arc::from("w.yaml");
        let site = super::super::expr::CallSite {
            role_path: Arc::from("w.h.dpl"),
            uid_seed: "seed".into(),
        };
        e.eval(&Arc::from(src), &Loc::new(&f, 7, 3), vars, &site)
    }

    #[test]
    fn the_fallback_gives_the_name_where_there_is_no_entry() {
        let d = tmp("fallback");
        std::fs::create_dir_all(d.join("jit")).unwrap();
        std::fs::create_dir_all(d.join("workflows")).unwrap();
        std::fs::write(d.join("jit/minimal-dpl"), "o2-dpl-raw-proxy -b").unwrap();
        let e = engine(Jit::new(&JitOptions::default(), &d.join("workflows")));
        let v = |w: &'static str| Vars(vec![("dpl_workflow", w), ("jit", "true")]);
        let fallback = "jit == 'true' ? dpl.GenerateFromUriOrFallbackToTemplate(dpl_workflow) : ''";
        // No `jit/<name>`: the name itself, which the include takes as `workflows/<name>.yaml`.
        let tpc = v("tpc-idc-sac-full-split");
        assert_eq!(eval(&e, fallback, &tpc).unwrap(), "tpc-idc-sac-full-split");
        // Without the fallback that is an error naming the entry.
        let err = eval(&e, "dpl.GenerateFromUri(dpl_workflow)", &tpc).unwrap_err();
        assert!(
            err.message
                .contains("no JIT entry `jit/tpc-idc-sac-full-split`"),
            "{err}"
        );
        // `jit/<name>` exists: generation, which needs a generator; the error names the entry
        // and the variable that chose it, at the expression's place.
        let err = eval(&e, fallback, &v("minimal-dpl")).unwrap_err();
        assert_eq!((err.loc.line, err.loc.col), (7, 3));
        for want in [
            "the JIT entry `jit/minimal-dpl`",
            "no JIT generator is configured",
            "chosen by the variable `dpl_workflow` = `minimal-dpl`",
        ] {
            assert!(err.message.contains(want), "{want}: {err}");
        }
        let err = eval(&e, "dpl.GenerateFromUri('minimal-dpl')", &tpc).unwrap_err();
        assert!(
            err.message.contains("named in the expression itself"),
            "{err}"
        );
        // The legacy names are the same functions.
        let err = eval(&e, "GenerateDplSubworkflowFromUri('minimal-dpl')", &tpc).unwrap_err();
        assert!(err.message.contains("jit/minimal-dpl"), "{err}");
        let cmd = Vars(vec![("dpl_command", "o2-x | o2-y")]);
        let err = eval(&e, "dpl.Generate(dpl_command)", &cmd).unwrap_err();
        assert!(
            err.message.contains("the DPL command given") && err.message.contains("`dpl_command`"),
            "{err}"
        );
        let err = eval(&e, "GenerateDplSubworkflow(dpl_command)", &cmd).unwrap_err();
        assert!(err.message.contains("dpl.Generate"), "{err}");
        // `none` is refused, as the anchor does; an untaken branch runs nothing.
        let err = eval(&e, fallback, &v("none")).unwrap_err();
        assert!(err.message.contains("`none`"), "{err}");
        assert_eq!(
            eval(&e, "false ? dpl.Generate('x') : 'y'", &tpc).unwrap(),
            "y"
        );
        // A name that cannot be an entry is never looked up outside `jit/`.
        std::fs::write(d.join("workflows/secret"), "x").unwrap();
        let err = eval(&e, "dpl.GenerateFromUri('../workflows/secret')", &tpc).unwrap_err();
        assert!(err.message.contains("not the name of a JIT entry"), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_generated_entry_is_templated_in_the_caller_s_variables() {
        let d = tmp("templated");
        std::fs::create_dir_all(d.join("jit")).unwrap();
        std::fs::write(
            d.join("jit/e1"),
            "cmd {{ it }}\n  --port {{ strings.Atoi(port) + 1 }}",
        )
        .unwrap();
        std::fs::write(d.join("jit/bad"), "cmd\n  {{ nope }}").unwrap();
        let prog = script(
            &d,
            r#"cat > /dev/null; printf 'name: x\nroles: []\n' > "workflows/$ENVBRIDGE_JIT_NAME.yaml""#,
        );
        let jit = Jit::new(
            &JitOptions::new(Some(d.join("jit")), Some(Generator::new(prog))),
            &d.join("workflows"),
        );
        let e = engine(jit);
        let vars = Vars(vec![("it", "flp001"), ("port", "7")]);
        let name = eval(&e, "dpl.GenerateFromUri('e1')", &vars).unwrap();
        assert_eq!(name, generated_name("cmd flp001\n  --port 8", ""));
        assert!(e.jit().generated(&name).is_some());
        // The anchor's JIT environment variables take part in the name.
        let with_env = Vars(vec![
            ("it", "flp001"),
            ("port", "7"),
            ("jit_env_vars", "A=1"),
        ]);
        let other = eval(&e, "dpl.GenerateFromUri('e1')", &with_env).unwrap();
        assert_eq!(other, generated_name("cmd flp001\n  --port 8", "A=1"));
        // An undefined variable in the entry: its own line and column.
        let err = eval(&e, "dpl.GenerateFromUri('bad')", &vars).unwrap_err();
        assert!(err.loc.file.ends_with("jit/bad"), "{err}");
        assert_eq!((err.loc.line, err.loc.col), (2, 3), "{err}");
        assert!(err.message.contains("unknown variable `nope`"), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn locations_in_an_entry() {
        let f: Arc<str> = Arc::from("jit/x");
        let l = loc_at(&f, "ab\ncd {{ x }}", 6);
        assert_eq!((l.line, l.col), (2, 4));
    }
}

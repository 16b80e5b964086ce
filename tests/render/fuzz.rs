//! Fuzzing: random and mutated input never panics.

use super::*;

/// A small deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, src: &[u8]) -> Vec<u8> {
    const PIECES: &[&[u8]] = &[
        b"{{",
        b"}}",
        b"[",
        b"]",
        b"{",
        b"}",
        b":",
        b"- ",
        b"\n",
        b"  ",
        b"!public ",
        b"&a ",
        b"*a",
        b"'",
        b"\"",
        b"((((",
        b"!!!!",
        b"? ",
        b"\t",
        b"roles:",
        b"task:",
        b"load: ",
        b"\xff",
        b"#",
    ];
    let mut v = src.to_vec();
    for _ in 0..1 + rng.below(8) {
        let at = rng.below(v.len() + 1);
        match rng.below(4) {
            0 => {
                let p = PIECES[rng.below(PIECES.len())];
                v.splice(at..at, p.iter().copied());
            }
            1 if !v.is_empty() => {
                let end = (at + rng.below(16)).min(v.len());
                v.drain(at.min(end)..end);
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = (rng.next() & 0xff) as u8;
            }
            _ => {
                let end = (at + rng.below(32)).min(v.len());
                let chunk = v[at.min(end)..end].to_vec();
                v.splice(at..at, chunk);
            }
        }
    }
    v
}

#[test]
fn fuzz_loader_never_panics() {
    let c = corpus().join("aliecs");
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    for dir in [
        "controlworkflows/tasks",
        "controlworkflows/workflows",
        "control-operator/control-workflows",
    ] {
        for f in yaml_files(&c.join(dir)) {
            seeds.push(std::fs::read(f).unwrap());
        }
    }
    for f in yaml_files(&repo("manifests/control-workflows/workflows")) {
        seeds.push(std::fs::read(f).unwrap());
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let file: std::sync::Arc<str> = std::sync::Arc::from("fuzz.yaml");
    for i in 0..3000 {
        let seed = &seeds[i % seeds.len()];
        let input = if i % 10 == 0 {
            (0..rng.below(300))
                .map(|_| (rng.next() & 0xff) as u8)
                .collect()
        } else {
            mutate(&mut rng, seed)
        };
        let text = String::from_utf8_lossy(&input);
        let r = std::panic::catch_unwind(|| {
            if let Ok(node) = yaml::parse(&file, &text) {
                let _ = load::class_from_node(&node, "fuzz");
            }
        });
        assert!(r.is_ok(), "loader panicked on input #{i}: {text:?}");
    }
}

#[test]
fn fuzz_renderer_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    for f in yaml_files(&repo("manifests/control-workflows/tasks")) {
        std::fs::copy(&f, tasks.join(f.file_name().unwrap())).unwrap();
    }
    let seed = std::fs::read(repo(
        "manifests/control-workflows/workflows/readout-dataflow.yaml",
    ))
    .unwrap();
    let mut rng = Rng(42);
    for i in 0..400 {
        let wf = dir.path().join("w.yaml");
        std::fs::write(&wf, mutate(&mut rng, &seed)).unwrap();
        let req = RenderRequest {
            sources: Sources {
                tasks_dir: tasks.clone(),
                workflows_dir: None,
                defaults_files: vec![repo("manifests/site/local.yaml")],
            },
            workflow: wf,
            sets: vec![("hosts".into(), r#"["flp001","flp002"]"#.into())],
            env_id: Some("F".into()),
            ..RenderRequest::default()
        };
        let r = std::panic::catch_unwind(|| envbridge::objects::render(&req).map(|_| ()));
        assert!(r.is_ok(), "render panicked on mutation #{i}");
        if let Ok(Err(e)) = r {
            let s = e.to_string();
            let mut parts = s.splitn(4, ':');
            let (_, line, col) = (parts.next(), parts.next(), parts.next());
            assert!(
                line.is_some_and(|l| l.parse::<u32>().is_ok()),
                "no FILE:LINE:COLUMN in `{s}`"
            );
            assert!(
                col.is_some_and(|c| c.parse::<u32>().is_ok()),
                "no FILE:LINE:COLUMN in `{s}`"
            );
        }
    }
}

struct NoVars;
impl Lookup for NoVars {
    fn lookup(&self, name: &str) -> envbridge::workflow::Result<Option<std::sync::Arc<str>>> {
        Ok((name.len() < 3).then(|| std::sync::Arc::from("v")))
    }
}

#[test]
fn fuzz_expressions_never_panic() {
    const TOKENS: &[&str] = &[
        "a",
        "bb",
        "'s'",
        "\"t\"",
        "1",
        "2.5",
        "true",
        "null",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        "?",
        ":",
        "==",
        "!=",
        "&&",
        "||",
        "!",
        "+",
        "-",
        "*",
        "/",
        "%",
        "<",
        ">=",
        ".",
        ",",
        "in",
        "len(",
        "strings.IsFalsy(",
        "strings.ToLower(",
        "Up(",
        "Parent()",
        ".Path",
        "uid.New()",
        "size(",
        "has(",
        "x.map(",
        "e",
        "1/0",
        "'\\",
        "\\u",
        "18446744073709551616",
    ];
    let engine = Engine::new();
    let file: std::sync::Arc<str> = std::sync::Arc::from("fuzz.yaml");
    let loc = envbridge::workflow::Loc::new(&file, 1, 1);
    let site = CallSite {
        role_path: std::sync::Arc::from("w.a.b"),
        uid_seed: "s".into(),
    };
    let mut rng = Rng(7);
    for i in 0..20_000 {
        let n = 1 + rng.below(24);
        let src: String = (0..n)
            .map(|_| TOKENS[rng.below(TOKENS.len())])
            .collect::<Vec<_>>()
            .join(" ");
        let src: std::sync::Arc<str> = std::sync::Arc::from(src);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = engine.eval(&src, &loc, &NoVars, &site);
        }));
        assert!(r.is_ok(), "evaluator panicked on #{i}: {src}");
    }
    // Hostile nesting is refused before the parser sees it.
    for deep in [
        "(".repeat(5000),
        "!".repeat(5000),
        "[".repeat(5000),
        format!("{}a", "-".repeat(5000)),
    ] {
        let e = engine
            .eval(&std::sync::Arc::from(deep), &loc, &NoVars, &site)
            .unwrap_err();
        assert!(e.to_string().starts_with("fuzz.yaml:1:1: "), "{e}");
    }
}

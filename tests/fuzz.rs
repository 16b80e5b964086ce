//! Property-based fuzzing (proptest, stable Rust) of what takes outside input: the YAML
//! loader, the expression engine and the whole render. Every generated input must end in a
//! value or an error, never a panic, a hang or unbounded memory; each case runs under a
//! deadline. The budget is fixed for `cargo test` (`PROPTEST_CASES`, default below);
//! longer: `PROPTEST_CASES=100000 cargo test --release --test fuzz` (docs/security.md).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envbridge::plan::RenderRequest;
use envbridge::workflow::Sources;
use envbridge::workflow::expr::{Dialect, check};
use proptest::prelude::*;

/// Cases per property when PROPTEST_CASES is not set (about a second in all, debug build).
const CASES: u32 = 1000;
/// What one case may take, whatever it is.
const DEADLINE: Duration = Duration::from_secs(20);

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Runs `f` on its own thread; a case that does not end within the deadline fails the test.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("{what}: no result within {DEADLINE:?} (a hang or a panic)"))
}

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// Pieces of YAML, joined at random: structure the loader must handle or refuse.
fn yaml_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("name: w\n".to_string()),
        Just("roles:\n".to_string()),
        Just("  - name: a\n".to_string()),
        Just("    task:\n      load: t\n".to_string()),
        Just("defaults:\n  x: !public\n    value: \"1\"\n".to_string()),
        Just("&a [*a]\n".to_string()),
        Just("{{{{\n".to_string()),
        Just("- [[[[[[[[[[[[\n".to_string()),
        Just("k: \"{{ a ? b : c }}\"\n".to_string()),
        Just("? complex\n: key\n".to_string()),
        Just("%YAML 1.2\n---\n".to_string()),
        Just("x: !!binary AAAA\n".to_string()),
        "[ -~\n\t]{0,40}",
    ]
}

/// Tokens of the expression language, joined at random.
fn expr_token() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("a"),
        Just("b"),
        Just("1"),
        Just("1e9"),
        Just("'s'"),
        Just("\"t\""),
        Just("("),
        Just(")"),
        Just("["),
        Just("]"),
        Just("{"),
        Just("}"),
        Just(","),
        Just("."),
        Just(".."),
        Just("?"),
        Just(":"),
        Just("??"),
        Just("|"),
        Just("#"),
        Just("+"),
        Just("*"),
        Just("**"),
        Just("=="),
        Just("!"),
        Just("&&"),
        Just(" "),
        Just("map"),
        Just("filter"),
        Just("existsOne"),
        Just("all"),
        Just("repeat"),
        Just("len"),
        Just("strings.ToUpper"),
        Just("json.Unmarshal"),
        Just("Up(2).Path"),
        Just("let x = 1;"),
        Just("/*"),
        Just("*/"),
        Just("//"),
        Just("$env"),
        Just("in"),
    ]
}

fn expression() -> impl Strategy<Value = String> {
    prop::collection::vec(expr_token(), 0..40).prop_map(|t| t.concat())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_yaml_loader_never_panics_or_hangs(pieces in prop::collection::vec(yaml_piece(), 0..12)) {
        let text = pieces.concat();
        bounded("yaml", move || {
            let f: Arc<str> = Arc::from("fuzz.yaml");
            if let Ok(node) = envbridge::workflow::yaml::parse(&f, &text) {
                let _ = envbridge::workflow::load::workflow_from_node(&node);
            }
        });
    }

    #[test]
    fn the_expression_engine_never_panics_or_hangs(src in expression()) {
        bounded("expression", move || {
            let _ = check(&src, Dialect::Template);
            let _ = check(&src, Dialect::Call);
        });
    }

    #[test]
    fn the_whole_render_never_panics_or_hangs(
        src in expression(),
        hosts in prop::collection::vec("[a-z0-9]{1,6}", 0..4),
        as_hosts in any::<bool>(),
    ) {
        let hosts_json = serde_json::to_string(&hosts).unwrap_or_default();
        let value = format!("{{{{ {src} }}}}");
        let sets = if as_hosts {
            vec![("hosts".to_string(), value)]
        } else {
            vec![
                ("hosts".to_string(), hosts_json),
                ("fmq_rate_logging".to_string(), value),
            ]
        };
        let req = RenderRequest {
            sources: Sources {
                tasks_dir: repo("manifests/control-workflows/tasks"),
                workflows_dir: None,
                defaults_files: vec![repo("manifests/site/local.yaml")],
            },
            workflow: repo("manifests/control-workflows/workflows/readout-dataflow.yaml"),
            sets,
            env_id: Some("fuzz".into()),
            threads: 1,
            ..RenderRequest::default()
        };
        bounded("render", move || {
            let _ = envbridge::objects::render(&req);
        });
    }
}

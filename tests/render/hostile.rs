//! Hostile expressions end in an error, in seconds.

use super::*;

/// Runaway expressions, through `--set` and in a workflow file, in every syntax the engine
/// accepts (calls, methods, pipes, spacing, comments, nesting): each ends with exit 2 and
/// `error:` within seconds, never a hang or an out-of-memory.
#[test]
fn hostile_expressions_end_in_an_error_within_seconds() {
    let bin = env!("CARGO_BIN_EXE_envbridge");
    let big = "[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19]";
    let nested = format!(
        "{{{{ {big}.existsOne(a, {big}.existsOne(b, {big}.existsOne(c, {big}.existsOne(d, a+b+c+d == 1)))) }}}}"
    );
    let hostile: Vec<String> = vec![
        nested,
        format!("{{{{ map({big}, map({big}, map({big}, #))) }}}}"),
        format!("{{{{ {big}.map (# * 2) }}}}"),
        format!("{{{{ {big} | map(#) | filter(# > 1) }}}}"),
        format!("{{{{ all({big}, {{ any({big}, {{ # > 0 }}) }}) }}}}"),
        format!("{{{{ {big}./* c */map(#) }}}}"),
        "{{ 1..1000000000 }}".to_string(),
        "{{ len(1 .. 1000000000) }}".to_string(),
        "{{ repeat('x', 1000000000) }}".to_string(),
        "{{ $env }}".to_string(),
        "{{ none([1,2], # > 1) }}".to_string(),
        "{{ sortBy([1,2], #) }}".to_string(),
        "{{ reduce([1,2], #acc + #) }}".to_string(),
        "{{ groupBy([1,2], #) }}".to_string(),
        "{{ count([1,2], # > 0) }}".to_string(),
        "{{ findIndex([1,2], # > 0) }}".to_string(),
    ];
    let wf = repo("manifests/control-workflows/workflows/readout-dataflow.yaml");
    for h in &hostile {
        let started = std::time::Instant::now();
        let out = Command::new(bin)
            .args([
                "render",
                &wf.display().to_string(),
                "--tasks",
                &repo("manifests/control-workflows/tasks")
                    .display()
                    .to_string(),
                "--set",
                &format!("hosts={h}"),
                "--deadline",
                "20",
                "-o",
                "tasks",
            ])
            .output()
            .unwrap();
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{h}: {err}");
        assert!(err.starts_with("error:"), "{h}: {err}");
        assert!(
            took < std::time::Duration::from_secs(15),
            "{h} took {took:?}"
        );
    }
    // The same in a workflow file: the error names the file, line and column.
    let c = Case::new(&[(
        "w.yaml",
        "name: w\nroles:\n  - name: h\n    constraints:\n      - attribute: machine_id\n        value: \"{{ [1,2].map(# * 2) }}\"\n    task:\n      load: t\n",
    )]);
    let out = Command::new(bin)
        .args(["render", &c.path("w.yaml"), "--tasks", &c.path("tasks")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(&format!("error: {}:6:", c.path("w.yaml"))),
        "{err}"
    );
}

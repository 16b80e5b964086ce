//! One test per error class: its message and FILE:LINE:COLUMN; the CLI's exit codes.

use super::*;

#[test]
fn error_yaml_does_not_parse() {
    let c = Case::new(&[("w.yaml", "name: w\nroles: [\n  - a: b\n")]);
    let e = c.render("w.yaml");
    assert!(
        e.starts_with(&format!("{}:", c.path("w.yaml"))) && e.contains("invalid YAML"),
        "{e}"
    );
}

#[test]
fn error_empty_file_and_wrong_shape() {
    let c = Case::new(&[("w.yaml", ""), ("l.yaml", "- a\n- b\n")]);
    c.expect("w.yaml", "w.yaml", 1, 1, "empty file");
    c.expect("l.yaml", "l.yaml", 1, 1, "not a workflow");
}

#[test]
fn error_unknown_field() {
    let c = Case::new(&[("w.yaml", "name: w\nroels:\n  - name: a\n")]);
    c.expect("w.yaml", "w.yaml", 2, 1, "unknown field `roels`");
}

#[test]
fn error_expression_does_not_parse() {
    let c = Case::new(&[(
        "w.yaml",
        &format!(
            "name: w\n{HOST}      - name: \"{{{{ 1 + }}}}\"\n        task:\n          load: t\n"
        ),
    )]);
    c.expect("w.yaml", "w.yaml", 8, 16, "does not parse");
}

/// The anchor drops a role whose `enabled` names an undefined variable (its evaluation error
/// is swallowed); envbridge does the same (with a warning in its log), and reads `enabled` as
/// the anchor does: only `true` or `1` enable.
#[test]
fn enabled_as_the_anchor_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tasks")).unwrap();
    std::fs::write(
        dir.path().join("tasks/t.yaml"),
        "control:\n  mode: basic\ncommand:\n  value: x\n",
    )
    .unwrap();
    let role = |name: &str, en: &str| {
        format!(
            "      - name: {name}\n        enabled: \"{en}\"\n        task:\n          load: t\n"
        )
    };
    let wf = format!(
        "name: w\n{HOST}{}{}{}{}{}",
        role("undefined", "{{ nope == 'x' }}"),
        role("yes", "yes"),
        role("one", "{{ 1 }}"),
        role("upper", " TRUE "),
        role("falsy", "{{ strings.IsFalsy('') && false }}"),
    );
    std::fs::write(dir.path().join("w.yaml"), wf).unwrap();
    let req = RenderRequest {
        sources: Sources {
            tasks_dir: dir.path().join("tasks"),
            ..Default::default()
        },
        workflow: dir.path().join("w.yaml"),
        env_id: Some("E".into()),
        ..RenderRequest::default()
    };
    let r = envbridge::objects::render(&req).unwrap_or_else(|e| panic!("{e}"));
    let paths: Vec<&str> = r.tasks().map(|t| t.path.as_str()).collect();
    assert_eq!(paths, ["w.h.one", "w.h.upper"]);
}

#[test]
fn error_unknown_variable_and_function() {
    let c = Case::new(&[
        (
            "f.yaml",
            &format!(
                "name: w\n{HOST}      - name: a\n        enabled: \"{{{{ inventory.Detector(x) }}}}\"\n        task:\n          load: t\n"
            ),
        ),
        (
            "b.yaml",
            &format!(
                "name: w\n{HOST}      - name: \"a-{{{{ missing }}}}\"\n        task:\n          load: t\n"
            ),
        ),
    ]);
    c.expect(
        "f.yaml",
        "f.yaml",
        9,
        19,
        "unknown function `inventory.Detector`",
    );
    c.expect("b.yaml", "b.yaml", 8, 18, "unknown variable `missing`");
}

#[test]
fn error_task_class_does_not_exist() {
    let c = Case::new(&[(
        "w.yaml",
        &format!("name: w\n{HOST}      - name: a\n        task:\n          load: nosuch\n"),
    )]);
    c.expect(
        "w.yaml",
        "w.yaml",
        10,
        17,
        "task class `nosuch` does not exist",
    );
}

#[test]
fn error_sibling_roles_with_one_name() {
    let c = Case::new(&[(
        "w.yaml",
        &format!(
            "name: w\n{HOST}      - name: a\n        task:\n          load: t\n      - name: a\n        task:\n          load: t\n"
        ),
    )]);
    c.expect("w.yaml", "w.yaml", 11, 9, "two sibling roles named `a`");
}

#[test]
fn error_include_cycle() {
    let c = Case::new(&[
        (
            "w.yaml",
            &format!("name: w\n{HOST}      - name: a\n        include: sub\n"),
        ),
        (
            "sub.yaml",
            "name: sub\nroles:\n  - name: again\n    include: w\n",
        ),
    ]);
    c.expect("w.yaml", "sub.yaml", 4, 14, "include cycle");
}

#[test]
fn error_task_without_node() {
    let c = Case::new(&[(
        "w.yaml",
        "name: w\nroles:\n  - name: a\n    task:\n      load: t\n",
    )]);
    c.expect("w.yaml", "w.yaml", 3, 5, "task `w.a` has no node");
}

#[test]
fn error_unknown_control_mode() {
    let c = Case::new(&[
        (
            "tasks/m.yaml",
            "name: m\ncontrol:\n  mode: mesos\ncommand:\n  value: /bin/m\n",
        ),
        (
            "w.yaml",
            &format!("name: w\n{HOST}      - name: a\n        task:\n          load: m\n"),
        ),
    ]);
    c.expect(
        "w.yaml",
        "tasks/m.yaml",
        3,
        9,
        "unknown control mode `mesos`",
    );
}

#[test]
fn error_unresolved_target() {
    let c = Case::new(&[(
        "w.yaml",
        &format!(
            "name: w\n{HOST}      - name: a\n        connect:\n          - name: in\n            type: pull\n            target: \"{{{{ Parent().Path }}}}.b:out\"\n        task:\n          load: t\n"
        ),
    )]);
    c.expect(
        "w.yaml",
        "w.yaml",
        12,
        21,
        "unresolved target `w.h.b:out` of channel `in` of task `w.h.a`",
    );
}

#[test]
fn error_alias_redefined() {
    let c = Case::new(&[(
        "w.yaml",
        &format!(
            "name: w\n{HOST}      - name: a\n        bind:\n          - name: x\n            type: push\n            addressing: ipc\n            global: shared\n        task:\n          load: t\n      - name: b\n        bind:\n          - name: x\n            type: push\n            addressing: ipc\n            global: shared\n        task:\n          load: t\n"
        ),
    )]);
    let e = c.render("w.yaml");
    assert!(e.contains("alias `::shared` redefined"), "{e}");
    assert!(
        e.contains("w.h.a:x") && e.contains("w.h.b:x"),
        "names both ends: {e}"
    );
    assert!(e.starts_with(&format!("{}:", c.path("w.yaml"))), "{e}");
}

#[test]
fn error_channel_type_mismatch() {
    let c = Case::new(&[(
        "w.yaml",
        &format!(
            "name: w\n{HOST}      - name: a\n        task:\n          load: t\n      - name: b\n        connect:\n          - name: in\n            type: push\n            target: w.h.a:out\n        task:\n          load: t\n"
        ),
    )]);
    let e = c.render("w.yaml");
    assert!(
        e.starts_with(&format!("{}:13:13: ", c.path("w.yaml"))),
        "{e}"
    );
    assert!(
        e.contains("type mismatch") && e.contains("w.h.b:in") && e.contains("w.h.a:out"),
        "{e}"
    );
}

#[test]
fn cli_exit_codes_and_messages() {
    let bin = env!("CARGO_BIN_EXE_envbridge");
    let c = Case::new(&[(
        "w.yaml",
        "name: w\nroles:\n  - name: a\n    task:\n      load: t\n",
    )]);
    let out = Command::new(bin)
        .args([
            "render",
            &c.path("w.yaml"),
            "--tasks",
            &c.path("tasks"),
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!("error: {}:3:5: ", c.path("w.yaml"))),
        "{err}"
    );

    let wf = repo("manifests/control-workflows/workflows/readout-dataflow.yaml");
    let out = Command::new(bin)
        .args([
            "render",
            &wf.display().to_string(),
            "--tasks",
            &repo("manifests/control-workflows/tasks")
                .display()
                .to_string(),
            "--defaults",
            &repo("manifests/site/local.yaml").display().to_string(),
            "--set",
            r#"hosts=["flp001","flp002"]"#,
            "--env-id",
            "cli",
            "-o",
            "tasks",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let first = &v[0];
    for k in [
        "node",
        "path",
        "class",
        "name",
        "env",
        "args",
        "controlPort",
        "channels",
    ] {
        assert!(first.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v.as_array().unwrap().len(), 6);
}

//! What roles share: class values where no role redefines what they read, a global alias
//! that connects both ends.

use super::*;

/// Renders `workflow` of `dir` (task classes in `dir/tasks`, no site profile), which must succeed.
fn render_in(dir: &Path, workflow: &str) -> envbridge::objects::Objects {
    envbridge::objects::render(&RenderRequest {
        sources: Sources {
            tasks_dir: dir.join("tasks"),
            workflows_dir: None,
            defaults_files: vec![],
        },
        workflow: dir.join(workflow),
        env_id: Some("E".into()),
        ..RenderRequest::default()
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A class value is evaluated once per class and shared, except where a task's own role layers
/// redefine a variable it reads (directly or through another variable), or it reads the task's
/// context. Each task must get exactly what evaluating it alone would give.
#[test]
fn class_values_are_shared_only_where_no_role_redefines_what_they_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tasks")).unwrap();
    std::fs::write(
        dir.path().join("tasks/w.yaml"),
        "name: w\ncontrol:\n  mode: direct\ndefaults:\n  level: info\n  inner: base\n  outer: \"o-{{ inner }}\"\n\
         bind:\n  - name: out\n    type: push\n    addressing: ipc\n    sndBufSize: \"{{ inner }}\"\n\
         command:\n  value: /bin/w\n  arguments:\n    - \"--level={{ level }}\"\n    - \"--outer={{ outer }}\"\n\
         \x20   - \"--host={{ task_hostname }}\"\n    - \"--pick={{ level == 'info' ? 'a' : 'b' }}\"\n",
    )
    .unwrap();
    let role = |name: &str, vars: &str| {
        format!("      - name: {name}\n{vars}        task:\n          load: w\n")
    };
    let wf = format!(
        "name: s\nroles:\n  - name: h-{{{{ it }}}}\n    for:\n      range: '[\"n1\",\"n2\"]'\n      var: it\n    \
         constraints:\n      - attribute: machine_id\n        value: \"{{{{ it }}}}\"\n    roles:\n{}{}{}",
        role("plain", ""),
        role("loud", "        vars:\n          level: debug\n"),
        role(
            "deep",
            "        defaults:\n          inner: \"{{ it }}-x\"\n"
        ),
    );
    std::fs::write(dir.path().join("s.yaml"), wf).unwrap();
    let r = render_in(dir.path(), "s.yaml");
    let got: Vec<(String, Vec<String>, String)> = r
        .tasks()
        .map(|t| {
            (
                t.path.clone(),
                t.args.iter().map(|a| a.to_string()).collect(),
                t.channels["chans.out.0.sndBufSize"].to_string(),
            )
        })
        .collect();
    let want = |node: &str, role: &str, level: &str, inner: &str, pick: &str| {
        (
            format!("s.h-{node}.{role}"),
            vec![
                format!("--level={level}"),
                format!("--outer=o-{inner}"),
                format!("--host={node}"),
                format!("--pick={pick}"),
            ],
            inner.to_string(),
        )
    };
    assert_eq!(
        got,
        vec![
            want("n1", "deep", "info", "n1-x", "a"),
            want("n1", "loud", "debug", "base", "b"),
            want("n1", "plain", "info", "base", "a"),
            want("n2", "deep", "info", "n2-x", "a"),
            want("n2", "loud", "debug", "base", "b"),
            want("n2", "plain", "info", "base", "a"),
        ]
    );
}

/// A target `::alias` reaches the inbound channel that publishes it: both ends get one address.
#[test]
fn a_global_alias_connects_both_ends() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tasks")).unwrap();
    std::fs::write(
        dir.path().join("tasks/t.yaml"),
        "name: t\ncontrol:\n  mode: fairmq\ncommand:\n  value: /bin/t\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("w.yaml"),
        format!(
            "name: w\n{HOST}      - name: a\n        bind:\n          - name: out\n            type: push\n            \
             addressing: ipc\n            global: \"feed-{{{{ task_hostname }}}}\"\n        task:\n          load: t\n\
             \x20     - name: b\n        connect:\n          - name: in\n            type: pull\n            \
             target: \"::feed-flp001\"\n        task:\n          load: t\n"
        ),
    )
    .unwrap();
    let r = render_in(dir.path(), "w.yaml");
    let t: Vec<_> = r.tasks().collect();
    let bound = &t[0].channels["chans.out.0.address"];
    assert!(bound.starts_with("ipc://@eb-"), "{bound}");
    assert_eq!(&t[1].channels["chans.in.0.address"], bound);
    assert_eq!(&*t[1].channels["chans.in.0.method"], "connect");
}

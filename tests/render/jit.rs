//! The anchor's JIT fallback includes the workflow template.

use super::*;

/// The anchor's JIT fallback: `dpl.GenerateFromUriOrFallbackToTemplate(name)` without
/// `jit/<name>` includes `workflows/<name>.yaml` (its roles under the include role, its
/// top-level `defaults` at the include role's place); with `jit/<name>` and no generator,
/// an error at the include naming the entry and the variable that chose it.
#[test]
fn the_jit_fallback_includes_the_workflow_template() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for sub in ["tasks", "workflows", "jit"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(
        d.join("tasks/t.yaml"),
        "name: t\ncontrol:\n  mode: fairmq\ncommand:\n  value: /bin/t\n  arguments:\n    - \"--port={{ port }}\"\n",
    )
    .unwrap();
    std::fs::write(
        d.join("workflows/w.yaml"),
        format!(
            "name: w\ndefaults:\n  port: \"1\"\n{HOST}      - name: dpl\n        include: \"{{{{ dpl.GenerateFromUriOrFallbackToTemplate(dpl_workflow) }}}}\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("workflows/chain.yaml"),
        "name: chain\ndefaults:\n  port: \"29950\"\nroles:\n  - name: proxy\n    task:\n      load: t\n",
    )
    .unwrap();
    std::fs::write(d.join("jit/minimal"), "o2-dpl-raw-proxy -b").unwrap();
    let req = |wf: &str| RenderRequest {
        sources: Sources {
            tasks_dir: d.join("tasks"),
            workflows_dir: Some(d.join("workflows")),
            defaults_files: vec![],
        },
        workflow: d.join("workflows/w.yaml"),
        sets: vec![("dpl_workflow".into(), wf.into())],
        env_id: Some("E".into()),
        ..RenderRequest::default()
    };
    let r = envbridge::objects::render(&req("chain")).unwrap_or_else(|e| panic!("{e}"));
    let t: Vec<_> = r.tasks().collect();
    assert_eq!(t.len(), 1);
    assert_eq!(&*t[0].path, "w.h.dpl.proxy");
    assert_eq!(&*t[0].args[0], "--port=29950");

    let e = envbridge::objects::render(&req("minimal"))
        .map(|_| ())
        .expect_err("needs generation")
        .to_string();
    let place = format!("{}:11:19: ", d.join("workflows/w.yaml").display());
    assert!(e.starts_with(&place), "{e}");
    for want in [
        "the JIT entry `jit/minimal`",
        "no JIT generator is configured",
        "chosen by the variable `dpl_workflow` = `minimal`",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
}

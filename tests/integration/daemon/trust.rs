//! The trust boundary through the daemon's API (docs/security.md): what a caller may set, and
//! that nothing a caller sends writes anything when refused or hangs the daemon.

use std::time::{Duration, Instant};

use envbridge::bridge::BridgeConfig;
use envbridge::crd::{Environment, TaskSet};
use envbridge::server::pb;
use kube::Api;

use super::fixture::{self, Daemon, Setup, fixed_ns};

/// A caller's daemon: the site allows no variable beyond `hosts` and the public ones.
fn strict(ns: &str) -> BridgeConfig {
    let mut cfg = fixed_ns(ns);
    cfg.caller.allowed.clear();
    cfg
}

fn req(workflow: &str, kv: &[(&str, &str)]) -> pb::CreateEnvironmentRequest {
    pb::CreateEnvironmentRequest {
        workflow: workflow.into(),
        variables: kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        wait: false,
        ..Default::default()
    }
}

async fn nothing_written(ns: &Setup) {
    let envs: Api<Environment> = ns.api();
    let sets: Api<TaskSet> = ns.api();
    assert!(
        envs.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        sets.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// Writes a workflow and a task class of its own: `shell: true`, a public variable that
/// reaches the command line, and one that would choose the executable.
fn own_sources() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tasks")).unwrap();
    std::fs::create_dir_all(dir.path().join("workflows")).unwrap();
    std::fs::write(
        dir.path().join("tasks/shelly.yaml"),
        "name: shelly\ndefaults:\n  severity: info\n  exe: /opt/o2/bin/shelly\ncontrol:\n  mode: direct\ncommand:\n  shell: true\n  value: \"{{ exe }}\"\n  arguments:\n    - \"--severity={{ severity }}\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("workflows/shelly.yaml"),
        "name: shelly\ndefaults:\n  hosts: '[\"flp001\"]'\n  severity: !public\n    value: info\n    type: string\n  exe: !public\n    value: /opt/o2/bin/shelly\nroles:\n  - name: host-{{ it }}\n    for:\n      range: \"{{ hosts }}\"\n      var: it\n    constraints:\n      - attribute: machine_id\n        value: \"{{ it }}\"\n    roles:\n      - name: s\n        task:\n          load: shelly\n",
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gets_what_the_workflow_allows_and_nothing_is_written_otherwise() {
    let ns = Setup::shared("daemon-trust").await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    let mut cfg = strict(&ns.name);
    cfg.tasks_dir = root.join("control-workflows/tasks");
    cfg.workflows_dir = root.join("control-workflows/workflows");
    cfg.defaults_files = vec![root.join("site/local.yaml")];
    let renderer = envbridge::bridge::render::renderer(&cfg);
    let d = Daemon::start(ns.client.clone(), cfg, renderer).await;
    let mut api = d.client().await;
    let hosts = r#"["flp001"]"#;

    // Not public, not allowed: the command's variable, the template's variable.
    for (k, v) in [
        ("readout_exe", "/bin/sh -c 'id'"),
        ("task_template", "stfsender"),
    ] {
        let e = api
            .create_environment(req("readout-dataflow", &[("hosts", hosts), (k, v)]))
            .await
            .expect_err(k);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{k}: {e:?}");
        assert!(
            e.message()
                .contains(&format!("variable {k} may not be set")),
            "{}",
            e.message()
        );
        nothing_written(&ns).await;
    }
    // A public variable's value must fit its declaration (fmq_rate_logging: a number).
    let e = api
        .create_environment(req(
            "readout-dataflow",
            &[("hosts", hosts), ("fmq_rate_logging", "often")],
        ))
        .await
        .expect_err("not a number");
    assert!(e.message().contains("is not a number"), "{}", e.message());
    // A host no labelled Node stands for.
    let e = api
        .create_environment(req("readout-dataflow", &[("hosts", r#"["nolabel01"]"#)]))
        .await
        .expect_err("unlabelled host");
    assert!(
        e.message()
            .contains("no Node carries the label envbridge.dev/host=nolabel01"),
        "{}",
        e.message()
    );
    nothing_written(&ns).await;

    // `hosts` is a list of names, never an expression.
    let e = api
        .create_environment(req("readout-dataflow", &[("hosts", "{{ [1,2].map(#) }}")]))
        .await
        .expect_err("hosts expression");
    assert!(
        e.message().contains("is not a host name"),
        "{}",
        e.message()
    );
    nothing_written(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_variables_never_change_a_command_nor_smuggle_shell_syntax() {
    let ns = Setup::shared("daemon-trust-shell").await;
    let src = own_sources();
    let mut cfg = strict(&ns.name);
    cfg.tasks_dir = src.path().join("tasks");
    cfg.workflows_dir = src.path().join("workflows");
    // The class runs with one of the test's TaskTemplates (the site's mapping).
    let map = src.path().join("templates.yaml");
    std::fs::write(
        &map,
        format!("classes:\n  shelly: {}-readout\n", ns.tpl.prefix),
    )
    .unwrap();
    cfg.templates = Some(map);
    let renderer = envbridge::bridge::render::renderer(&cfg);
    let d = Daemon::start(ns.client.clone(), cfg, renderer).await;
    let mut api = d.client().await;
    let hosts = r#"["flp001"]"#;

    let e = api
        .create_environment(req(
            "shelly",
            &[("hosts", hosts), ("severity", "info; touch /tmp/pwned")],
        ))
        .await
        .expect_err("shell syntax");
    assert!(
        e.message()
            .contains("variable severity: its value holds shell syntax"),
        "{}",
        e.message()
    );
    let e = api
        .create_environment(req("shelly", &[("hosts", hosts), ("exe", "/bin/sh")]))
        .await
        .expect_err("command");
    assert!(
        e.message().contains("variables exe change the command"),
        "{}",
        e.message()
    );
    // A runaway expression through a variable: the create fails fast, naming it, and the
    // daemon answers other calls meanwhile.
    let big = "[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19]";
    let runaway =
        format!("{{{{ {big}.existsOne(a, {big}.existsOne(b, {big}.existsOne(c, a+b+c == 1))) }}}}");
    let mut other = d.client().await;
    let started = Instant::now();
    let (created, listed) = tokio::join!(
        api.create_environment(req(
            "shelly",
            &[("hosts", hosts), ("severity", runaway.as_str())]
        )),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            other
                .list_environments(pb::ListEnvironmentsRequest::default())
                .await
        }
    );
    let e = created.expect_err("runaway");
    assert!(listed.is_ok(), "the daemon answered other calls");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(e.message().contains("is not accepted"), "{}", e.message());
    nothing_written(&ns).await;
    // A plain public value passes.
    let c = api
        .create_environment(req("shelly", &[("hosts", hosts), ("severity", "debug")]))
        .await
        .expect("a plain public value")
        .into_inner();
    assert!(c.created);
    let gone = fixture::destroy(&mut api, &c.id, 60).await;
    assert!(gone.gone, "{}", gone.message);
}

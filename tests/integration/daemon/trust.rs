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

/// A client that presents `token`.
async fn client_as(
    d: &Daemon,
    token: &str,
) -> pb::env_bridge_client::EnvBridgeClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        impl tonic::service::Interceptor + use<>,
    >,
> {
    let ch = tonic::transport::Channel::from_shared(format!("http://{}", d.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let header: tonic::metadata::MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
    pb::env_bridge_client::EnvBridgeClient::with_interceptor(ch, move |mut r: tonic::Request<()>| {
        r.metadata_mut().insert("authorization", header.clone());
        Ok(r)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_are_identified_their_roles_hold_and_writes_are_audited() {
    use envbridge::server::auth::Tokens;
    let ns = Setup::shared("daemon-trust-roles").await;
    let tokens = Tokens::parse(
        "tokens:\n  - {name: vera, role: viewer, token: vera-token-0123456789}\n  - {name: otto, role: operator, token: otto-token-0123456789}\n  - {name: ada, role: admin, token: ada-token-01234567890}\n",
        "test",
    )
    .unwrap();
    let cfg = fixed_ns(&ns.name);
    let renderer = fixture::test_renderer(&ns.tpl.prefix);
    let d = Daemon::start_with_tokens(
        ns.client.clone(),
        cfg,
        renderer,
        Some(std::sync::Arc::new(tokens)),
    )
    .await;
    let create = |port: &str| pb::CreateEnvironmentRequest {
        workflow: "readout-dataflow".into(),
        variables: [
            ("hosts".to_string(), "flp001".to_string()),
            ("port_base".to_string(), port.to_string()),
        ]
        .into(),
        wait: false,
        ..Default::default()
    };

    // No token, a wrong token: unauthenticated, for reads and writes alike.
    let mut anon = d.client().await;
    let e = anon
        .list_environments(pb::ListEnvironmentsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut wrong = client_as(&d, "not-a-token-of-anyone").await;
    let e = wrong.create_environment(create("48600")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);

    // A viewer reads, never writes.
    let mut vera = client_as(&d, "vera-token-0123456789").await;
    assert!(
        vera.list_environments(pb::ListEnvironmentsRequest::default())
            .await
            .is_ok()
    );
    let e = vera.create_environment(create("48600")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(
        e.message()
            .contains("vera (viewer) may not create environments")
    );

    // An operator creates, but a site-only (allow-listed) variable is an admin's.
    let mut otto = client_as(&d, "otto-token-0123456789").await;
    let e = otto.create_environment(create("48600")).await.unwrap_err();
    assert!(
        e.message().contains("variable port_base may not be set"),
        "{}",
        e.message()
    );
    nothing_written(&ns).await;
    let mut ada = client_as(&d, "ada-token-01234567890").await;
    let c = ada
        .create_environment(create("48600"))
        .await
        .expect("admin")
        .into_inner();
    assert!(c.created);

    // Every write is audited: on the Environment, as an Event naming who and what.
    let events: Api<k8s_openapi::api::events::v1::Event> = ns.api();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = events.list(&Default::default()).await.unwrap();
        let audit = list.items.iter().find(|e| {
            e.reason.as_deref() == Some("Audit")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.starts_with("ada (admin) create"))
        });
        if audit.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "no audit event for ada's create");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let e = vera
        .destroy_environment(pb::DestroyEnvironmentRequest {
            id: c.id.clone(),
            wait: false,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let gone = otto
        .destroy_environment(pb::DestroyEnvironmentRequest {
            id: c.id.clone(),
            wait: true,
            timeout_seconds: 60,
        })
        .await
        .expect("operator destroys")
        .into_inner();
    assert!(gone.gone, "{}", gone.message);
}

/// The control ports each node holds in the environment `env`'s TaskSets.
async fn ports_of(ns: &Setup, env: &str) -> std::collections::BTreeMap<String, Vec<u16>> {
    let sets: Api<TaskSet> = ns.api();
    let mut out: std::collections::BTreeMap<String, Vec<u16>> = Default::default();
    for s in sets.list(&Default::default()).await.unwrap().items {
        if s.spec.environment.ends_with(env) {
            for t in &s.spec.tasks {
                out.entry(t.node.clone()).or_default().push(t.control_port);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_stay_disjoint_across_a_daemon_restart_while_the_operator_is_stopped() {
    let ns = Setup::shared("daemon-ports-restart").await;
    // No operator runs here: no Task is ever written, the roster shows none.
    let create = |id: &str| pb::CreateEnvironmentRequest {
        workflow: "readout-dataflow".into(),
        variables: [
            ("hosts".to_string(), "flp001,flp002".to_string()),
            ("port_base".to_string(), "48700".to_string()),
        ]
        .into(),
        env_id: id.into(),
        wait: false,
        ..Default::default()
    };
    {
        let first = ns.daemon().await;
        let mut api = first.client().await;
        api.create_environment(create("pra"))
            .await
            .expect("first create");
    }
    // A new daemon: its roster has the Environment but no Task, and no reservation of its own.
    let second = ns.daemon().await;
    let mut api = second.client().await;
    api.create_environment(create("prb"))
        .await
        .expect("second create");
    let (a, b) = (ports_of(&ns, "pra").await, ports_of(&ns, "prb").await);
    assert!(!a.is_empty() && !b.is_empty());
    for (node, ports) in &a {
        let other = b.get(node).cloned().unwrap_or_default();
        assert!(
            ports.iter().all(|p| !other.contains(p)),
            "{node}: {ports:?} and {other:?} overlap"
        );
    }
}

/// A daemon process (the real binary, the project's workflows) killed with SIGKILL between
/// its TaskSet writes and its Environment write; a restarted daemon removes what it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_between_its_writes_leaves_nothing_once_restarted() {
    let ns = Setup::shared("daemon-sigkill").await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    envbridge::install::task_templates(&ns.client, &root.join("task-templates"))
        .await
        .expect("TaskTemplates");
    let spawn = |port: u16, hold_ms: u64, grace: &str| {
        super::Child(
            std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
                .args([
                    "daemon",
                    "--namespace",
                    &ns.name,
                    "--watch-namespace",
                    &ns.name,
                ])
                .args(["--no-leader-election", "--insecure-no-auth"])
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--metrics-listen", "127.0.0.1:0", "--orphan-grace", grace])
                .arg("--tasks-dir")
                .arg(root.join("control-workflows/tasks"))
                .arg("--workflows-dir")
                .arg(root.join("control-workflows/workflows"))
                .arg("--defaults")
                .arg(root.join("site/local.yaml"))
                .env("KUBECONFIG", &ns.kubeconfig)
                .env(
                    "ENVBRIDGE_TEST_HOLD_BEFORE_ENVIRONMENT_WRITE_MS",
                    hold_ms.to_string(),
                )
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawn the daemon"),
        )
    };
    let connect = |port: u16| async move {
        crate::support::wait_for(
            "the daemon to listen",
            Duration::from_secs(60),
            || async move {
                pb::env_bridge_client::EnvBridgeClient::connect(format!("http://127.0.0.1:{port}"))
                    .await
                    .ok()
            },
        )
        .await
    };
    let sets: Api<TaskSet> = ns.api();
    let envs: Api<Environment> = ns.api();
    let count =
        |api: Api<TaskSet>| async move { api.list(&Default::default()).await.unwrap().items.len() };

    let port = fixture::free_port();
    let mut first = spawn(port, 120_000, "120");
    let mut api = connect(port).await;
    let mut create = req("readout-dataflow", &[("hosts", r#"["flp001","flp002"]"#)]);
    create.env_id = "killed".into();
    let pending = tokio::spawn(async move { api.create_environment(create).await });
    crate::support::wait_for("the TaskSets written", Duration::from_secs(60), || {
        let sets = sets.clone();
        assert!(
            !pending.is_finished(),
            "the create ended before its TaskSets were seen"
        );
        async move { (count(sets).await > 0).then_some(()) }
    })
    .await;
    first.0.kill().expect("kill -9 the daemon");
    let _ = first.0.wait();
    assert!(
        pending.await.expect("join").is_err(),
        "the create cannot have succeeded"
    );
    assert!(
        count(sets.clone()).await > 0,
        "TaskSets without their Environment"
    );
    assert!(envs.get_opt("killed").await.unwrap().is_none());

    // Restarted: the leader sweeps what the crash left (grace 0 here; 120 s by default).
    let port2 = fixture::free_port();
    let _second = spawn(port2, 0, "0");
    let started = Instant::now();
    while count(sets.clone()).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the orphaned TaskSets are still there"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(envs.get_opt("killed").await.unwrap().is_none());
}

/// manifests/deploy/admission-policy.yaml on the local apiserver: a privileged TaskTemplate is
/// refused in a namespace without `envbridge.dev/privileged=allowed`, accepted in one with it.
/// A copy of the policy under this test's name, listing this test's template, with a binding
/// scoped to the test's own namespaces: other tests are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_policy_keeps_privileged_templates_in_allowed_namespaces() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
    let ns = Setup::shared("daemon-admission").await;
    let tag = ns.name.clone();
    let privileged = format!("{}-readout", ns.tpl.prefix);
    let pp = PatchParams::apply("envbridge-tests").force();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("manifests/deploy/admission-policy.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text
        .replace(
            "name: envbridge-privileged-templates",
            &format!("name: {tag}"),
        )
        .replace("['readout',", &format!("['{privileged}', 'readout',"));
    assert!(
        text.contains(&privileged),
        "the policy's template list moved"
    );
    let policy: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let gvk = |kind: &str| {
        kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            kind,
        ))
    };
    let policies: Api<DynamicObject> =
        Api::all_with(ns.client.clone(), &gvk("ValidatingAdmissionPolicy"));
    policies
        .patch(&tag, &pp, &Patch::Apply(&policy))
        .await
        .expect("policy");
    let bindings: Api<DynamicObject> =
        Api::all_with(ns.client.clone(), &gvk("ValidatingAdmissionPolicyBinding"));
    let binding = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": tag.clone()},
        "spec": {
            "policyName": tag.clone(),
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"envbridge.dev/admission-test": tag.clone()}}}
        }
    });
    bindings
        .patch(&tag, &pp, &Patch::Apply(&binding))
        .await
        .expect("binding");
    // Two namespaces of this test: one allowed, one not.
    let nss: Api<Namespace> = Api::all(ns.client.clone());
    let make = |name: String, allowed: bool| {
        let mut labels = serde_json::json!({"envbridge.dev/admission-test": tag.clone()});
        if allowed {
            labels["envbridge.dev/privileged"] = "allowed".into();
        }
        serde_json::from_value::<Namespace>(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}
        }))
        .unwrap()
    };
    let (plain, allowed) = (format!("{tag}-plain"), format!("{tag}-allowed"));
    for (n, a) in [(&plain, false), (&allowed, true)] {
        nss.create(&PostParams::default(), &make(n.clone(), a))
            .await
            .unwrap();
    }
    let task_set = |namespace: &str| -> TaskSet {
        let mut objs = fixture::readout_dataflow(
            "adm",
            &ns.tpl.prefix,
            &fixture::hosts(1),
            48900,
            &Default::default(),
        );
        let mut ts = objs.task_sets.remove(0);
        ts.metadata.namespace = Some(namespace.to_string());
        ts
    };
    // A new policy takes a moment to be enforced: retry until it refuses.
    let started = Instant::now();
    let denied = loop {
        let api: Api<TaskSet> = Api::namespaced(ns.client.clone(), &plain);
        let ts = task_set(&plain);
        let name = ts.metadata.name.clone().unwrap();
        match api.patch(&name, &pp, &Patch::Apply(&ts)).await {
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => break e.message,
            Ok(_) => {
                let _ = api.delete(&name, &Default::default()).await;
            }
            Err(e) => panic!("{e}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the policy never refused"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(denied.contains(&privileged), "{denied}");
    assert!(
        denied.contains("envbridge.dev/privileged=allowed"),
        "{denied}"
    );
    let api: Api<TaskSet> = Api::namespaced(ns.client.clone(), &allowed);
    let ts = task_set(&allowed);
    api.patch(&ts.metadata.name.clone().unwrap(), &pp, &Patch::Apply(&ts))
        .await
        .expect("a privileged template in the allowed namespace");
    let _ = bindings.delete(&tag, &Default::default()).await;
    let _ = policies.delete(&tag, &Default::default()).await;
    for n in [&plain, &allowed] {
        let _ = nss.delete(n, &Default::default()).await;
    }
}

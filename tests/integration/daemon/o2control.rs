//! The o2control endpoint (docs/o2control.md): a daemon process started with
//! `--o2control-listen` on loopback, an environment created through the daemon's own API,
//! then seen through the anchor's API by the project's own o2control client (generated from
//! the same proto/o2control.proto). The cluster side is the simulated one (`sim`).

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ap_pb::apricot_client;
use envbridge::server::o2control::pb::apricot as ap_pb;
use envbridge::server::o2control::pb::events as ev;
use envbridge::server::o2control::pb::o2control as o2;
use envbridge::server::pb;
use o2::control_client::ControlClient;

use super::fixture::{self, Child, Setup};
use super::sim::SimConfig;

pub(super) const WAIT: Duration = Duration::from_secs(60);

/// A free port other than `not`, from a random start like [`fixture::free_port`]: tests run
/// in parallel, and a scan from a fixed start gave two daemons the same port (the second one
/// then failed to bind and its client spoke to the first).
fn another_free_port(not: u16) -> u16 {
    std::iter::repeat_with(fixture::free_port)
        .find(|p| *p != not)
        .expect("a free port")
}

/// A daemon process for `ns` serving its own API and o2control on free loopback ports (with
/// `extra` flags), the TaskTemplates installed: (port, o2control port, the process).
pub(super) async fn daemon(ns: &Setup, extra: &[&str]) -> (u16, u16, Child) {
    let mut args = vec!["--insecure-no-auth"];
    args.extend_from_slice(extra);
    daemon_with(ns, &args).await
}

/// [`daemon`] with `args` in place of `--insecure-no-auth` and the rest.
pub(super) async fn daemon_with(ns: &Setup, extra: &[&str]) -> (u16, u16, Child) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    envbridge::install::task_templates(&ns.client, &root.join("task-templates"))
        .await
        .expect("TaskTemplates");
    let port = fixture::free_port();
    let o2port = another_free_port(port);
    let child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
            .args(["daemon", "--namespace", &ns.name])
            .args(["--watch-namespace", &ns.name])
            .args(["--no-leader-election"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(["--o2control-listen", &format!("127.0.0.1:{o2port}")])
            .args(extra)
            .arg("--tasks-dir")
            .arg(root.join("control-workflows/tasks"))
            .arg("--workflows-dir")
            .arg(root.join("control-workflows/workflows"))
            .arg("--defaults")
            .arg(root.join("site/local.yaml"))
            .env("KUBECONFIG", &ns.kubeconfig)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn the daemon"),
    );
    (port, o2port, child)
}

/// A daemon for `ns` whose o2control listener gives its callers the operator role, its run
/// numbers from `run_numbers` (a counter NAMESPACE/NAME or a service URL), and a client of
/// that listener once it answers.
pub(super) async fn operator_listener(
    ns: &Setup,
    run_numbers: &str,
) -> (ControlClient<tonic::transport::Channel>, Child) {
    let extra = [
        "--o2control-role",
        "operator",
        "--o2control-run-numbers",
        run_numbers,
    ];
    let (_port, o2port, daemon) = daemon(ns, &extra).await;
    let o2c = crate::support::wait_for("the o2control listener", WAIT, || async move {
        ControlClient::connect(format!("http://127.0.0.1:{o2port}"))
            .await
            .ok()
    })
    .await;
    (o2c, daemon)
}

const INVENTORY: &str = r#"
o2:
  hardware:
    detectors:
      TST:
        flps:
          flp001: {}
          flp002: {}
      ITS:
        flps:
          flp003: {}
      TRG: {}
  runtime:
    COG-v1:
      layout: '{"tabs": []}'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_o2control_client_sees_the_daemons_environment_deployed_with_its_tasks() {
    let ns = Setup::shared("daemon-o2control").await;
    let _sim = ns.sim(SimConfig::default());
    // A detector inventory: flp001 and flp002 are TST's, flp003 ITS's, TRG has none.
    let store_dir = tempfile::tempdir().expect("store dir");
    let store = store_dir.path().join("store.yaml");
    std::fs::write(&store, INVENTORY).expect("store file");
    let store_arg = store.to_str().expect("a UTF-8 path");
    let (port, o2port, _daemon) = daemon(&ns, &["--config-store", store_arg]).await;
    let mut api = crate::support::wait_for("the daemon to listen", WAIT, || async move {
        pb::env_bridge_client::EnvBridgeClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .ok()
    })
    .await;

    // Created through the daemon's own API, up in STANDBY.
    let created = fixture::create(
        &mut api,
        pb::CreateEnvironmentRequest {
            workflow: "readout-dataflow".into(),
            variables: [("hosts".to_string(), r#"["flp001","flp002"]"#.to_string())].into(),
            env_id: "o2c".into(),
            wait: true,
            timeout_seconds: 60,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(created.outcome, "reached", "{}", created.message);
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;

    let mut o2c = ControlClient::connect(format!("http://127.0.0.1:{o2port}"))
        .await
        .expect("connect to the o2control listener");

    let info = o2c
        .get_framework_info(o2::GetFrameworkInfoRequest {})
        .await
        .expect("GetFrameworkInfo")
        .into_inner();
    let version = info.version.expect("a version");
    assert_eq!(version.version_str, env!("CARGO_PKG_VERSION"));
    assert_eq!(version.product_name, "envbridge");
    assert!(
        info.instance_name.starts_with("envbridge@"),
        "{}",
        info.instance_name
    );
    assert_eq!(info.environments_count, 1);
    assert_eq!(info.tasks_count as u32, created.tasks);
    assert_eq!(info.hosts_count, 2);
    assert!(!info.framework_id.is_empty());

    let envs = o2c
        .get_environments(o2::GetEnvironmentsRequest {
            show_all: true,
            show_task_infos: true,
            ..Default::default()
        })
        .await
        .expect("GetEnvironments")
        .into_inner();
    assert_eq!(envs.framework_id, info.framework_id);
    let e = envs
        .environments
        .iter()
        .find(|e| e.id == created.id)
        .unwrap_or_else(|| panic!("{} not in {:?}", created.id, envs.environments));
    assert_eq!(e.state, "DEPLOYED");
    assert_eq!(e.root_role, "readout-dataflow");
    assert_eq!(e.number_of_tasks as u32, created.tasks);
    assert_eq!(e.number_of_active_tasks as u32, created.tasks);
    assert_eq!(e.number_of_hosts, 2);
    assert_eq!(e.tasks.len() as u32, created.tasks);
    assert!(
        (now_ms - 120_000..=now_ms).contains(&e.created_when),
        "createdWhen {} is not the creation time (now {now_ms})",
        e.created_when
    );

    let one = o2c
        .get_environment(o2::GetEnvironmentRequest {
            id: created.id.clone(),
            show_workflow_tree: false,
        })
        .await
        .expect("GetEnvironment")
        .into_inner()
        .environment
        .expect("the environment");
    assert_eq!((one.id.as_str(), one.state.as_str()), ("o2c", "DEPLOYED"));
    // The caller's variables are the anchor's user variables.
    assert_eq!(
        one.user_vars.get("hosts").map(String::as_str),
        Some(r#"["flp001","flp002"]"#),
        "{:?}",
        one.user_vars
    );
    assert!(
        one.description.contains("StfBuilder"),
        "{}",
        one.description
    );
    let missing = o2c
        .get_environment(o2::GetEnvironmentRequest {
            id: "no-such-env".into(),
            show_workflow_tree: false,
        })
        .await
        .expect_err("no such environment");
    assert_eq!(missing.code(), tonic::Code::NotFound);

    let tasks = o2c
        .get_tasks(o2::GetTasksRequest {})
        .await
        .expect("GetTasks")
        .into_inner()
        .tasks;
    assert_eq!(tasks.len() as u32, created.tasks);
    let hosts: BTreeSet<&str> = tasks
        .iter()
        .filter_map(|t| t.deployment_info.as_ref())
        .map(|d| d.hostname.as_str())
        .collect();
    assert_eq!(hosts, BTreeSet::from(["flp001", "flp002"]));
    let classes: BTreeSet<&str> = tasks.iter().map(|t| t.class_name.as_str()).collect();
    assert!(classes.iter().any(|c| c.contains("readout")), "{classes:?}");
    for t in &tasks {
        assert_eq!(
            (t.state.as_str(), t.status.as_str()),
            ("STANDBY", "ACTIVE"),
            "{t:?}"
        );
        assert!(!t.task_id.is_empty() && t.locked, "{t:?}");
    }
    let ids: BTreeSet<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    let listed: BTreeSet<&str> = e.tasks.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(
        ids, listed,
        "GetTasks and GetEnvironments list the same tasks"
    );
    // One task in full: its path and its environment.
    let first = &tasks[0];
    let one = o2c
        .get_task(o2::GetTaskRequest {
            task_id: first.task_id.clone(),
        })
        .await
        .expect("GetTask")
        .into_inner()
        .task
        .expect("a task");
    assert_eq!(one.env_id, created.id);
    assert_eq!(one.short_info.as_ref(), Some(first));
    assert!(
        one.task_path.starts_with("readout-dataflow."),
        "{}",
        one.task_path
    );
    // Its command, from the Task object.
    let command = one.command_info.as_ref().expect("commandInfo");
    assert!(!command.value.is_empty(), "{command:?}");
    let none = o2c
        .get_task(o2::GetTaskRequest {
            task_id: "no-such-task".into(),
        })
        .await
        .expect_err("no such task");
    assert_eq!(none.code(), tonic::Code::NotFound);

    // A viewer-role listener (the default) refuses what changes something, naming roles.
    let e = o2c
        .control_environment(o2::ControlEnvironmentRequest {
            id: created.id.clone(),
            r#type: o2::control_environment_request::Optype::Configure as i32,
            request_user: None,
        })
        .await
        .expect_err("a viewer may not control");
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(
        e.message().contains("ControlEnvironment") && e.message().contains("operator role"),
        "{}",
        e.message()
    );
    // The workflows directory as the anchor's one repository, public templates with their
    // public variables.
    let t = o2c
        .get_workflow_templates(o2::GetWorkflowTemplatesRequest::default())
        .await
        .expect("GetWorkflowTemplates")
        .into_inner();
    let names: Vec<&str> = t
        .workflow_templates
        .iter()
        .map(|w| w.template.as_str())
        .collect();
    assert_eq!(names, ["readout-dataflow"]);
    let w = &t.workflow_templates[0];
    assert_eq!(
        (w.repo.as_str(), w.revision.as_str()),
        ("envbridge", "main")
    );
    assert!(w.description.contains("StfBuilder"), "{}", w.description);
    let dd = w.var_spec_map.get("dd_enabled").expect("a public variable");
    assert_eq!(dd.r#type, o2::var_spec_message::Type::Bool as i32);
    let repos = o2c
        .list_repos(o2::ListReposRequest {
            get_revisions: true,
        })
        .await
        .expect("ListRepos")
        .into_inner();
    assert_eq!(repos.repos.len(), 1);
    assert_eq!(
        (
            repos.repos[0].name.as_str(),
            repos.repos[0].default,
            repos.repos[0].revisions.as_slice()
        ),
        ("envbridge", true, &["main".to_string()][..])
    );
    // The workflow tree: the root holds every task, one role per host below it.
    let shown = o2c
        .get_environment(o2::GetEnvironmentRequest {
            id: created.id.clone(),
            show_workflow_tree: true,
        })
        .await
        .expect("GetEnvironment with the tree")
        .into_inner();
    let root = shown.workflow.expect("showWorkflowTree fills the tree");
    assert_eq!(root.full_path, "readout-dataflow");
    let in_tree: BTreeSet<&str> = root.task_ids.iter().map(String::as_str).collect();
    assert_eq!(in_tree, ids, "the root holds every task");
    assert_eq!(
        (root.state.as_str(), root.status.as_str()),
        ("STANDBY", "ACTIVE")
    );
    assert!(!root.roles.is_empty());
    // GetRoles: the roles one level below the root, by the anchor's glob.
    let roles = o2c
        .get_roles(o2::GetRolesRequest {
            env_id: created.id.clone(),
            path_spec: "readout-dataflow.*".into(),
        })
        .await
        .expect("GetRoles")
        .into_inner()
        .roles;
    assert_eq!(roles.len(), root.roles.len(), "{roles:?}");
    let below: BTreeSet<&str> = roles
        .iter()
        .flat_map(|r| r.task_ids.iter().map(String::as_str))
        .collect();
    assert_eq!(below, ids, "the roles below the root cover every task");
    for r in &roles {
        assert_eq!(r.full_path.matches('.').count(), 1, "{}", r.full_path);
    }
    let e = o2c
        .get_roles(o2::GetRolesRequest {
            env_id: "no-such-env".into(),
            path_spec: "*".into(),
        })
        .await
        .expect_err("no such environment");
    assert_eq!(e.code(), tonic::Code::NotFound);
    // Detectors: the environment is on TST's hosts, so TST is active and the rest available.
    assert_eq!(
        one_env_detectors(&mut o2c, &created.id).await,
        (vec!["TST".to_string()], 2)
    );
    let active = o2c
        .get_active_detectors(o2::Empty {})
        .await
        .expect("GetActiveDetectors")
        .into_inner()
        .detectors;
    assert_eq!(active, ["TST"]);
    let available = o2c
        .get_available_detectors(o2::Empty {})
        .await
        .expect("GetAvailableDetectors")
        .into_inner()
        .detectors;
    assert_eq!(available, ["ITS", "TRG"]);
    let fw = o2c
        .get_framework_info(o2::GetFrameworkInfoRequest {})
        .await
        .expect("GetFrameworkInfo")
        .into_inner();
    assert_eq!(fw.detectors_in_instance, ["ITS", "TRG", "TST"]);
    assert_eq!(
        (fw.active_detectors, fw.available_detectors),
        (active, available)
    );
    // One environment per detector: a second one on a TST host is refused naming TST and
    // the environment holding it, and nothing is written.
    let refused = api
        .create_environment(pb::CreateEnvironmentRequest {
            workflow: "readout-dataflow".into(),
            variables: [("hosts".to_string(), r#"["flp002"]"#.to_string())].into(),
            env_id: "o2c-second".into(),
            ..Default::default()
        })
        .await
        .expect_err("TST is in use");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    let msg = refused.message();
    assert!(
        msg.contains("detector TST")
            && msg.contains("/o2c:")
            && msg.contains("nothing was written"),
        "{msg}"
    );
    let envs = o2c
        .get_environments(o2::GetEnvironmentsRequest::default())
        .await
        .expect("GetEnvironments")
        .into_inner()
        .environments;
    assert_eq!(envs.len(), 1, "nothing written for the refused create");
    // apricot on the same listener: the inventory and the runtime entries.
    let mut ap = apricot_client::ApricotClient::connect(format!("http://127.0.0.1:{o2port}"))
        .await
        .expect("apricot connects");
    let dets = ap
        .list_detectors(ap_pb::DetectorsRequest { get_all: false })
        .await
        .expect("ListDetectors")
        .into_inner()
        .detectors;
    assert_eq!(dets, ["ITS", "TST"], "TRG only with getAll");
    let hosts = ap
        .get_host_inventory(ap_pb::HostGetRequest {
            detector: "TST".into(),
        })
        .await
        .expect("GetHostInventory")
        .into_inner()
        .hosts;
    assert_eq!(hosts, ["flp001", "flp002"]);
    let det = ap
        .get_detector_for_host(ap_pb::HostRequest {
            hostname: "flp003".into(),
        })
        .await
        .expect("GetDetectorForHost")
        .into_inner()
        .payload;
    assert_eq!(det, "ITS");
    let layout = ap
        .get_runtime_entry(ap_pb::GetRuntimeEntryRequest {
            component: "COG-v1".into(),
            key: "layout".into(),
        })
        .await
        .expect("GetRuntimeEntry")
        .into_inner()
        .payload;
    assert_eq!(layout, r#"{"tabs": []}"#);
    let keys = ap
        .list_runtime_entries(ap_pb::ListRuntimeEntriesRequest {
            component: "COG-v1".into(),
        })
        .await
        .expect("ListRuntimeEntries")
        .into_inner()
        .payload;
    assert_eq!(keys, ["layout"]);
    let e = ap
        .get_runtime_entry(ap_pb::GetRuntimeEntryRequest {
            component: "COG-v1".into(),
            key: "nothing".into(),
        })
        .await
        .expect_err("no such entry");
    assert_eq!(e.code(), tonic::Code::NotFound);
    // No integration plugins configured: the anchor's plugins, listed disabled.
    let services = o2c
        .get_integrated_services(o2::Empty {})
        .await
        .expect("GetIntegratedServices")
        .into_inner()
        .services;
    assert!(services.contains_key("dcs"), "{services:?}");
    assert!(services.values().all(|s| !s.enabled), "{services:?}");
    // Not served yet: UNIMPLEMENTED, naming the method.
    let e = o2c
        .teardown(o2::TeardownRequest::default())
        .await
        .expect_err("not served yet");
    assert_eq!(e.code(), tonic::Code::Unimplemented);
    assert!(e.message().contains("Teardown"), "{}", e.message());

    // gRPC health on the same listener.
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{o2port}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect"),
    );
    let h = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "o2control.Control".into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(
        h.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    // And reflection: the service, and the event stream's own package.
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let mut reflection = ServerReflectionClient::new(
        tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{o2port}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect"),
    );
    let asks = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("events.Event".into()),
    ]
    .map(|m| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    });
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(asks))
        .await
        .expect("reflection")
        .into_inner();
    match answers
        .message()
        .await
        .expect("answer")
        .and_then(|a| a.message_response)
    {
        Some(MessageResponse::ListServicesResponse(l)) => {
            let names: BTreeSet<String> = l.service.into_iter().map(|s| s.name).collect();
            assert!(names.contains("o2control.Control"), "{names:?}");
        }
        other => panic!("ListServices: {other:?}"),
    }
    match answers
        .message()
        .await
        .expect("answer")
        .and_then(|a| a.message_response)
    {
        Some(MessageResponse::FileDescriptorResponse(f)) => {
            assert!(!f.file_descriptor_proto.is_empty())
        }
        other => panic!("events.Event: {other:?}"),
    }

    let gone = fixture::destroy(&mut api, &created.id, 60).await;
    assert!(gone.gone, "{}", gone.message);
}

/// The anchor's cycle through o2control alone: NewEnvironment answers CONFIGURED with its
/// tasks; START_ACTIVITY takes a run number from the cluster's counter, the next START a
/// larger one; STOP_ACTIVITY, RESET (-> DEPLOYED), DestroyEnvironment. A variable that is not
/// public is refused, naming it, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_o2control_client_runs_the_anchors_cycle_with_run_numbers() {
    use o2::control_environment_request::Optype;
    let ns = Setup::shared("daemon-o2control-cycle").await;
    let _sim = ns.sim(SimConfig::default());
    let run_numbers = format!("{}/run-numbers", ns.name);
    let (mut o2c, _daemon) = operator_listener(&ns, &run_numbers).await;
    let user = Some(envbridge::server::o2control::pb::common::User {
        name: "shifter".into(),
        ..Default::default()
    });
    let hosts = r#"["flp001","flp002"]"#.to_string();

    // Not public: refused, naming the variable; no environment written.
    let e = o2c
        .new_environment(o2::NewEnvironmentRequest {
            workflow_template: "envbridge/workflows/readout-dataflow@main".into(),
            vars: [
                ("hosts".to_string(), hosts.clone()),
                ("not_a_public_variable".to_string(), "1".to_string()),
            ]
            .into(),
            request_user: user.clone(),
            ..Default::default()
        })
        .await
        .expect_err("a variable that is not public");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{}", e.message());
    assert!(
        e.message().contains("not_a_public_variable"),
        "{}",
        e.message()
    );
    let listed = o2c
        .get_environments(o2::GetEnvironmentsRequest::default())
        .await
        .expect("GetEnvironments")
        .into_inner();
    assert!(listed.environments.is_empty(), "{:?}", listed.environments);

    let created = o2c
        .new_environment(o2::NewEnvironmentRequest {
            workflow_template: "envbridge/workflows/readout-dataflow@main".into(),
            vars: [("hosts".to_string(), hosts.clone())].into(),
            request_user: user.clone(),
            ..Default::default()
        })
        .await
        .expect("NewEnvironment")
        .into_inner()
        .environment
        .expect("the environment");
    assert_eq!(created.state, "CONFIGURED", "{created:?}");
    assert_eq!(created.root_role, "readout-dataflow");
    assert!(!created.tasks.is_empty());
    assert_eq!(created.tasks.len() as i32, created.number_of_tasks);
    for t in &created.tasks {
        assert_eq!(t.state, "CONFIGURED", "{t:?}");
    }
    let id = created.id.clone();
    // Subscribe with an environment's id: its changes, as the anchor's events.
    let mut events = o2c
        .subscribe(o2::SubscribeRequest { id: id.clone() })
        .await
        .expect("Subscribe")
        .into_inner();
    let control = |t: Optype| o2::ControlEnvironmentRequest {
        id: id.clone(),
        r#type: t as i32,
        request_user: user.clone(),
    };

    let started = o2c
        .control_environment(control(Optype::StartActivity))
        .await
        .expect("START_ACTIVITY")
        .into_inner();
    assert_eq!(started.state, "RUNNING");
    assert!(started.current_run_number > 0, "{started:?}");
    assert!(started.end_of_transition >= started.start_of_transition);
    let stopped = o2c
        .control_environment(control(Optype::StopActivity))
        .await
        .expect("STOP_ACTIVITY")
        .into_inner();
    assert_eq!(stopped.state, "CONFIGURED");
    // The run's variables among the user variables, as the anchor keeps them.
    let vars = o2c
        .get_environment(o2::GetEnvironmentRequest {
            id: id.clone(),
            show_workflow_tree: false,
        })
        .await
        .expect("GetEnvironment")
        .into_inner()
        .environment
        .expect("the environment")
        .user_vars;
    let ms = |k: &str| -> i64 {
        vars.get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in {vars:?}"))
    };
    assert_eq!(
        vars.get("run_number"),
        Some(&started.current_run_number.to_string())
    );
    assert!(
        ms("run_start_time_ms") >= started.start_of_transition,
        "{vars:?}"
    );
    assert!(ms("run_end_time_ms") >= ms("run_start_time_ms"), "{vars:?}");
    assert_eq!(vars.get("hosts"), Some(&hosts));
    // The stream told the run: the environment RUNNING with its run number, its tasks too.
    let (mut env_running, mut task_running) = (false, false);
    while !(env_running && task_running) {
        let e = tokio::time::timeout(WAIT, events.message())
            .await
            .expect("events in time")
            .expect("the stream")
            .expect("an event");
        match e.payload {
            Some(ev::event::Payload::EnvironmentEvent(x)) => {
                assert_eq!(x.environment_id, id);
                env_running |= x.state == "RUNNING" && x.run_number == started.current_run_number;
            }
            Some(ev::event::Payload::TaskEvent(t)) => {
                assert_eq!(t.environment_id, id);
                task_running |= t.state == "RUNNING" && !t.hostname.is_empty();
            }
            other => panic!("{other:?}"),
        }
    }
    let again = o2c
        .control_environment(control(Optype::StartActivity))
        .await
        .expect("START_ACTIVITY again")
        .into_inner();
    assert!(
        again.current_run_number > started.current_run_number,
        "run {} after run {}",
        again.current_run_number,
        started.current_run_number
    );
    o2c.control_environment(control(Optype::StopActivity))
        .await
        .expect("STOP_ACTIVITY again");
    let reset = o2c
        .control_environment(control(Optype::Reset))
        .await
        .expect("RESET")
        .into_inner();
    assert_eq!(reset.state, "DEPLOYED");
    // GO_ERROR: the environment is in ERROR, its tasks where they were (the anchor's).
    let error = o2c
        .control_environment(control(Optype::GoError))
        .await
        .expect("GO_ERROR")
        .into_inner();
    assert_eq!(error.state, "ERROR");
    // The counter lives in the cluster: the last number given.
    let cm: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(ns.client.clone(), &ns.name);
    let last = cm
        .get("run-numbers")
        .await
        .expect("the run numbers ConfigMap");
    assert_eq!(
        last.data
            .unwrap_or_default()
            .get("last")
            .map(String::as_str),
        Some(again.current_run_number.to_string().as_str())
    );

    let destroyed = o2c
        .destroy_environment(o2::DestroyEnvironmentRequest {
            id: id.clone(),
            request_user: user.clone(),
            ..Default::default()
        })
        .await
        .expect("DestroyEnvironment")
        .into_inner();
    let killed = destroyed.cleanup_tasks_reply.expect("cleanup").killed_tasks;
    assert_eq!(killed.len(), created.tasks.len());
    let missing = o2c
        .get_environment(o2::GetEnvironmentRequest {
            id,
            show_workflow_tree: false,
        })
        .await
        .expect_err("gone");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    // The subscription ends with the environment, its last word the teardown.
    let mut last = None;
    while let Some(e) = tokio::time::timeout(WAIT, events.message())
        .await
        .expect("the stream ends in time")
        .expect("the stream")
    {
        last = Some(e);
    }
    match last.and_then(|e| e.payload) {
        Some(ev::event::Payload::EnvironmentEvent(x)) => {
            assert_eq!(
                (x.state.as_str(), x.message.as_str()),
                ("DONE", "environment teardown complete")
            )
        }
        other => panic!("the last event: {other:?}"),
    }
}

/// An environment's `includedDetectors` and `numberOfFlps`, from GetEnvironments.
async fn one_env_detectors(
    o2c: &mut ControlClient<tonic::transport::Channel>,
    id: &str,
) -> (Vec<String>, i32) {
    let envs = o2c
        .get_environments(o2::GetEnvironmentsRequest::default())
        .await
        .expect("GetEnvironments")
        .into_inner()
        .environments;
    let e = envs.iter().find(|e| e.id == id).expect("the environment");
    (e.included_detectors.clone(), e.number_of_flps)
}

/// A site's run-number service (`--o2control-run-numbers http://...`): START_ACTIVITY asks it
/// once per run, with the environment's id, and the run gets its number; an answer without a
/// usable number fails the START naming the service, and nothing is started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_numbers_come_from_the_site_s_service_when_one_is_configured() {
    use o2::control_environment_request::Optype;
    use std::sync::{Arc, Mutex};
    let asked: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let seen = asked.clone();
    let app = axum::Router::new().route(
        "/runs",
        axum::routing::post(move |axum::Json(v): axum::Json<serde_json::Value>| {
            let seen = seen.clone();
            async move {
                let mut s = seen.lock().unwrap();
                s.push(v);
                // The first run gets 4242; the next answer carries no number.
                match s.len() {
                    1 => axum::Json(serde_json::json!({"runNumber": 4242})),
                    _ => axum::Json(serde_json::json!({"ok": true})),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/runs", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let ns = Setup::shared("daemon-o2control-runs").await;
    let _sim = ns.sim(SimConfig::default());
    let (mut o2c, _daemon) = operator_listener(&ns, &url).await;
    let created = o2c
        .new_environment(o2::NewEnvironmentRequest {
            workflow_template: "readout-dataflow".into(),
            vars: [("hosts".to_string(), r#"["flp001"]"#.to_string())].into(),
            ..Default::default()
        })
        .await
        .expect("NewEnvironment")
        .into_inner()
        .environment
        .expect("the environment");
    let control = |t: Optype| o2::ControlEnvironmentRequest {
        id: created.id.clone(),
        r#type: t as i32,
        request_user: None,
    };
    let started = o2c
        .control_environment(control(Optype::StartActivity))
        .await
        .expect("START_ACTIVITY")
        .into_inner();
    assert_eq!(started.current_run_number, 4242);
    {
        let asked = asked.lock().unwrap();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0]["function"], "NewRunNumber");
        assert_eq!(asked[0]["environmentId"], created.id.as_str());
    }
    o2c.control_environment(control(Optype::StopActivity))
        .await
        .expect("STOP_ACTIVITY");
    let e = o2c
        .control_environment(control(Optype::StartActivity))
        .await
        .expect_err("no number in the answer");
    assert!(
        e.message().contains(&url) && e.message().contains("runNumber"),
        "{}",
        e.message()
    );
    let now = o2c
        .get_environment(o2::GetEnvironmentRequest {
            id: created.id.clone(),
            show_workflow_tree: false,
        })
        .await
        .expect("GetEnvironment")
        .into_inner()
        .environment
        .expect("the environment");
    assert_eq!(now.state, "CONFIGURED", "nothing was started");
    o2c.destroy_environment(o2::DestroyEnvironmentRequest {
        id: created.id,
        ..Default::default()
    })
    .await
    .expect("DestroyEnvironment");
}

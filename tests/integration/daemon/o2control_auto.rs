//! NewAutoEnvironment with Subscribe, as coconut's `environment create --auto` pairs them
//! (docs/o2control.md): the subscription opened first under an id of the client's, the
//! automatic environment created under the same id. It deploys, configures and starts by
//! itself; once its run ends (here a shifter's STOP_ACTIVITY) it is reset and destroyed,
//! and the stream ends with its teardown.

use envbridge::server::o2control::pb::events as ev;
use envbridge::server::o2control::pb::o2control as o2;

use super::fixture::Setup;
use super::o2control::{WAIT, operator_listener};
use super::sim::SimConfig;

/// The next event of the stream, in time.
async fn next(events: &mut tonic::Streaming<ev::Event>) -> Option<ev::Event> {
    tokio::time::timeout(WAIT, events.message())
        .await
        .expect("an event in time")
        .expect("the stream")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_automatic_environment_runs_by_itself_and_its_stream_ends_with_it() {
    let ns = Setup::shared("daemon-o2control-auto").await;
    let _sim = ns.sim(SimConfig::default());
    let run_numbers = format!("{}/run-numbers", ns.name);
    let (mut o2c, _daemon) = operator_listener(&ns, &run_numbers).await;
    let user = Some(envbridge::server::o2control::pb::common::User {
        name: "calibration".into(),
        ..Default::default()
    });

    // A refused variable: the create's error is NewAutoEnvironment's answer, nothing written.
    let mut refused = o2c
        .subscribe(o2::SubscribeRequest {
            id: "sub-bad".into(),
        })
        .await
        .expect("Subscribe")
        .into_inner();
    let e = o2c
        .new_auto_environment(o2::NewAutoEnvironmentRequest {
            workflow_template: "readout-dataflow".into(),
            vars: [("not_public".to_string(), "1".to_string())].into(),
            id: "sub-bad".into(),
            request_user: user.clone(),
        })
        .await
        .expect_err("a variable that is not public");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{}", e.message());
    match next(&mut refused).await.and_then(|e| e.payload) {
        Some(ev::event::Payload::EnvironmentEvent(x)) => {
            assert_eq!(x.state, "ERROR");
            assert!(x.error.contains("not_public"), "{x:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(next(&mut refused).await.is_none(), "the stream ends");

    // Subscribe first, as coconut does; the environment comes under the same id.
    let mut events = o2c
        .subscribe(o2::SubscribeRequest { id: "sub-1".into() })
        .await
        .expect("Subscribe")
        .into_inner();
    o2c.new_auto_environment(o2::NewAutoEnvironmentRequest {
        workflow_template: "envbridge/workflows/readout-dataflow@main".into(),
        vars: [("hosts".to_string(), r#"["flp001","flp002"]"#.to_string())].into(),
        id: "sub-1".into(),
        request_user: user.clone(),
    })
    .await
    .expect("NewAutoEnvironment");
    // A second environment under the same id is refused.
    let twice = o2c
        .new_auto_environment(o2::NewAutoEnvironmentRequest {
            workflow_template: "readout-dataflow".into(),
            vars: [("hosts".to_string(), r#"["flp003"]"#.to_string())].into(),
            id: "sub-1".into(),
            request_user: user.clone(),
        })
        .await
        .expect_err("one environment per subscription");
    assert_eq!(twice.code(), tonic::Code::AlreadyExists);

    // It deploys, configures and starts by itself; the stream tells it, tasks included.
    let mut env_id = String::new();
    let mut states = Vec::new();
    let mut task_events = 0;
    while !states.iter().any(|s| s == "RUNNING") {
        match next(&mut events).await.and_then(|e| e.payload) {
            Some(ev::event::Payload::EnvironmentEvent(x)) => {
                assert!(x.error.is_empty(), "{x:?}");
                env_id = x.environment_id.clone();
                if states.last() != Some(&x.state) {
                    states.push(x.state.clone());
                }
            }
            Some(ev::event::Payload::TaskEvent(_)) => task_events += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(task_events > 0, "task events too");
    for s in ["DEPLOYED", "CONFIGURED", "RUNNING"] {
        assert!(states.contains(&s.to_string()), "{s} in {states:?}");
    }
    let running = o2c
        .get_environment(o2::GetEnvironmentRequest {
            id: env_id.clone(),
            show_workflow_tree: false,
        })
        .await
        .expect("GetEnvironment")
        .into_inner()
        .environment
        .expect("the environment");
    assert_eq!(running.state, "RUNNING");
    assert!(running.current_run_number > 0);

    // The run ends (a shifter stops it): reset, destroyed, the stream's last word.
    o2c.control_environment(o2::ControlEnvironmentRequest {
        id: env_id.clone(),
        r#type: o2::control_environment_request::Optype::StopActivity as i32,
        request_user: user.clone(),
    })
    .await
    .expect("STOP_ACTIVITY");
    let mut last = None;
    while let Some(e) = next(&mut events).await {
        last = e.payload;
    }
    match last {
        Some(ev::event::Payload::EnvironmentEvent(x)) => {
            assert_eq!(
                (x.state.as_str(), x.message.as_str()),
                ("DONE", "environment teardown complete"),
                "{x:?}"
            )
        }
        other => panic!("the last event: {other:?}"),
    }
    let gone = o2c
        .get_environment(o2::GetEnvironmentRequest {
            id: env_id,
            show_workflow_tree: false,
        })
        .await
        .expect_err("destroyed");
    assert_eq!(gone.code(), tonic::Code::NotFound);
}

//! The simulator answers as the real processes do on the wire (../shared/reference/occ-wire.md),
//! so that a client a real device would reject cannot pass the tests.

use std::time::Duration;

use envbridge::control::client::VariantChannel;
use envbridge::control::json::JsonCodec;
use envbridge::control::pb;
use envbridge::control::wire::{Method, Variant};
use envbridge::control::{ControlClient, ControlError};
use envbridge::plan::ControlMode;
use envbridge::state::{Event, State};
use futures::StreamExt;

use super::protocol::SimProc;

const DEADLINE: Duration = Duration::from_secs(5);

async fn raw_transition(
    sim: &SimProc,
    variant: Variant,
    src: &str,
    event: &str,
    deadline: Duration,
) -> Result<pb::TransitionReply, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", sim.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(VariantChannel::new(channel, variant));
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(pb::TransitionRequest {
        src_state: src.into(),
        transition_event: event.into(),
        arguments: vec![],
    });
    req.set_timeout(deadline);
    let path = Method::Transition.path(variant);
    let r = match variant {
        Variant::Json => {
            grpc.unary(
                req,
                path,
                JsonCodec::<pb::TransitionRequest, pb::TransitionReply>::default(),
            )
            .await
        }
        Variant::Protobuf => {
            grpc.unary(
                req,
                path,
                tonic_prost::ProstCodec::<pb::TransitionRequest, pb::TransitionReply>::default(),
            )
            .await
        }
    };
    r.map(|r| r.into_inner())
}

#[tokio::test]
async fn direct_mode_answers_as_the_occ_library() {
    let ctl = ControlClient::default();
    let sim = SimProc::start(&[], &[]).await;
    // Source-state mismatch: INVALID_ARGUMENT. Unknown or lower-case event: UNKNOWN.
    let e = raw_transition(&sim, Variant::Protobuf, "RUNNING", "STOP", DEADLINE)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    for ev in ["configure", "LAUNCH"] {
        let e = raw_transition(&sim, Variant::Protobuf, "STANDBY", ev, DEADLINE)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unknown, "{ev}: {e:?}");
    }
    // A known event invalid here: OK status, ok=false, DEVICE_INTENTIONAL, state unchanged.
    let r = raw_transition(&sim, Variant::Protobuf, "STANDBY", "START", DEADLINE)
        .await
        .unwrap();
    assert!(!r.ok);
    assert_eq!(r.state, "STANDBY");
    assert_eq!(r.trigger, pb::StateChangeTrigger::DeviceIntentional as i32);
    // No bare paths.
    let e = raw_transition(&sim, Variant::Json, "STANDBY", "CONFIGURE", DEADLINE)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    // EXIT: DONE, then the process ends and its port closes.
    let ep = sim.ep(ControlMode::Direct);
    let at = ctl
        .transition(&ep, State::Standby, Event::Exit, &[], DEADLINE)
        .await
        .unwrap();
    assert_eq!(at, State::Done);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let e = ctl.get_state(&ep, DEADLINE).await.unwrap_err();
    assert!(
        matches!(
            e,
            ControlError::Rpc {
                code: tonic::Code::Unavailable,
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test]
async fn fairmq_mode_answers_as_occlite() {
    let ctl = ControlClient::default();
    let sim = SimProc::start(&["--mode", "fairmq"], &[]).await;
    // Mismatch: CANCELLED; unknown event (a run-control name): UNKNOWN.
    let e = raw_transition(&sim, Variant::Json, "READY", "RUN", DEADLINE)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Cancelled, "{e:?}");
    let e = raw_transition(&sim, Variant::Json, "IDLE", "CONFIGURE", DEADLINE)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unknown, "{e:?}");
    // A valid step invalid in this state is never answered (until the next change).
    let e = raw_transition(
        &sim,
        Variant::Json,
        "IDLE",
        "RUN",
        Duration::from_millis(700),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            e.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{e:?}"
    );
    // No StateStream, no protobuf on full paths.
    let mut s = ctl.state_stream(&sim.ep(ControlMode::Direct));
    let first = tokio::time::timeout(DEADLINE, s.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            first,
            Err(ControlError::Rpc {
                code: tonic::Code::Unimplemented,
                ..
            })
        ),
        "{first:?}"
    );
}

#[tokio::test]
async fn a_fairmq_device_that_fails_by_itself_sends_one_event_and_exits() {
    let ctl = ControlClient::default();
    let sim = SimProc::start(&["--mode", "fairmq", "--fail-in", "RUNNING=500ms"], &[]).await;
    let ep = sim.ep(ControlMode::Fairmq);
    let mut events = ctl.event_stream(&ep);
    let mut at = State::Standby;
    for ev in [Event::Configure, Event::Start] {
        at = ctl.transition(&ep, at, ev, &[], DEADLINE).await.unwrap();
    }
    assert_eq!(at, State::Running);
    let first = tokio::time::timeout(DEADLINE, events.next())
        .await
        .expect("an event within the deadline")
        .expect("one message")
        .expect("ok");
    assert_eq!(first, "NULL_DEVICE_EVENT");
    // Then the stream closes and the process is gone.
    let rest = tokio::time::timeout(DEADLINE, events.next())
        .await
        .expect("the end");
    assert!(rest.is_none() || rest.is_some_and(|r| r.is_err()));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let e = ctl.get_state(&ep, DEADLINE).await.unwrap_err();
    assert!(
        matches!(
            e,
            ControlError::Rpc {
                code: tonic::Code::Unavailable,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        sim.log_text()
            .contains("moves itself from RUNNING to ERROR"),
        "{}",
        sim.log_text()
    );
}

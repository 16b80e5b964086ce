//! The simulator's gRPC server: one hand-written service answering both wire variants
//! (protobuf at `/occ_pb.Occ/<Method>`, JSON at the bare method name; see `wire`), playing
//! the state machine of `machine` with the delays and failures of `config`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt, stream};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::codegen::{Context, Poll, Service};
use tonic::server::{Grpc, ServerStreamingService, UnaryService};
use tonic::{Request, Response, Status};
use tracing::{debug, error, info, warn};

use super::config::{Fate, SimConfig};
use super::machine::Machine;
use crate::control::bare_path_io::BarePathIo;
use crate::control::json::JsonCodec;
use crate::control::pb;
use crate::control::wire::{Method, Variant};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(
        "task simulator refuses to listen on {0}: not a loopback address (pass --allow-non-loopback to insist)"
    )]
    NotLoopback(SocketAddr),
    #[error("task simulator cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("task simulator server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("task simulator crashed on {0} as injected (--crash-on)")]
    Crashed(String),
}

/// Binds the simulator's listen address; only loopback unless explicitly allowed.
pub async fn bind(addr: SocketAddr, allow_non_loopback: bool) -> Result<TcpListener, SimError> {
    if !addr.ip().is_loopback() && !allow_non_loopback {
        return Err(SimError::NotLoopback(addr));
    }
    TcpListener::bind(addr)
        .await
        .map_err(|source| SimError::Bind { addr, source })
}

/// One simulated task process.
#[derive(Debug)]
pub struct Simulator {
    config: SimConfig,
    /// The state GetState and StateStream report (transient ones included).
    reported: watch::Sender<Machine>,
    /// One transition at a time, as a real process handles them.
    turn: tokio::sync::Mutex<()>,
    crashed: CancellationToken,
    crashed_on: std::sync::Mutex<Option<String>>,
    pid: i32,
}

impl Simulator {
    pub fn new(config: SimConfig) -> Arc<Simulator> {
        let (reported, _) = watch::channel(Machine::initial(config.mode));
        Arc::new(Simulator {
            config,
            reported,
            turn: tokio::sync::Mutex::new(()),
            crashed: CancellationToken::new(),
            crashed_on: std::sync::Mutex::new(None),
            pid: i32::try_from(std::process::id()).unwrap_or(0),
        })
    }

    /// The state it would report now.
    pub fn state(&self) -> Machine {
        *self.reported.borrow()
    }

    async fn transition(
        &self,
        req: pb::TransitionRequest,
        variant: Variant,
    ) -> Result<pb::TransitionReply, Status> {
        let _turn = self.turn.lock().await;
        let current = self.state();
        let event = req.transition_event.clone();
        let mv = current
            .begin(&req.src_state, &event)
            .inspect_err(|r| warn!("task simulator rejected {event:?}: {r}"))
            .map_err(|r| Status::invalid_argument(r.to_string()))?;
        info!(
            "task simulator received transition {event} in {current} ({} arguments, {variant:?})",
            req.arguments.len(),
            current = current.name()
        );
        for a in &req.arguments {
            debug!("task simulator argument {} = {}", a.key, a.value);
        }
        let fate = self.config.fate(mv.requested);
        match fate {
            Fate::Crash => {
                error!("task simulator crashing on {event} as injected (--crash-on)");
                if let Ok(mut c) = self.crashed_on.lock() {
                    *c = Some(event.clone());
                }
                self.crashed.cancel();
                std::future::pending::<()>().await;
            }
            Fate::Hang => {
                warn!(
                    "task simulator hanging on {event} as injected (--hang-on): it will never reply"
                );
                std::future::pending::<()>().await;
            }
            _ => {}
        }
        let reply = |state: Machine, ok: bool, trigger: pb::StateChangeTrigger| {
            info!(
                "task simulator transition {event}: {} -> {} ok={ok}",
                current.name(),
                state.name()
            );
            pb::TransitionReply {
                trigger: trigger as i32,
                state: state.name().to_string(),
                transition_event: event.clone(),
                ok,
            }
        };
        let Some(to) = mv.to else {
            warn!(
                "task simulator: {event} does not apply in {}",
                current.name()
            );
            return Ok(reply(
                current,
                false,
                pb::StateChangeTrigger::DeviceIntentional,
            ));
        };
        if let Some(t) = mv.transient {
            self.reported.send_replace(t);
        }
        let delay = self.config.delay_for(mv.requested);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let (state, ok, trigger) = match fate {
            Fate::Fail => {
                warn!("task simulator failing {event} as injected (--fail-on)");
                (current.error(), false, pb::StateChangeTrigger::DeviceError)
            }
            Fate::Stick => {
                warn!(
                    "task simulator stays in {} on {event} as injected (--stuck-on)",
                    current.name()
                );
                (current, false, pb::StateChangeTrigger::DeviceIntentional)
            }
            _ => (to, true, pb::StateChangeTrigger::Executor),
        };
        self.reported.send_replace(state);
        Ok(reply(state, ok, trigger))
    }

    fn get_state(&self) -> pb::GetStateReply {
        pb::GetStateReply {
            state: self.state().name().to_string(),
            pid: self.pid,
        }
    }

    /// The current state, then every change, ending after a final state (DONE/EXITING).
    fn state_stream(&self) -> BoxStream<pb::StateStreamReply> {
        let rx = self.reported.subscribe();
        stream::unfold((rx, true, false), |(mut rx, first, done)| async move {
            if done || (!first && rx.changed().await.is_err()) {
                return None;
            }
            let m = *rx.borrow_and_update();
            let transient = matches!(m, Machine::Fairmq(s) if s.is_transient());
            let reply = pb::StateStreamReply {
                r#type: if transient {
                    pb::StateType::StateIntermediate
                } else {
                    pb::StateType::StateStable
                } as i32,
                state: m.name().to_string(),
            };
            Some((Ok(reply), (rx, false, m.is_final())))
        })
        .boxed()
    }

    /// One device event when the process reaches its final state, then the end.
    fn event_stream(&self) -> BoxStream<pb::EventStreamReply> {
        let mut rx = self.reported.subscribe();
        let kind = match self.config.mode {
            // What the OCClite plugin sends when its device is EXITING.
            super::config::SimMode::Fairmq => pb::DeviceEventType::NullDeviceEvent,
            super::config::SimMode::Direct => pb::DeviceEventType::EndOfStream,
        };
        stream::once(async move {
            let _ = rx.wait_for(|m| m.is_final()).await;
            Ok(pb::EventStreamReply {
                event: Some(pb::DeviceEvent {
                    r#type: kind as i32,
                }),
            })
        })
        .boxed()
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Serves `sim` on `listener` until `shutdown` resolves, or until an injected crash.
pub async fn serve(
    listener: TcpListener,
    sim: Arc<Simulator>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), SimError> {
    let svc = OccService { sim: sim.clone() };
    let server = tonic::transport::Server::builder().serve_with_incoming_shutdown(
        svc,
        // Bare method names (`GetState`, as FairMQ's Go client sends them) become `/GetState`
        // before tonic routes them; see `control::bare_path`.
        TcpListenerStream::new(listener).map(|s| s.map(BarePathIo::server)),
        shutdown,
    );
    tokio::select! {
        r = server => r.map_err(SimError::from),
        _ = sim.crashed.cancelled() => {
            let on = sim.crashed_on.lock().ok().and_then(|c| c.clone()).unwrap_or_default();
            Err(SimError::Crashed(on))
        }
    }
}

#[derive(Clone)]
struct OccService {
    sim: Arc<Simulator>,
}

impl Service<http::Request<tonic::body::Body>> for OccService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let sim = self.sim.clone();
        Box::pin(async move { Ok(dispatch(sim, req).await) })
    }
}

macro_rules! with_codec {
    ($variant:expr, $Enc:ty, $Dec:ty, $kind:ident, $svc:expr, $req:expr) => {
        match $variant {
            Variant::Protobuf => {
                Grpc::new(tonic_prost::ProstCodec::<$Enc, $Dec>::default())
                    .$kind($svc, $req)
                    .await
            }
            Variant::Json => {
                Grpc::new(JsonCodec::<$Enc, $Dec>::default())
                    .$kind($svc, $req)
                    .await
            }
        }
    };
}

async fn dispatch(
    sim: Arc<Simulator>,
    req: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let path = req.uri().path().to_string();
    let method = Method::from_path(&path);
    let variant = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(Variant::from_content_type);
    let (Some(method), Some(variant)) = (method, variant) else {
        warn!("task simulator: no such method {path:?} (content type {variant:?})");
        return Status::unimplemented(format!("task simulator has no method {path:?}")).into_http();
    };
    debug!("task simulator call {path:?} as {variant:?}");
    if sim.crashed.is_cancelled() {
        // In-process crash: the listener is gone, open connections get no service either.
        return Status::unavailable("task simulator crashed (injected)").into_http();
    }
    let s = Svc { sim, variant };
    let mut resp = match method {
        Method::GetState => {
            with_codec!(
                variant,
                pb::GetStateReply,
                pb::GetStateRequest,
                unary,
                s,
                req
            )
        }
        Method::Transition => {
            with_codec!(
                variant,
                pb::TransitionReply,
                pb::TransitionRequest,
                unary,
                s,
                req
            )
        }
        Method::StateStream => with_codec!(
            variant,
            pb::StateStreamReply,
            pb::StateStreamRequest,
            server_streaming,
            s,
            req
        ),
        Method::EventStream => with_codec!(
            variant,
            pb::EventStreamReply,
            pb::EventStreamRequest,
            server_streaming,
            s,
            req
        ),
    };
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(variant.content_type()),
    );
    resp
}

/// The per-call handle the tonic server drives.
struct Svc {
    sim: Arc<Simulator>,
    variant: Variant,
}

impl UnaryService<pb::GetStateRequest> for Svc {
    type Response = pb::GetStateReply;
    type Future = BoxFuture<Result<Response<pb::GetStateReply>, Status>>;
    fn call(&mut self, _req: Request<pb::GetStateRequest>) -> Self::Future {
        let reply = self.sim.get_state();
        Box::pin(async move { Ok(Response::new(reply)) })
    }
}

impl UnaryService<pb::TransitionRequest> for Svc {
    type Response = pb::TransitionReply;
    type Future = BoxFuture<Result<Response<pb::TransitionReply>, Status>>;
    fn call(&mut self, req: Request<pb::TransitionRequest>) -> Self::Future {
        let sim = self.sim.clone();
        let variant = self.variant;
        Box::pin(async move {
            sim.transition(req.into_inner(), variant)
                .await
                .map(Response::new)
        })
    }
}

impl ServerStreamingService<pb::StateStreamRequest> for Svc {
    type Response = pb::StateStreamReply;
    type ResponseStream = BoxStream<pb::StateStreamReply>;
    type Future = BoxFuture<Result<Response<Self::ResponseStream>, Status>>;
    fn call(&mut self, _req: Request<pb::StateStreamRequest>) -> Self::Future {
        let s = self.sim.state_stream();
        Box::pin(async move { Ok(Response::new(s)) })
    }
}

impl ServerStreamingService<pb::EventStreamRequest> for Svc {
    type Response = pb::EventStreamReply;
    type ResponseStream = BoxStream<pb::EventStreamReply>;
    type Future = BoxFuture<Result<Response<Self::ResponseStream>, Status>>;
    fn call(&mut self, _req: Request<pb::EventStreamRequest>) -> Self::Future {
        let s = self.sim.event_stream();
        Box::pin(async move { Ok(Response::new(s)) })
    }
}

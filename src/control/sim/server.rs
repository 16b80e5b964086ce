//! The simulator's gRPC server, hand-written, playing the state machine of `machine` with the
//! delays and failures of `config`, and speaking each mode's wire as the real processes do
//! (../shared/reference/occ-wire.md): direct mode is the OCC library (protobuf at
//! `/occ_pb.Occ/<Method>`, StateStream of later changes), fairmq mode is OCClite (JSON at
//! the bare method name, no StateStream, one EventStream message at ERROR or EXITING, the
//! process exits after a failure, a step invalid in its state answered only at the next
//! change). A process ends after reaching DONE/EXITING. With a fault file
//! (`SimConfig::fault_file`), each transition request reads it for faults switched on at
//! runtime ([`read_faults`]).

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

use super::config::{Fate, Faults, SimConfig};
use super::machine::{Machine, Rejection};
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
    #[error("simulated FairMQ device failed ({0}) and exits, as a real device does")]
    DeviceFailed(String),
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

/// How the simulated process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum End {
    /// Injected crash on this event: no reply, exit 70.
    Crashed(String),
    /// A FairMQ device in ERROR exits (non-zero).
    Failed(String),
    /// EXIT/END reached DONE/EXITING: the process ends normally and its port closes.
    Exited,
}

/// The most of a fault file read.
pub const FAULT_FILE_MAX: u64 = 4096;

/// The faults a fault file switches on now. A missing file is none; an unreadable, oversized
/// or malformed one is logged (naming the file and line) and is none too.
pub fn read_faults(path: &std::path::Path) -> Faults {
    use std::io::Read;
    let text = std::fs::File::open(path).and_then(|f| {
        if f.metadata()?.len() > FAULT_FILE_MAX {
            return Err(std::io::Error::other(format!(
                "larger than {FAULT_FILE_MAX} bytes"
            )));
        }
        let mut buf = Vec::new();
        f.take(FAULT_FILE_MAX).read_to_end(&mut buf)?;
        String::from_utf8(buf).map_err(|_| std::io::Error::other("not UTF-8 text"))
    });
    match text {
        Ok(text) => Faults::parse(&text).unwrap_or_else(|e| {
            warn!(
                "task simulator: fault file {}:{}: {}; ignoring the file",
                path.display(),
                e.line,
                e.message
            );
            Faults::default()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Faults::default(),
        Err(e) => {
            warn!(
                "task simulator: cannot read fault file {}: {e}; ignoring it",
                path.display()
            );
            Faults::default()
        }
    }
}

/// Time left for a last reply to reach its caller before the process ends.
const LAST_WORDS: std::time::Duration = std::time::Duration::from_millis(150);

/// One simulated task process.
#[derive(Debug)]
pub struct Simulator {
    config: SimConfig,
    /// The state GetState and StateStream report (transient ones included).
    reported: watch::Sender<Machine>,
    /// Counts state changes, so that a scheduled self-failure knows whether its state held.
    changes: std::sync::atomic::AtomicU64,
    /// One transition at a time, as a real process handles them.
    turn: tokio::sync::Mutex<()>,
    ended: CancellationToken,
    end: std::sync::Mutex<Option<End>>,
    pid: i32,
}

impl Simulator {
    pub fn new(config: SimConfig) -> Arc<Simulator> {
        let (reported, _) = watch::channel(Machine::initial(config.mode));
        Arc::new(Simulator {
            config,
            reported,
            changes: Default::default(),
            turn: tokio::sync::Mutex::new(()),
            ended: CancellationToken::new(),
            end: std::sync::Mutex::new(None),
            pid: i32::try_from(std::process::id()).unwrap_or(0),
        })
    }

    /// The state it would report now.
    pub fn state(&self) -> Machine {
        *self.reported.borrow()
    }

    fn fairmq(&self) -> bool {
        self.config.mode == super::config::SimMode::Fairmq
    }

    fn set(self: &Arc<Self>, m: Machine) {
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.reported.send_replace(m);
        if m.is_final() {
            self.end_with(End::Exited);
        } else if let Some(after) = m.run_state().and_then(|s| self.config.fails_in(s)) {
            self.fail_later(m, after);
        }
    }

    /// Ends the process a moment from now (its last reply or event still goes out).
    fn end_with(self: &Arc<Self>, end: End) {
        if let Ok(mut e) = self.end.lock() {
            if e.is_some() {
                return;
            }
            *e = Some(end);
        }
        let sim = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(LAST_WORDS).await;
            sim.ended.cancel();
        });
    }

    /// Moves to ERROR now, unprompted, as `--fail-in` does (benchmarks inject failures so).
    pub fn fail_now(self: &Arc<Self>) {
        self.fail_later(self.state(), std::time::Duration::ZERO);
    }

    /// `--fail-in`: ERROR by itself `after` reaching `m`, if it is still there then.
    fn fail_later(self: &Arc<Self>, m: Machine, after: std::time::Duration) {
        let sim = self.clone();
        let seen = self.changes.load(std::sync::atomic::Ordering::SeqCst);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _turn = sim.turn.lock().await;
            if sim.changes.load(std::sync::atomic::Ordering::SeqCst) != seen {
                return;
            }
            let unix_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0);
            warn!(
                unix_ms,
                "task simulator moves itself from {} to ERROR after {after:?} (injected, --fail-in)",
                m.name()
            );
            sim.set(m.error());
            if sim.fairmq() {
                sim.end_with(End::Failed(format!("ERROR by itself in {}", m.name())));
            }
        });
    }

    async fn transition(
        self: &Arc<Self>,
        req: pb::TransitionRequest,
    ) -> Result<pb::TransitionReply, Status> {
        let turn = self.turn.lock().await;
        let current = self.state();
        let event = req.transition_event.clone();
        let mv = current.begin(&req.src_state, &event).map_err(|r| {
            warn!("task simulator rejected {event:?}: {r}");
            match (self.fairmq(), &r) {
                // OCClite: a source-state mismatch is CANCELLED without a message.
                (true, Rejection::Mismatch { .. }) => Status::cancelled(""),
                (false, Rejection::Mismatch { .. }) => Status::invalid_argument(r.to_string()),
                (_, Rejection::UnknownEvent(_)) => {
                    Status::unknown("Unexpected error in RPC handling")
                }
            }
        })?;
        info!(
            "task simulator received transition {event} in {current} ({} arguments, {})",
            req.arguments.len(),
            if self.fairmq() { "Json" } else { "Protobuf" },
            current = current.name()
        );
        for a in &req.arguments {
            debug!("task simulator argument {} = {}", a.key, a.value);
        }
        let fate = self.fate(mv.requested);
        // What injected it, for the log: an option, or the fault file.
        let by = |option: &'static str| {
            if self.config.fate(mv.requested) == fate {
                option
            } else {
                "fault file"
            }
        };
        match fate {
            Fate::Crash => {
                error!(
                    "task simulator crashing on {event} as injected ({})",
                    by("--crash-on")
                );
                self.end_with(End::Crashed(event.clone()));
                std::future::pending::<()>().await;
            }
            Fate::Hang => {
                warn!(
                    "task simulator hanging on {event} as injected ({}): it will never reply",
                    by("--hang-on")
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
            if !self.fairmq() {
                return Ok(reply(
                    current,
                    false,
                    pb::StateChangeTrigger::DeviceIntentional,
                ));
            }
            // A FairMQ device answers such a step only at its next state change, with that
            // unrelated state (it may never come: callers need a deadline).
            let mut rx = self.reported.subscribe();
            drop(turn);
            let _ = rx.changed().await;
            let now = *rx.borrow_and_update();
            return Ok(reply(now, false, pb::StateChangeTrigger::DeviceIntentional));
        };
        if let Some(t) = mv.transient {
            self.set(t);
        }
        let delay = self.config.delay_for(mv.requested);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let (state, ok, trigger) = match fate {
            Fate::Fail => {
                warn!(
                    "task simulator failing {event} as injected ({})",
                    by("--fail-on")
                );
                (current.error(), false, pb::StateChangeTrigger::DeviceError)
            }
            Fate::Stick => {
                warn!(
                    "task simulator stays in {} on {event} as injected ({})",
                    current.name(),
                    by("--stuck-on")
                );
                (current, false, pb::StateChangeTrigger::DeviceIntentional)
            }
            _ => (to, true, pb::StateChangeTrigger::Executor),
        };
        self.set(state);
        if fate == Fate::Fail && self.fairmq() {
            // A real device that fails answers, then its process exits.
            self.end_with(End::Failed(format!("{event} failed")));
        }
        Ok(reply(state, ok, trigger))
    }

    /// What to do with `req`: the config's faults and the fault file's, read now.
    fn fate(&self, req: super::config::Requested) -> Fate {
        match &self.config.fault_file {
            Some(path) => self.config.fate_with(req, &read_faults(path)),
            None => self.config.fate(req),
        }
    }

    fn get_state(&self) -> pb::GetStateReply {
        pb::GetStateReply {
            state: self.state().name().to_string(),
            pid: self.pid,
        }
    }

    /// Every later change (never the current state), ending after DONE. Direct mode only:
    /// OCClite has no StateStream.
    fn state_stream(&self) -> BoxStream<pb::StateStreamReply> {
        let rx = self.reported.subscribe();
        stream::unfold((rx, false), |(mut rx, done)| async move {
            if done || rx.changed().await.is_err() {
                return None;
            }
            let m = *rx.borrow_and_update();
            let reply = pb::StateStreamReply {
                r#type: pb::StateType::StateStable as i32,
                state: m.name().to_string(),
            };
            Some((Ok(reply), (rx, m.is_final())))
        })
        .boxed()
    }

    /// OCClite: one message (`{"event":{"type":0}}`) when the device reaches EXITING or
    /// ERROR, then the end. The OCC library's example sends nothing and ends at DONE.
    fn event_stream(&self) -> BoxStream<pb::EventStreamReply> {
        let mut rx = self.reported.subscribe();
        let fairmq = self.fairmq();
        stream::once(async move {
            let _ = rx
                .wait_for(|m| m.is_final() || (fairmq && *m == m.error()))
                .await;
            fairmq.then_some(Ok(pb::EventStreamReply {
                event: Some(pb::DeviceEvent {
                    r#type: pb::DeviceEventType::NullDeviceEvent as i32,
                }),
            }))
        })
        .filter_map(std::future::ready)
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
    let initial = sim.state();
    if let Some(after) = initial.run_state().and_then(|s| sim.config.fails_in(s)) {
        sim.fail_later(initial, after);
    }
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
        _ = sim.ended.cancelled() => {
            match sim.end.lock().ok().and_then(|e| e.clone()) {
                Some(End::Crashed(on)) => Err(SimError::Crashed(on)),
                Some(End::Failed(why)) => Err(SimError::DeviceFailed(why)),
                Some(End::Exited) | None => {
                    info!("task simulator reached {} and exits", sim.state().name());
                    Ok(())
                }
            }
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
    // What each real process serves: the OCC library protobuf at `/occ_pb.Occ/<Method>`
    // (any content subtype), OCClite JSON at the bare method name and no StateStream.
    let fairmq = sim.fairmq();
    let variant = if fairmq {
        Variant::Json
    } else {
        Variant::Protobuf
    };
    let served = method
        .filter(|m| path == m.path(variant).as_str() && !(fairmq && *m == Method::StateStream));
    let Some(method) = served else {
        warn!("task simulator: no such method {path:?} (content type {variant:?})");
        return Status::unimplemented(format!("task simulator has no method {path:?}")).into_http();
    };
    debug!("task simulator call {path:?} as {variant:?}");
    if sim.ended.is_cancelled() {
        // In-process end: the listener is gone, open connections get no service either.
        return Status::unavailable("task simulator process has ended").into_http();
    }
    let s = Svc { sim };
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
    // Both real processes answer `application/grpc`, whatever the request said.
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(crate::control::wire::CONTENT_TYPE_PROTO),
    );
    resp
}

/// The per-call handle the tonic server drives.
struct Svc {
    sim: Arc<Simulator>,
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
        Box::pin(async move { sim.transition(req.into_inner()).await.map(Response::new) })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::sim::config::SimMode;

    fn request(src: &str, event: &str) -> pb::TransitionRequest {
        pb::TransitionRequest {
            src_state: src.into(),
            transition_event: event.into(),
            ..Default::default()
        }
    }

    #[test]
    fn fault_file_reads_are_bounded_and_forgiving() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns_pod.faults");
        assert_eq!(read_faults(&path), Faults::default(), "missing: none");
        std::fs::write(&path, "fail-on=CONFIGURE\n").unwrap();
        assert_eq!(read_faults(&path).fail_on.len(), 1);
        std::fs::write(&path, "fail-on=CONFIGURE\nfail-on=NOPE\n").unwrap();
        assert_eq!(read_faults(&path), Faults::default(), "malformed: ignored");
        let mut big = "# padding\n".repeat(500);
        big.push_str("fail-on=CONFIGURE\n");
        std::fs::write(&path, big).unwrap();
        assert_eq!(read_faults(&path), Faults::default(), "oversized: ignored");
        std::fs::write(&path, [0xff, 0xfe, b'\n']).unwrap();
        assert_eq!(read_faults(&path), Faults::default(), "not text: ignored");
        // A directory in its place cannot be read as a file.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert_eq!(read_faults(&path), Faults::default());
    }

    #[tokio::test]
    async fn a_fault_switched_on_at_runtime_changes_the_fate_and_off_restores_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns_pod.faults");
        let sim = Simulator::new(SimConfig {
            mode: SimMode::Direct,
            fault_file: Some(path.clone()),
            ..SimConfig::default()
        });
        // On: CONFIGURE is stuck, the task stays in STANDBY.
        std::fs::write(&path, "# test\nstuck-on=CONFIGURE\n").unwrap();
        let r = sim
            .transition(request("STANDBY", "CONFIGURE"))
            .await
            .unwrap();
        assert_eq!((r.ok, r.state.as_str()), (false, "STANDBY"));
        // Off (file emptied): the same request succeeds.
        std::fs::write(&path, "").unwrap();
        let r = sim
            .transition(request("STANDBY", "CONFIGURE"))
            .await
            .unwrap();
        assert_eq!((r.ok, r.state.as_str()), (true, "CONFIGURED"));
        // On again, another kind: RESET fails into ERROR.
        std::fs::write(&path, "fail-on=RESET\n").unwrap();
        let r = sim
            .transition(request("CONFIGURED", "RESET"))
            .await
            .unwrap();
        assert_eq!((r.ok, r.state.as_str()), (false, "ERROR"));
        // Off (file removed): nothing extra.
        std::fs::remove_file(&path).unwrap();
        let r = sim.transition(request("ERROR", "RECOVER")).await.unwrap();
        assert!(r.ok, "{r:?}");
        // A malformed file is ignored: no extra fault.
        std::fs::write(&path, "fail-on=CONFIGURE\nbogus\n").unwrap();
        let r = sim
            .transition(request("STANDBY", "CONFIGURE"))
            .await
            .unwrap();
        assert_eq!((r.ok, r.state.as_str()), (true, "CONFIGURED"));
    }

    #[tokio::test]
    async fn a_hang_switched_on_never_replies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns_pod.faults");
        std::fs::write(&path, "hang-on=CONFIGURE\n").unwrap();
        let sim = Simulator::new(SimConfig {
            fault_file: Some(path),
            ..SimConfig::default()
        });
        let r = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            sim.transition(request("STANDBY", "CONFIGURE")),
        )
        .await;
        assert!(r.is_err(), "no reply");
    }
}

//! The task control client: what the operator calls to read and drive one task process.
//!
//! * `direct` tasks get one protobuf `Transition` per run-control event.
//! * `fairmq` tasks get the multi-step sequences of [`super::fairmq`] over the JSON variant.
//! * `basic` and `hook` tasks speak no protocol: every call returns [`ControlError::NoProtocol`].
//!
//! Every call is a method of a [`ControlClient`] (see [`super::policy`]): its policy decides
//! which addresses may be dialled, its cache holds one channel per task; calls to different
//! tasks run concurrently.

use std::net::SocketAddr;
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tonic::codegen::{Context, Poll, Service};
use tonic::transport::Channel;
use tracing::{debug, warn};

use super::conn::{Failure, Reply};
use super::error::ControlError;
use super::fairmq::{self, FmqState, Step, Verdict};
use super::json::{from_json, to_json};
use super::pb;
use super::policy::ControlClient;
use super::wire::{Method, Variant};
use crate::plan::ControlMode;
use crate::state::{self, Event, State};

/// Where and how to reach one task process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TaskEndpoint {
    pub addr: SocketAddr,
    pub mode: ControlMode,
}

impl TaskEndpoint {
    pub fn new(addr: SocketAddr, mode: ControlMode) -> Self {
        TaskEndpoint { addr, mode }
    }

    fn variant(&self) -> Result<Variant, ControlError> {
        match self.mode {
            ControlMode::Direct => Ok(Variant::Protobuf),
            ControlMode::Fairmq => Ok(Variant::Json),
            ControlMode::Basic | ControlMode::Hook => Err(ControlError::NoProtocol {
                addr: self.addr,
                mode: self.mode,
            }),
        }
    }
}

/// How often the state of a FairMQ task is polled for [`ControlClient::state_stream`] (the plugin has no
/// state stream).
pub const FAIRMQ_POLL_INTERVAL: Duration = Duration::from_secs(1);

impl ControlClient {
    /// The state of the task process and its pid.
    pub async fn get_state(
        &self,
        ep: &TaskEndpoint,
        deadline: Duration,
    ) -> Result<(State, u32), ControlError> {
        let (raw, pid) = self.get_raw_state(ep, deadline).await?;
        let state = match ep.mode {
            ControlMode::Fairmq => {
                let fmq = parse_fmq(ep.addr, "GetState", &raw)?;
                fmq.to_state().ok_or_else(|| ControlError::Between {
                    addr: ep.addr,
                    device_state: raw.clone(),
                })?
            }
            _ => parse_state(ep.addr, "GetState", &raw)?,
        };
        Ok((state, pid))
    }

    /// The state exactly as the process names it (a FairMQ device's own state, e.g. `BOUND`)
    /// and its pid.
    pub async fn get_raw_state(
        &self,
        ep: &TaskEndpoint,
        deadline: Duration,
    ) -> Result<(String, u32), ControlError> {
        let variant = ep.variant()?;
        let reply: pb::GetStateReply = self
            .unary(
                ep.addr,
                variant,
                Method::GetState,
                pb::GetStateRequest {},
                deadline,
                "GetState",
            )
            .await?;
        Ok((reply.state, u32::try_from(reply.pid).unwrap_or(0)))
    }

    /// The process's own state names, polled `every` so long (for a FairMQ device, which has
    /// no state stream), each time it changes, the current one first. It never ends on its own:
    /// a failed read yields its error and polling goes on.
    pub fn raw_state_stream(
        &self,
        ep: &TaskEndpoint,
        every: Duration,
    ) -> impl Stream<Item = Result<String, ControlError>> + Send + use<> {
        let ep = *ep;
        let client = self.clone();
        stream::unfold(
            (ep, None::<String>, true),
            move |(ep, mut last, mut first)| {
                let client = client.clone();
                async move {
                    loop {
                        if !first {
                            tokio::time::sleep(every).await;
                        }
                        first = false;
                        match client
                            .get_raw_state(&ep, every.max(Duration::from_secs(2)))
                            .await
                        {
                            Ok((s, _)) if last.as_deref() != Some(s.as_str()) => {
                                last = Some(s.clone());
                                return Some((Ok(s), (ep, last, first)));
                            }
                            Ok(_) => continue,
                            Err(e) => return Some((Err(e), (ep, last, first))),
                        }
                    }
                }
            },
        )
    }

    /// Drives the task from `from` through `event`; returns the state it settled in.
    ///
    /// `args` travel with the event (for FairMQ: with INIT DEVICE for CONFIGURE, with RUN for
    /// START). `deadline` bounds the whole transition, every step of a FairMQ sequence included.
    /// `ok=false`, a gRPC error, a stuck FairMQ step and the deadline are all errors.
    pub async fn transition(
        &self,
        ep: &TaskEndpoint,
        from: State,
        event: Event,
        args: &[(String, String)],
        deadline: Duration,
    ) -> Result<State, ControlError> {
        let variant = ep.variant()?;
        if state::next(from, event).is_none() {
            return Err(ControlError::NotApplicable { event, from });
        }
        let arguments: Vec<pb::ConfigEntry> = args
            .iter()
            .map(|(k, v)| pb::ConfigEntry {
                key: k.clone(),
                value: v.clone(),
            })
            .collect();
        match ep.mode {
            ControlMode::Fairmq => {
                self.fairmq_transition(ep.addr, from, event, arguments, deadline)
                    .await
            }
            _ => {
                self.direct_transition(ep.addr, variant, from, event, arguments, deadline)
                    .await
            }
        }
    }

    async fn direct_transition(
        &self,
        addr: SocketAddr,
        variant: Variant,
        from: State,
        event: Event,
        arguments: Vec<pb::ConfigEntry>,
        deadline: Duration,
    ) -> Result<State, ControlError> {
        let call = event.as_str();
        let req = pb::TransitionRequest {
            src_state: from.as_str().to_string(),
            transition_event: call.to_string(),
            arguments,
        };
        let reply: pb::TransitionReply = self
            .unary(addr, variant, Method::Transition, req, deadline, call)
            .await?;
        if !reply.ok {
            return Err(refused(addr, call.to_string(), &reply));
        }
        parse_state(addr, call, &reply.state)
    }

    async fn fairmq_transition(
        &self,
        addr: SocketAddr,
        from: State,
        event: Event,
        arguments: Vec<pb::ConfigEntry>,
        deadline: Duration,
    ) -> Result<State, ControlError> {
        FmqState::from_state(from).ok_or(ControlError::NotApplicable { event, from })?;
        let end = Instant::now() + deadline;
        // Plan from where the device IS, not from where its Task says it is: whoever drove it
        // last (an operator killed between two steps) may have left it part-way through a
        // sequence, or done with it. A step is then never sent twice nor out of order: the
        // sequence carries on (CONFIGURE from BOUND is CONNECT, INIT TASK), or is already
        // done (nothing is sent).
        let ep = TaskEndpoint::new(addr, ControlMode::Fairmq);
        let left = end.saturating_duration_since(Instant::now());
        let (raw, _) = self.get_raw_state(&ep, left).await?;
        let start = parse_fmq(addr, "GetState", &raw)?;
        if FmqState::from_state(from) != Some(start) {
            debug!(%addr, %event, recorded = %from, device = %start, "FairMQ device elsewhere than its task says: planning from the device");
        }
        let steps = fairmq::plan(event, start).map_err(|source| ControlError::Plan {
            addr,
            event,
            source,
        })?;
        let mut at = start;
        for step in &steps {
            let call = format!("{event} (FairMQ step {})", step.event);
            let args = if step.with_args {
                arguments.clone()
            } else {
                Vec::new()
            };
            let reply = self.fairmq_step(addr, step, args, end, &call).await?;
            let reached = parse_fmq(addr, &call, &reply.state)?;
            debug!(%addr, step = %step.event, from = %step.from, reached = %reached, ok = reply.ok, "FairMQ step");
            match fairmq::judge(step, reached, reply.ok) {
                Verdict::Advance => at = reached,
                Verdict::Fail => return Err(refused(addr, call, &reply)),
                Verdict::RollBack(rb) => {
                    let outcome = match self.fairmq_step(addr, &rb, Vec::new(), end, &call).await {
                        Ok(r) if r.ok => format!("{} (now {})", rb.event, r.state),
                        Ok(r) => format!("{} (refused too, now {})", rb.event, r.state),
                        Err(e) => format!("{} (failed: {e})", rb.event),
                    };
                    warn!(%addr, %call, state = %reached, %outcome, "FairMQ step stuck; rolled back");
                    return Err(ControlError::Stuck {
                        addr,
                        call,
                        state: reached.to_string(),
                        rollback: outcome.clone(),
                    });
                }
            }
        }
        at.to_state().ok_or_else(|| ControlError::UnknownState {
            addr,
            call: event.to_string(),
            state: at.to_string(),
        })
    }

    async fn fairmq_step(
        &self,
        addr: SocketAddr,
        step: &Step,
        arguments: Vec<pb::ConfigEntry>,
        end: Instant,
        call: &str,
    ) -> Result<pb::TransitionReply, ControlError> {
        let req = pb::TransitionRequest {
            src_state: step.from.as_str().to_string(),
            transition_event: step.event.as_str().to_string(),
            arguments,
        };
        let left = end.saturating_duration_since(Instant::now());
        self.unary(addr, Variant::Json, Method::Transition, req, left, call)
            .await
    }

    /// One FairMQ device step by hand (`event` from the device state `from`, both as the
    /// device names them), as the anchor's `peanut` sends them: no sequence, no rollback.
    pub async fn device_step(
        &self,
        addr: SocketAddr,
        from: FmqState,
        event: fairmq::FmqEvent,
        deadline: Duration,
    ) -> Result<pb::TransitionReply, ControlError> {
        let req = pb::TransitionRequest {
            src_state: from.as_str().to_string(),
            transition_event: event.as_str().to_string(),
            arguments: Vec::new(),
        };
        self.unary(
            addr,
            Variant::Json,
            Method::Transition,
            req,
            deadline,
            event.as_str(),
        )
        .await
    }

    /// Every state the task reaches, including changes it makes on its own.
    ///
    /// `direct` tasks push their later states (StateStream: never the current one on
    /// subscribe); the stream ends when the task closes it.
    /// `fairmq` tasks are polled every [`FAIRMQ_POLL_INTERVAL`] (the plugin has no state stream);
    /// only settled states are yielded, each time it changes; it never ends on its own (an
    /// unreachable task yields one error per poll). `basic`/`hook`: one NoProtocol error.
    pub fn state_stream(
        &self,
        ep: &TaskEndpoint,
    ) -> impl Stream<Item = Result<State, ControlError>> + Send + 'static {
        let ep = *ep;
        match ep.mode {
            ControlMode::Direct => self.pushed_states(ep).boxed(),
            ControlMode::Fairmq => self.polled_states(ep).boxed(),
            ControlMode::Basic | ControlMode::Hook => {
                stream::iter([Err(ControlError::NoProtocol {
                    addr: ep.addr,
                    mode: ep.mode,
                })])
                .boxed()
            }
        }
    }

    fn pushed_states(
        &self,
        ep: TaskEndpoint,
    ) -> impl Stream<Item = Result<State, ControlError>> + Send + use<> {
        let addr = ep.addr;
        self.server_streaming::<pb::StateStreamRequest, pb::StateStreamReply>(
            addr,
            Variant::Protobuf,
            Method::StateStream,
            "StateStream",
        )
        .map(move |r| {
            let reply = r?;
            parse_state(addr, "StateStream", &reply.state)
        })
    }

    fn polled_states(
        &self,
        ep: TaskEndpoint,
    ) -> impl Stream<Item = Result<State, ControlError>> + Send + use<> {
        let addr = ep.addr;
        // The device's own states, settled ones only (no run-control state between them), each
        // run-control state once per change.
        self.raw_state_stream(&ep, FAIRMQ_POLL_INTERVAL)
            .filter_map(move |r| {
                std::future::ready(match r.and_then(|raw| parse_fmq(addr, "GetState", &raw)) {
                    Ok(fmq) => fmq.to_state().map(Ok),
                    Err(e) => Some(Err(e)),
                })
            })
            .scan(None::<State>, |last, r| {
                let out = match r {
                    Ok(s) if *last == Some(s) => None,
                    Ok(s) => {
                        *last = Some(s);
                        Some(Ok(s))
                    }
                    Err(e) => Some(Err(e)),
                };
                std::future::ready(Some(out))
            })
            .filter_map(std::future::ready)
    }

    /// The task's device events as they come (`NULL_DEVICE_EVENT`, `END_OF_STREAM`, ...).
    ///
    /// OCClite sends one message as its device reaches ERROR or EXITING, then ends the stream;
    /// the OCC library's example sends nothing in a normal cycle and ends at DONE. A stream
    /// that fails (the connection is lost, the process is gone) yields one error and ends.
    pub fn event_stream(
        &self,
        ep: &TaskEndpoint,
    ) -> futures::stream::BoxStream<'static, Result<String, ControlError>> {
        let ep = *ep;
        match ep.variant() {
            Ok(variant) => self
                .server_streaming::<pb::EventStreamRequest, pb::EventStreamReply>(
                    ep.addr,
                    variant,
                    Method::EventStream,
                    "EventStream",
                )
                .map(|r| r.map(|reply| event_name(&reply)))
                .boxed(),
            Err(e) => stream::iter([Err(e)]).boxed(),
        }
    }

    /// A server-streaming call with an empty request: its replies, then one error if it
    /// failed (a stream that ends OK just ends).
    fn server_streaming<Req, Resp>(
        &self,
        addr: SocketAddr,
        variant: Variant,
        method: Method,
        call: &'static str,
    ) -> impl Stream<Item = Result<Resp, ControlError>> + Send + use<Req, Resp>
    where
        Req: prost::Message + Serialize + Default + Send + 'static,
        Resp: prost::Message + DeserializeOwned + Default + Send + 'static,
    {
        let client = self.clone();
        let open = async move {
            let conn = client.conn(addr, call).await?;
            let message = encode(addr, call, variant, &Req::default())?;
            Ok::<_, ControlError>(conn.call(
                method.wire_path(variant),
                variant.content_type(),
                None,
                &message,
            ))
        };
        stream::once(open).flat_map(move |opened| match opened {
            Ok(replies) => replies
                .filter_map(move |r| {
                    std::future::ready(match r {
                        Reply::Message(m) => Some(decode(addr, call, variant, &m)),
                        Reply::End(Ok(())) => None,
                        Reply::End(Err(f)) => Some(Err(failure_error(addr, call, f, None))),
                    })
                })
                .boxed(),
            Err(e) => stream::iter([Err(e)]).boxed(),
        })
    }

    async fn unary<Req, Resp>(
        &self,
        addr: SocketAddr,
        variant: Variant,
        method: Method,
        req: Req,
        deadline: Duration,
        call: &str,
    ) -> Result<Resp, ControlError>
    where
        Req: prost::Message + Serialize + Send + Sync + 'static,
        Resp: prost::Message + DeserializeOwned + Default + Send + Sync + 'static,
    {
        let deadline_error = || ControlError::Deadline {
            addr,
            call: call.to_string(),
            deadline,
        };
        if deadline.is_zero() {
            return Err(deadline_error());
        }
        let fut = async {
            let conn = self.conn(addr, call).await?;
            let message = encode(addr, call, variant, &req)?;
            let reply = conn
                .call(
                    method.wire_path(variant),
                    variant.content_type(),
                    Some(deadline),
                    &message,
                )
                .single()
                .await
                .map_err(|f| failure_error(addr, call, f, Some(deadline)))?;
            decode(addr, call, variant, &reply)
        };
        match tokio::time::timeout(deadline, fut).await {
            Ok(r) => r,
            Err(_) => Err(deadline_error()),
        }
    }
}

/// A request message in `variant`'s encoding.
fn encode<M: prost::Message + Serialize>(
    addr: SocketAddr,
    call: &str,
    variant: Variant,
    m: &M,
) -> Result<Vec<u8>, ControlError> {
    match variant {
        Variant::Protobuf => Ok(m.encode_to_vec()),
        Variant::Json => to_json(m).map_err(|message| ControlError::Rpc {
            addr,
            call: call.to_string(),
            code: tonic::Code::Internal,
            message,
        }),
    }
}

/// A reply message in `variant`'s encoding.
fn decode<M: prost::Message + DeserializeOwned + Default>(
    addr: SocketAddr,
    call: &str,
    variant: Variant,
    bytes: &[u8],
) -> Result<M, ControlError> {
    let decoded = match variant {
        Variant::Protobuf => M::decode(bytes).map_err(|e| format!("decoding message: {e}")),
        Variant::Json => from_json(bytes),
    };
    decoded.map_err(|message| ControlError::Rpc {
        addr,
        call: call.to_string(),
        code: tonic::Code::Internal,
        message,
    })
}

fn event_name(reply: &pb::EventStreamReply) -> String {
    let kind = reply.event.as_ref().map(|e| e.r#type).unwrap_or(0);
    pb::DeviceEventType::try_from(kind)
        .map(|t| t.as_str_name().to_string())
        .unwrap_or_else(|_| kind.to_string())
}

/// A channel that sends a variant's content type (tonic's client always writes
/// `application/grpc`, which would make a JSON peer read protobuf).
#[derive(Clone, Debug)]
pub struct VariantChannel {
    inner: Channel,
    content_type: http::HeaderValue,
}

impl VariantChannel {
    pub fn new(inner: Channel, variant: Variant) -> Self {
        VariantChannel {
            inner,
            content_type: http::HeaderValue::from_static(variant.content_type()),
        }
    }
}

impl Service<http::Request<tonic::body::Body>> for VariantChannel {
    type Response = <Channel as Service<http::Request<tonic::body::Body>>>::Response;
    type Error = <Channel as Service<http::Request<tonic::body::Body>>>::Error;
    type Future = <Channel as Service<http::Request<tonic::body::Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<http::Request<tonic::body::Body>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        req.headers_mut()
            .insert(http::header::CONTENT_TYPE, self.content_type.clone());
        self.inner.call(req)
    }
}

fn failure_error(
    addr: SocketAddr,
    call: &str,
    f: Failure,
    deadline: Option<Duration>,
) -> ControlError {
    match deadline {
        // The peer honoured the call's grpc-timeout.
        Some(deadline) if f.code == tonic::Code::DeadlineExceeded => ControlError::Deadline {
            addr,
            call: call.to_string(),
            deadline,
        },
        _ => ControlError::Rpc {
            addr,
            call: call.to_string(),
            code: f.code,
            message: f.message,
        },
    }
}

fn refused(addr: SocketAddr, call: String, reply: &pb::TransitionReply) -> ControlError {
    let trigger = pb::StateChangeTrigger::try_from(reply.trigger)
        .map(|t| t.as_str_name().to_string())
        .unwrap_or_else(|_| reply.trigger.to_string());
    ControlError::Refused {
        addr,
        call,
        state: reply.state.clone(),
        trigger,
    }
}

fn parse_state(addr: SocketAddr, call: &str, s: &str) -> Result<State, ControlError> {
    s.parse::<State>()
        .ok()
        .filter(|st| *st != State::Mixed)
        .ok_or_else(|| ControlError::UnknownState {
            addr,
            call: call.to_string(),
            state: s.to_string(),
        })
}

fn parse_fmq(addr: SocketAddr, call: &str, s: &str) -> Result<FmqState, ControlError> {
    s.parse::<FmqState>()
        .map_err(|_| ControlError::UnknownState {
            addr,
            call: call.to_string(),
            state: s.to_string(),
        })
}

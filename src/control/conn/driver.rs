//! The task that owns one control connection: it writes the requests its [`super::Conn`]
//! hands it, reads the frames the task process sends, and delivers each stream's messages
//! and outcome. Between calls it holds no buffer: what it reads is parsed from a stack
//! buffer, and its input and output vectors are released once empty.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::task::Poll;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use loona_hpack::Decoder;
use tokio::net::TcpStream;
use tracing::debug;

use super::grpc::{Failure, ResponseHead, reset_code, take_messages};
use crate::control::h2frame::*;

/// What a [`super::Conn`] asks of its driver.
pub enum Command {
    Call(Call),
    /// A caller stopped listening: reset the streams nobody reads.
    Sweep,
}

/// One request: a header block and one framed message.
pub struct Call {
    pub head: Vec<u8>,
    pub body: Vec<u8>,
    pub replies: UnboundedSender<Reply>,
}

/// What a call's stream delivers: its messages, then how it ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Message(Vec<u8>),
    End(Result<(), Failure>),
}

/// Frames larger than this are refused (the default SETTINGS_MAX_FRAME_SIZE, which this
/// client never raises, is 16 KiB).
const MAX_IN_FRAME: usize = OUT_FRAME_MAX;
/// Buffers larger than this are released once empty.
const KEEP_CAPACITY: usize = 1024;

struct Stream {
    replies: UnboundedSender<Reply>,
    send_window: i64,
    /// The request body not yet sent (flow control), from `sent`.
    body: Vec<u8>,
    sent: usize,
    /// The partial message read so far.
    buf: Vec<u8>,
}

/// A header block being collected (HEADERS, then CONTINUATION frames).
struct Block {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
}

pub struct Driver {
    io: TcpStream,
    commands: UnboundedReceiver<Command>,
    commands_open: bool,
    /// Calls over the peer's MAX_CONCURRENT_STREAMS, in order.
    waiting: VecDeque<Call>,
    out: Vec<u8>,
    input: Vec<u8>,
    decoder: Decoder<'static>,
    streams: HashMap<u32, Stream>,
    next_id: u32,
    send_window: i64,
    peer_initial_window: i64,
    peer_max_frame: usize,
    peer_max_streams: usize,
    block: Option<Block>,
    /// The peer sent GOAWAY: no new stream on this connection.
    goaway: bool,
}

enum Wake {
    Writable(io::Result<()>),
    Readable(io::Result<()>),
    Command(Option<Command>),
}

/// Why the connection ended.
enum Ended {
    Io(io::Error),
    Protocol(String),
    Closed,
}

impl Driver {
    pub fn new(io: TcpStream, commands: UnboundedReceiver<Command>) -> Driver {
        let mut out = Vec::with_capacity(PREFACE.len() + 2 * FRAME_HEADER_LEN + 6);
        out.extend_from_slice(PREFACE);
        let mut s = Vec::with_capacity(6);
        s.extend_from_slice(&SETTINGS_ENABLE_PUSH.to_be_bytes());
        s.extend_from_slice(&0u32.to_be_bytes());
        write_frame(&mut out, SETTINGS, 0, 0, &s);
        Driver {
            io,
            commands,
            commands_open: true,
            waiting: VecDeque::new(),
            out,
            input: Vec::new(),
            decoder: Decoder::new(),
            streams: HashMap::new(),
            next_id: 1,
            send_window: DEFAULT_WINDOW,
            peer_initial_window: DEFAULT_WINDOW,
            peer_max_frame: OUT_FRAME_MAX,
            peer_max_streams: usize::MAX,
            block: None,
            goaway: false,
        }
    }

    pub async fn run(mut self) {
        let ended = loop {
            self.sweep();
            self.start_waiting();
            self.send_bodies();
            if !self.commands_open && self.streams.is_empty() && self.waiting.is_empty() {
                // Nobody can call any more and nothing is in flight.
                if self.out.is_empty() {
                    break Ended::Closed;
                }
            }
            match self.wake().await {
                Wake::Writable(r) => {
                    if let Err(e) = r.and_then(|()| self.write_some()) {
                        break Ended::Io(e);
                    }
                }
                Wake::Readable(r) => match r.map_err(Ended::Io).and_then(|()| self.read_some()) {
                    Ok(true) => {}
                    Ok(false) => break Ended::Protocol("the task closed the connection".into()),
                    Err(e) => break e,
                },
                Wake::Command(c) => match c {
                    Some(Command::Call(call)) => self.start(call),
                    Some(Command::Sweep) => {}
                    None => self.commands_open = false,
                },
            }
        };
        let reason = match ended {
            Ended::Io(e) => format!("connection to the task lost: {e}"),
            Ended::Protocol(why) => why,
            Ended::Closed => return,
        };
        debug!(%reason, "control connection ends");
        self.fail_all(&reason);
    }

    /// What wakes the driver, in this order: the socket writable (only with bytes to write),
    /// readable, a command. Polled in place, not as a `select!` of the readiness futures:
    /// those made every connection's driver ~1 KB, one a task, idle or not.
    fn wake(&mut self) -> impl std::future::Future<Output = Wake> + '_ {
        std::future::poll_fn(move |cx| {
            if !self.out.is_empty()
                && let Poll::Ready(r) = self.io.poll_write_ready(cx)
            {
                return Poll::Ready(Wake::Writable(r));
            }
            if let Poll::Ready(r) = self.io.poll_read_ready(cx) {
                return Poll::Ready(Wake::Readable(r));
            }
            if self.commands_open
                && let Poll::Ready(c) = self.commands.poll_next_unpin(cx)
            {
                return Poll::Ready(Wake::Command(c));
            }
            Poll::Pending
        })
    }

    /// Every call in flight or queued ends with `reason` (Unavailable: the process may be gone).
    fn fail_all(&mut self, reason: &str) {
        let end = || Reply::End(Err(Failure::new(tonic::Code::Unavailable, reason)));
        for (_, s) in self.streams.drain() {
            let _ = s.replies.unbounded_send(end());
        }
        self.refuse_new(reason);
    }

    /// No new call is taken: the queued ones and those still in the channel end with `reason`.
    fn refuse_new(&mut self, reason: &str) {
        let end = || Reply::End(Err(Failure::new(tonic::Code::Unavailable, reason)));
        for c in self.waiting.drain(..) {
            let _ = c.replies.unbounded_send(end());
        }
        self.commands.close();
        while let Ok(c) = self.commands.try_recv() {
            if let Command::Call(c) = c {
                let _ = c.replies.unbounded_send(end());
            }
        }
        self.commands_open = false;
    }

    /// Resets the streams whose caller is gone.
    fn sweep(&mut self) {
        let gone: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.replies.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.streams.remove(&id);
            write_frame(&mut self.out, RST_STREAM, 0, id, &CANCEL.to_be_bytes());
        }
        self.waiting.retain(|c| !c.replies.is_closed());
    }

    fn start_waiting(&mut self) {
        while self.streams.len() < self.peer_max_streams
            && let Some(call) = self.waiting.pop_front()
        {
            self.start(call);
        }
    }

    fn start(&mut self, call: Call) {
        if call.replies.is_closed() {
            return;
        }
        if self.streams.len() >= self.peer_max_streams {
            self.waiting.push_back(call);
            return;
        }
        if self.goaway || self.next_id > 0x7fff_ffff {
            let f = Failure::new(
                tonic::Code::Unavailable,
                "the connection takes no new calls",
            );
            let _ = call.replies.unbounded_send(Reply::End(Err(f)));
            return;
        }
        let id = self.next_id;
        self.next_id += 2;
        write_header_block(&mut self.out, id, &call.head, false);
        self.streams.insert(
            id,
            Stream {
                replies: call.replies,
                send_window: self.peer_initial_window,
                body: call.body,
                sent: 0,
                buf: Vec::new(),
            },
        );
    }

    /// Sends what flow control allows of each request body.
    fn send_bodies(&mut self) {
        for (&id, s) in self.streams.iter_mut() {
            while s.sent < s.body.len() {
                let allowed = s.send_window.min(self.send_window).max(0) as usize;
                let n = (s.body.len() - s.sent)
                    .min(allowed)
                    .min(self.peer_max_frame);
                if n == 0 {
                    break;
                }
                let last = s.sent + n == s.body.len();
                let flags = if last { END_STREAM } else { 0 };
                write_frame(&mut self.out, DATA, flags, id, &s.body[s.sent..s.sent + n]);
                s.sent += n;
                s.send_window -= n as i64;
                self.send_window -= n as i64;
            }
            if s.sent == s.body.len() && s.sent > 0 {
                s.body = Vec::new();
                s.sent = 0;
            }
        }
    }

    fn write_some(&mut self) -> io::Result<()> {
        let mut at = 0;
        while at < self.out.len() {
            match self.io.try_write(&self.out[at..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        self.out.drain(..at);
        release(&mut self.out);
        Ok(())
    }

    /// Reads what has arrived and handles every whole frame. Ok(false): end of stream.
    fn read_some(&mut self) -> Result<bool, Ended> {
        let mut scratch = [0u8; 16 * 1024];
        loop {
            match self.io.try_read(&mut scratch) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.input.extend_from_slice(&scratch[..n]);
                    self.handle_input()?;
                    if n < scratch.len() {
                        return Ok(true);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) => return Err(Ended::Io(e)),
            }
        }
    }

    fn handle_input(&mut self) -> Result<(), Ended> {
        let input = std::mem::take(&mut self.input);
        let mut at = 0;
        let mut result = Ok(());
        while let Some((len, kind, flags, stream)) = frame_header(&input[at..]) {
            if len > MAX_IN_FRAME {
                result = Err(protocol(format!(
                    "a frame of {len} bytes (limit {MAX_IN_FRAME})"
                )));
                break;
            }
            let end = at + FRAME_HEADER_LEN + len;
            if input.len() < end {
                break;
            }
            if let Err(e) = self.frame(kind, flags, stream, &input[at + FRAME_HEADER_LEN..end]) {
                result = Err(e);
                break;
            }
            at = end;
        }
        self.input = input;
        self.input.drain(..at);
        release(&mut self.input);
        result
    }

    fn frame(&mut self, kind: u8, flags: u8, id: u32, payload: &[u8]) -> Result<(), Ended> {
        if self.block.is_some() && kind != CONTINUATION {
            return Err(protocol("a header block interrupted by another frame"));
        }
        match kind {
            DATA => self.data(flags, id, payload),
            HEADERS => {
                let fragment = unpadded(HEADERS, flags, payload).map_err(protocol)?;
                self.block = Some(Block {
                    stream: id,
                    end_stream: flags & END_STREAM != 0,
                    fragment: fragment.to_vec(),
                });
                self.continued(flags)
            }
            CONTINUATION => {
                let b = self
                    .block
                    .as_mut()
                    .filter(|b| b.stream == id)
                    .ok_or_else(|| protocol("CONTINUATION without HEADERS"))?;
                b.fragment.extend_from_slice(payload);
                if b.fragment.len() > BLOCK_MAX {
                    return Err(protocol("a header block over 1 MiB"));
                }
                self.continued(flags)
            }
            RST_STREAM => {
                if let Some(s) = self.streams.remove(&id) {
                    let code = word(payload, 0).unwrap_or(0);
                    let f = Failure::new(
                        reset_code(code),
                        format!("the task reset the stream (HTTP/2 error code {code})"),
                    );
                    let _ = s.replies.unbounded_send(Reply::End(Err(f)));
                }
                Ok(())
            }
            SETTINGS if flags & ACK == 0 => self.settings(payload),
            PING if flags & ACK == 0 => {
                write_frame(&mut self.out, PING, ACK, 0, payload);
                Ok(())
            }
            GOAWAY => {
                self.goaway(payload);
                Ok(())
            }
            WINDOW_UPDATE => {
                let inc = i64::from(word(payload, 0).unwrap_or(0) & 0x7fff_ffff);
                if id == 0 {
                    self.send_window += inc;
                } else if let Some(s) = self.streams.get_mut(&id) {
                    s.send_window += inc;
                }
                Ok(())
            }
            PUSH_PROMISE => Err(protocol("a PUSH_PROMISE, though push was disabled")),
            _ => Ok(()), // PRIORITY, acknowledgements, unknown extension frames
        }
    }

    fn data(&mut self, flags: u8, id: u32, payload: &[u8]) -> Result<(), Ended> {
        let end_stream = flags & END_STREAM != 0;
        // The window is given back at once: a message is bounded by MAX_MESSAGE instead.
        if !payload.is_empty() {
            let inc = (payload.len() as u32).to_be_bytes();
            write_frame(&mut self.out, WINDOW_UPDATE, 0, 0, &inc);
            if !end_stream && self.streams.contains_key(&id) {
                write_frame(&mut self.out, WINDOW_UPDATE, 0, id, &inc);
            }
        }
        let Some(s) = self.streams.get_mut(&id) else {
            return Ok(()); // a stream already reset or ended here
        };
        let data = unpadded(DATA, flags, payload).map_err(protocol)?;
        s.buf.extend_from_slice(data);
        match take_messages(&mut s.buf) {
            Ok(messages) => {
                for m in messages {
                    let _ = s.replies.unbounded_send(Reply::Message(m));
                }
                release(&mut s.buf);
                if end_stream {
                    self.end(
                        id,
                        Err(Failure::new(
                            tonic::Code::Internal,
                            "the response ended without a gRPC status",
                        )),
                    );
                }
            }
            Err(f) => {
                self.end(id, Err(f));
                if !end_stream {
                    write_frame(&mut self.out, RST_STREAM, 0, id, &CANCEL.to_be_bytes());
                }
            }
        }
        Ok(())
    }

    fn continued(&mut self, flags: u8) -> Result<(), Ended> {
        if flags & END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        // Decoded even for a stream gone here: the dynamic table must stay in step.
        let headers = self
            .decoder
            .decode(&block.fragment)
            .map_err(|e| protocol(format!("a header block that does not decode: {e:?}")))?;
        let head = ResponseHead::read(&headers);
        if block.end_stream {
            self.end(block.stream, head.outcome());
        } else if let Some(status) = head.http_status.filter(|s| *s != 200) {
            let f = Failure::new(
                tonic::Code::Unknown,
                format!("HTTP status {status} from the task"),
            );
            self.end(block.stream, Err(f));
            write_frame(
                &mut self.out,
                RST_STREAM,
                0,
                block.stream,
                &CANCEL.to_be_bytes(),
            );
        }
        Ok(())
    }

    fn end(&mut self, id: u32, outcome: Result<(), Failure>) {
        if let Some(s) = self.streams.remove(&id) {
            let _ = s.replies.unbounded_send(Reply::End(outcome));
        }
    }

    fn settings(&mut self, payload: &[u8]) -> Result<(), Ended> {
        let pairs = settings(payload).ok_or_else(|| protocol("a SETTINGS frame of odd length"))?;
        for (id, value) in pairs {
            match id {
                SETTINGS_INITIAL_WINDOW_SIZE => {
                    let new = i64::from(value);
                    let delta = new - self.peer_initial_window;
                    self.peer_initial_window = new;
                    for s in self.streams.values_mut() {
                        s.send_window += delta;
                    }
                }
                SETTINGS_MAX_FRAME_SIZE => {
                    self.peer_max_frame = (value as usize).clamp(OUT_FRAME_MAX, (1 << 24) - 1);
                }
                SETTINGS_MAX_CONCURRENT_STREAMS => self.peer_max_streams = value as usize,
                // No dynamic table is used when sending: the peer's size does not matter.
                SETTINGS_HEADER_TABLE_SIZE => {}
                _ => {}
            }
        }
        write_frame(&mut self.out, SETTINGS, ACK, 0, &[]);
        Ok(())
    }

    /// The peer takes no new streams: those it will not process fail (they may be retried
    /// on a new connection), the others run to their end, and no new call is taken.
    fn goaway(&mut self, payload: &[u8]) {
        let last = word(payload, 0).unwrap_or(0) & 0x7fff_ffff;
        let code = word(payload, 4).unwrap_or(NO_ERROR);
        let reason =
            format!("the task is closing the connection (GOAWAY, HTTP/2 error code {code})");
        let unprocessed: Vec<u32> = self
            .streams
            .keys()
            .copied()
            .filter(|id| *id > last)
            .collect();
        for id in unprocessed {
            self.end(id, Err(Failure::new(tonic::Code::Unavailable, &reason)));
        }
        self.refuse_new(&reason);
        self.goaway = true;
    }
}

fn protocol(why: impl Into<String>) -> Ended {
    Ended::Protocol(format!(
        "HTTP/2 protocol error from the task: {}",
        why.into()
    ))
}

/// An empty buffer gives its memory back (an idle connection holds none).
fn release(buf: &mut Vec<u8>) {
    if buf.is_empty() && buf.capacity() > KEEP_CAPACITY {
        *buf = Vec::new();
    }
}

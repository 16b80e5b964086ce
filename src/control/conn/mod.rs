//! One control connection to one task process: gRPC calls over a plain HTTP/2 connection,
//! written for the operator's size (one connection per task, thousands of them, most idle
//! between transitions with a state stream open).
//!
//! A general HTTP/2 stack keeps tens of KiB per connection whether it is busy or not (a
//! 16 KiB write buffer, 12 KiB of read buffers, request queues, decode buffers): at 10,000
//! tasks that was most of the operator's memory (docs/benchmarks.md). This one keeps what an
//! idle connection needs (the HPACK table the task has built, its streams' senders) and
//! allocates its buffers per frame. It speaks what the task control protocol uses: unary and
//! server-streaming calls with one request message, flow control both ways, SETTINGS, PING,
//! RST_STREAM, GOAWAY; no push, no compression, no TLS.
//!
//! [`grpc`] (pure: request headers, message framing, status) and [`driver`] (the task that
//! owns the socket).

pub mod driver;
pub mod grpc;

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use futures::channel::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::net::TcpStream;

pub use driver::Reply;
use driver::{Call, Command, Driver};
pub use grpc::Failure;

/// A handle on one connection; clones share it. The connection closes once every handle
/// and every call's [`Replies`] are gone, or when the peer closes it.
#[derive(Clone, Debug)]
pub struct Conn {
    authority: std::sync::Arc<str>,
    commands: UnboundedSender<Command>,
}

impl Conn {
    /// Connects to `addr` (within `timeout`) and starts the connection's driver on the
    /// current runtime.
    pub async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let io = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no TCP connection within {timeout:?}"),
                )
            })??;
        io.set_nodelay(true)?;
        let (commands, rx) = mpsc::unbounded();
        tokio::spawn(Driver::new(io, rx).run());
        Ok(Conn {
            authority: addr.to_string().into(),
            commands,
        })
    }

    /// Whether the connection has ended (the peer closed it or sent GOAWAY): calls on it fail.
    pub fn is_closed(&self) -> bool {
        self.commands.is_closed()
    }

    /// Starts one call: `message` (already encoded) to `path` with `content_type`, and
    /// `timeout` as the call's grpc-timeout. The replies come as they arrive; the last is
    /// always [`Reply::End`] unless the connection's driver is gone first (the stream then
    /// just ends). Dropping the [`Replies`] cancels the call.
    pub fn call(
        &self,
        path: &str,
        content_type: &str,
        timeout: Option<Duration>,
        message: &[u8],
    ) -> Replies {
        let (tx, rx) = mpsc::unbounded();
        let call = Call {
            head: grpc::request_headers(path, &self.authority, content_type, timeout),
            body: grpc::frame_message(message),
            replies: tx,
        };
        if let Err(e) = self.commands.unbounded_send(Command::Call(call))
            && let Command::Call(call) = e.into_inner()
        {
            let f = Failure::new(
                tonic::Code::Unavailable,
                "the connection to the task is closed",
            );
            let _ = call.replies.unbounded_send(Reply::End(Err(f)));
        }
        Replies {
            rx,
            wake: self.commands.clone(),
        }
    }
}

/// The replies of one call, in order.
pub struct Replies {
    rx: UnboundedReceiver<Reply>,
    wake: UnboundedSender<Command>,
}

impl Stream for Replies {
    type Item = Reply;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Reply>> {
        Pin::new(&mut self.rx).poll_next(cx)
    }
}

impl Drop for Replies {
    fn drop(&mut self) {
        // The driver resets the stream if it is still open.
        self.rx.close();
        let _ = self.wake.unbounded_send(Command::Sweep);
    }
}

impl Replies {
    /// A unary call's one message, or how it failed.
    pub async fn single(mut self) -> Result<Vec<u8>, Failure> {
        use futures::StreamExt;
        let mut first = None;
        while let Some(r) = self.next().await {
            match r {
                Reply::Message(m) => {
                    first.get_or_insert(m);
                }
                Reply::End(Ok(())) => {
                    return first.ok_or_else(|| {
                        Failure::new(tonic::Code::Internal, "the task's reply has no message")
                    });
                }
                Reply::End(Err(f)) => return Err(f),
            }
        }
        Err(closed())
    }
}

/// The driver went away without a word (its connection ended while the call was queued).
pub fn closed() -> Failure {
    Failure::new(
        tonic::Code::Unavailable,
        "the connection to the task closed",
    )
}

#[cfg(test)]
mod tests;

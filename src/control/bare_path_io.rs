//! The connection wrapper that applies [`super::bare_path`] to a live HTTP/2 connection: the
//! client rewrites what it writes, the simulator what it reads. The other direction passes
//! through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::bare_path::{PathRewriter, Rewrite};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// Rewrites the bytes written (a client).
    Write,
    /// Rewrites the bytes read (a server).
    Read,
}

/// An I/O stream whose client-to-server half has its `:path`s rewritten.
pub struct BarePathIo<T> {
    inner: T,
    side: Side,
    rewriter: PathRewriter,
    /// Rewritten bytes not yet written to (Write side) or read by (Read side) the other end.
    pending: Vec<u8>,
    pos: usize,
}

impl<T> BarePathIo<T> {
    /// A client towards a device that wants bare method names.
    pub fn client(inner: T) -> Self {
        Self::new(inner, Side::Write, Rewrite::StripSlash)
    }

    /// A server that routes bare method names as `/Method`.
    pub fn server(inner: T) -> Self {
        Self::new(inner, Side::Read, Rewrite::AddSlash)
    }

    fn new(inner: T, side: Side, rewrite: Rewrite) -> Self {
        BarePathIo {
            inner,
            side,
            rewriter: PathRewriter::new(rewrite),
            pending: Vec::new(),
            pos: 0,
        }
    }
}

fn invalid(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl<T: AsyncWrite + Unpin> BarePathIo<T> {
    /// Writes out what is pending; Ready once nothing is.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pos < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.pos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pos += n;
        }
        self.pending.clear();
        self.pos = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for BarePathIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.side == Side::Write {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        loop {
            if this.pos < this.pending.len() {
                let n = (this.pending.len() - this.pos).min(buf.remaining());
                buf.put_slice(&this.pending[this.pos..this.pos + n]);
                this.pos += n;
                return Poll::Ready(Ok(()));
            }
            this.pending.clear();
            this.pos = 0;
            let mut raw = [0u8; 8192];
            let mut raw_buf = ReadBuf::new(&mut raw);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut raw_buf))?;
            let got = raw_buf.filled();
            if got.is_empty() {
                return Poll::Ready(Ok(())); // end of stream
            }
            this.rewriter
                .feed(got, &mut this.pending)
                .map_err(invalid)?;
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for BarePathIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.side == Side::Read {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        // Accept new bytes only once the previous ones are out: that is the back-pressure.
        ready!(this.poll_drain(cx))?;
        this.rewriter
            .feed(buf, &mut this.pending)
            .map_err(invalid)?;
        // Start writing now; what is left goes out on the next write or flush.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.side == Side::Write {
            ready!(this.poll_drain(cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.side == Side::Write {
            ready!(this.poll_drain(cx))?;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for BarePathIo<TcpStream> {
    type ConnectInfo = <TcpStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loona_hpack::Decoder;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use crate::control::client::TaskEndpoint;
    use crate::control::policy::ControlClient;
    use crate::plan::ControlMode;

    /// What the first request of a connection carries as `:path`, read off the raw bytes.
    async fn first_path_sent(mode: ControlMode) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let capture = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.expect("accept");
            let mut bytes = Vec::new();
            let mut dec = Decoder::new();
            loop {
                let mut chunk = [0u8; 4096];
                let n = sock.read(&mut chunk).await.expect("read");
                assert!(n > 0, "connection closed before a request");
                bytes.extend_from_slice(&chunk[..n]);
                let mut at = 24; // the preface
                while bytes.len() >= at + 9 {
                    let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]);
                    let end = at + 9 + len as usize;
                    if bytes.len() < end {
                        break;
                    }
                    if bytes[at + 3] == 0x1 {
                        let headers = dec.decode(&bytes[at + 9..end]).expect("hpack");
                        let (_, path) = headers
                            .into_iter()
                            .find(|(n, _)| n == b":path")
                            .expect(":path");
                        return String::from_utf8(path).expect("utf8");
                    }
                    at = end;
                }
            }
        });
        // Nobody answers: the call ends at its deadline, after the request went out.
        let ep = TaskEndpoint::new(addr, mode);
        let _ = ControlClient::default()
            .get_state(&ep, Duration::from_secs(2))
            .await;
        tokio::time::timeout(Duration::from_secs(5), capture)
            .await
            .expect("request seen")
            .expect("capture task")
    }

    #[tokio::test]
    async fn a_fairmq_call_sends_the_bare_method_name_and_a_direct_call_the_full_path() {
        assert_eq!(first_path_sent(ControlMode::Fairmq).await, "GetState");
        assert_eq!(
            first_path_sent(ControlMode::Direct).await,
            "/occ_pb.Occ/GetState"
        );
    }
}

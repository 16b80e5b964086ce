//! The connection wrapper that applies [`super::bare_path`] to a live HTTP/2 connection on
//! the simulator's side: it rewrites the `:path`s it reads (`GetState` -> `/GetState`, so
//! tonic can route them); what it writes passes through untouched. (The control client
//! writes bare names itself, [`super::conn`].)

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::bare_path::{PathRewriter, Rewrite};

/// An I/O stream whose client-to-server half (what it reads) has its `:path`s rewritten.
pub struct BarePathIo<T> {
    inner: T,
    rewriter: PathRewriter,
    /// Rewritten bytes not yet read.
    pending: Vec<u8>,
    pos: usize,
}

impl<T> BarePathIo<T> {
    /// A server that routes bare method names as `/Method`.
    pub fn server(inner: T) -> Self {
        BarePathIo {
            inner,
            rewriter: PathRewriter::new(Rewrite::AddSlash),
            pending: Vec::new(),
            pos: 0,
        }
    }
}

fn invalid(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl<T: AsyncRead + Unpin> AsyncRead for BarePathIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
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
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for BarePathIo<TcpStream> {
    type ConnectInfo = <TcpStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

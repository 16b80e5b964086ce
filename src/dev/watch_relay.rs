//! `envbridge dev watch-relay`: a TCP relay between kwok and kube-apiserver that reads the
//! apiserver's side as fast as it comes and holds it for kwok (up to [`HOLD_MAX`] bytes a
//! connection), so that the apiserver never sees kwok as a slow watcher.
//!
//! Why: kwok takes every pod event through one goroutine; in a burst of 10,000 pods it falls
//! behind, the apiserver's buffer for its watch fills and the apiserver cuts the watch off,
//! and kwok is sent everything since again and writes those pods' status a second time
//! (docs/benchmarks.md, "Why the 10,000-task teardown is 1.6-1.9"). A site has a kubelet a
//! node, which never lags so. Behind the relay kwok lags as much as before, but the events
//! wait here instead of in the apiserver. kwok must speak HTTP/1.1 to it (`DISABLE_HTTP2`):
//! HTTP/2's flow control would hold the apiserver back whatever is buffered in between.
//! TLS passes through untouched (the apiserver's certificate names 127.0.0.1, any port).
//! Only addresses in 127.0.0.0/8 are listened on or connected to.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tracing::{debug, info, warn};

/// The most held for one connection's reader (bytes); past it the relay stops reading the
/// apiserver until the reader takes some, as a plain connection would.
pub const HOLD_MAX: usize = 1 << 30;
/// One read's most (bytes).
const CHUNK: usize = 64 * 1024;

#[derive(clap::Args, Debug, Clone)]
pub struct WatchRelayArgs {
    /// Where kwok connects (127.0.0.0/8).
    #[arg(long)]
    pub listen: SocketAddr,
    /// The apiserver (127.0.0.0/8).
    #[arg(long)]
    pub upstream: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("--{flag} {addr}: only loopback addresses (127.0.0.0/8) are allowed")]
    NotLoopback {
        flag: &'static str,
        addr: SocketAddr,
    },
    #[error("listening on {addr}: {source}")]
    Listen { addr: SocketAddr, source: io::Error },
}

/// Checks both addresses and binds the listener.
pub async fn bind(args: &WatchRelayArgs) -> Result<TcpListener, RelayError> {
    for (flag, addr) in [("listen", args.listen), ("upstream", args.upstream)] {
        if !matches!(addr.ip(), IpAddr::V4(v4) if v4.is_loopback()) {
            return Err(RelayError::NotLoopback { flag, addr });
        }
    }
    TcpListener::bind(args.listen)
        .await
        .map_err(|source| RelayError::Listen {
            addr: args.listen,
            source,
        })
}

/// Relays every connection accepted on `listener` to `upstream`, holding at most `hold_max`
/// bytes of the upstream's side for each; runs until the listener fails.
pub async fn serve(listener: TcpListener, upstream: SocketAddr, hold_max: usize) -> io::Result<()> {
    loop {
        let (down, peer) = listener.accept().await?;
        tokio::spawn(async move {
            match TcpStream::connect(upstream).await {
                Ok(up) => relay(down, up, hold_max).await,
                Err(e) => warn!(%peer, %upstream, error = %e, "connecting upstream"),
            }
        });
    }
}

/// One connection: the client's bytes go up as they come (back-pressure as usual); the
/// upstream's are read at once and held until the client takes them.
async fn relay(down: TcpStream, up: TcpStream, hold_max: usize) {
    let _ = down.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let (mut down_r, mut down_w) = down.into_split();
    let (mut up_r, mut up_w) = up.into_split();
    let requests = async {
        let _ = tokio::io::copy(&mut down_r, &mut up_w).await;
        let _ = up_w.shutdown().await;
    };
    // Bytes held, counted by a semaphore: a read waits for room, a write to the client
    // frees it.
    let room = Arc::new(Semaphore::new(hold_max));
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let read = {
        let room = room.clone();
        async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = match up_r.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                // n <= CHUNK fits in u32; the semaphore is never closed.
                match room.acquire_many(n as u32).await {
                    Ok(p) => p.forget(),
                    Err(_) => break,
                }
                if tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        }
    };
    let write = async {
        while let Some(chunk) = rx.recv().await {
            if down_w.write_all(&chunk).await.is_err() {
                // The client is gone: whatever is held is dropped with it.
                room.close();
                break;
            }
            room.add_permits(chunk.len());
        }
        let _ = down_w.shutdown().await;
    };
    tokio::join!(requests, async { tokio::join!(read, write) });
    debug!("relayed connection closed");
}

/// `envbridge dev watch-relay`.
pub fn run(args: WatchRelayArgs) -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        let listener = match bind(&args).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        info!(listen = %args.listen, upstream = %args.upstream, "watch relay");
        match serve(listener, args.upstream, HOLD_MAX).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: accepting on {}: {e}", args.listen);
                std::process::ExitCode::FAILURE
            }
        }
    })
}

#[cfg(test)]
mod tests;

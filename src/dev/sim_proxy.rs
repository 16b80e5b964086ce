//! The sim runner's fault proxy (`dev sim-runner --fault-dir`): listens on a pod's control
//! address in place of its simulator and forwards every TCP connection to the simulator on a
//! loopback port, or stalls or cuts them as a control file says, so that a test can break one
//! task's control connection at runtime.
//!
//! The control file (`DIR/<namespace>_<pod>.proxy`) is read every [`POLL`]: missing or `pass`
//! forwards; `stall` holds every byte (nothing more is read from or written to either side;
//! connections stay open, new ones are accepted and held) until `pass`, which forwards what
//! was held; `cut` closes every open connection at once, and every new one as soon as it is
//! accepted, until `pass`. `#` comments and blank lines are allowed; an empty file changes
//! nothing (a write in progress), nor does a malformed one (logged once). Only addresses in
//! 127.0.0.0/8 are listened on or connected to.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How often the control file is read.
pub const POLL: Duration = Duration::from_millis(50);
/// The most of a control file read.
const CONTROL_MAX: u64 = 4096;
/// How long a new connection waits for the simulator to listen (it starts with the proxy).
const CONNECT_FOR: Duration = Duration::from_secs(3);
const CONNECT_RETRY: Duration = Duration::from_millis(25);

/// What the proxy does with the connections, as the control file says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Stall,
    Cut,
}

impl Mode {
    /// A control file's text: the mode it names, or None when it names none (empty).
    pub fn parse(text: &str) -> Result<Option<Mode>, String> {
        let mut words = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default().trim())
            .enumerate()
            .filter(|(_, l)| !l.is_empty());
        let Some((i, word)) = words.next() else {
            return Ok(None);
        };
        let mode = match word {
            "pass" => Mode::Pass,
            "stall" => Mode::Stall,
            "cut" => Mode::Cut,
            other => {
                return Err(format!(
                    "line {}: {other:?} is not pass, stall or cut",
                    i + 1
                ));
            }
        };
        match words.next() {
            Some((j, more)) => Err(format!(
                "line {}: {more:?}: one mode only (already {word:?})",
                j + 1
            )),
            None => Ok(Some(mode)),
        }
    }
}

/// The mode the control file at `path` names now (missing: pass; None: no change).
pub fn read_control(path: &Path) -> Result<Option<Mode>, String> {
    use std::io::Read;
    let text = std::fs::File::open(path).and_then(|f| {
        if f.metadata()?.len() > CONTROL_MAX {
            return Err(io::Error::other(format!("larger than {CONTROL_MAX} bytes")));
        }
        let mut buf = Vec::new();
        f.take(CONTROL_MAX).read_to_end(&mut buf)?;
        String::from_utf8(buf).map_err(|_| io::Error::other("not UTF-8 text"))
    });
    match text {
        Ok(text) => Mode::parse(&text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Some(Mode::Pass)),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("sim proxy refuses {0}: not in 127.0.0.0/8")]
    NotLoopback(SocketAddr),
    #[error("sim proxy cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

fn loopback_v4(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(v4) if v4.is_loopback())
}

/// A running proxy; stopped by [`SimProxy::stop`] or when dropped.
#[derive(Debug)]
pub struct SimProxy {
    addr: SocketAddr,
    task: Option<JoinHandle<()>>,
}

impl SimProxy {
    /// Listens on `listen` and forwards to `upstream` as `control` says (both addresses in
    /// 127.0.0.0/8). A `listen` port 0 picks a free port ([`SimProxy::local_addr`]).
    pub async fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        control: PathBuf,
    ) -> Result<SimProxy, ProxyError> {
        for a in [listen, upstream] {
            if !loopback_v4(a.ip()) {
                return Err(ProxyError::NotLoopback(a));
            }
        }
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ProxyError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().unwrap_or(listen);
        let task = tokio::spawn(run(listener, addr, upstream, control));
        Ok(SimProxy {
            addr,
            task: Some(task),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops it: its listener and every connection are closed when this returns.
    pub async fn stop(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for SimProxy {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn run(listener: TcpListener, addr: SocketAddr, upstream: SocketAddr, control: PathBuf) {
    let (mode, _) = watch::channel(Mode::Pass);
    let mut bad: Option<String> = None;
    // Every connection's task: dropped (aborted) with this one.
    let mut conns = JoinSet::new();
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = poll.tick() => refresh(&control, &mode, &mut bad, addr),
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) => {
                    if *mode.borrow() == Mode::Cut {
                        debug!("sim proxy {addr}: cut, closing the connection from {peer}");
                        drop(client);
                        continue;
                    }
                    conns.spawn(pipe(client, upstream, mode.subscribe()));
                }
                Err(e) => {
                    warn!("sim proxy {addr}: accept: {e}");
                    tokio::time::sleep(POLL).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

fn refresh(control: &Path, mode: &watch::Sender<Mode>, bad: &mut Option<String>, addr: SocketAddr) {
    match read_control(control) {
        Ok(Some(m)) => {
            *bad = None;
            mode.send_if_modified(|cur| {
                if *cur == m {
                    return false;
                }
                info!("sim proxy {addr}: {cur:?} -> {m:?} ({})", control.display());
                *cur = m;
                true
            });
        }
        Ok(None) => {}
        Err(e) => {
            if bad.as_deref() != Some(e.as_str()) {
                warn!(
                    "sim proxy {addr}: control file {}: {e}; mode unchanged",
                    control.display()
                );
                *bad = Some(e);
            }
        }
    }
}

/// One connection, until either side ends it or the mode is `cut`.
async fn pipe(client: TcpStream, upstream: SocketAddr, mode: watch::Receiver<Mode>) {
    let mut cut = mode.clone();
    tokio::select! {
        biased;
        _ = cut.wait_for(|m| *m == Mode::Cut) => debug!("sim proxy: connection cut"),
        r = forward(client, upstream, mode) => {
            if let Err(e) = r {
                debug!("sim proxy: connection to {upstream} ends: {e}");
            }
        }
    }
}

async fn forward(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
) -> io::Result<()> {
    flowing(&mut mode).await?;
    let up = connect(upstream).await?;
    let _ = client.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = up.into_split();
    tokio::try_join!(copy(cr, uw, mode.clone()), copy(ur, cw, mode))?;
    Ok(())
}

/// Waits while the mode is `stall`.
async fn flowing(mode: &mut watch::Receiver<Mode>) -> io::Result<()> {
    mode.wait_for(|m| *m != Mode::Stall)
        .await
        .map(drop)
        .map_err(|_| io::Error::other("proxy stopped"))
}

/// The simulator starts with its proxy: a connection may come before it listens.
async fn connect(upstream: SocketAddr) -> io::Result<TcpStream> {
    let deadline = Instant::now() + CONNECT_FOR;
    loop {
        match TcpStream::connect(upstream).await {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                tokio::time::sleep(CONNECT_RETRY).await;
            }
            r => return r,
        }
    }
}

/// One direction: bytes read are written on unless stalled, when they are held (and nothing
/// more is read) until the mode changes.
async fn copy(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        flowing(&mut mode).await?;
        let n = tokio::select! {
            n = from.read(&mut buf) => n?,
            // A read is cancel-safe: stop reading at once when stalled.
            _ = mode.wait_for(|m| *m == Mode::Stall) => continue,
        };
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        flowing(&mut mode).await?;
        to.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Duration = Duration::from_millis(300);
    const SOON: Duration = Duration::from_secs(2);

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn set(path: &Path, text: &str) {
        // Written whole (rename), as a harness should, then a few polls.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
        tokio::time::sleep(POLL * 4).await;
    }

    async fn echoes(s: &mut TcpStream, what: &[u8]) {
        s.write_all(what).await.unwrap();
        received(s, what).await;
    }

    async fn received(s: &mut TcpStream, what: &[u8]) {
        let mut buf = vec![0u8; what.len()];
        tokio::time::timeout(SOON, s.read_exact(&mut buf))
            .await
            .expect("echo in time")
            .unwrap();
        assert_eq!(buf, what);
    }

    async fn silent(s: &mut TcpStream) {
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(QUIET, s.read(&mut buf)).await;
        assert!(r.is_err(), "nothing may come through: {r:?}");
    }

    async fn closed(s: &mut TcpStream) {
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(SOON, s.read(&mut buf))
            .await
            .expect("closed in time");
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    }

    #[tokio::test]
    async fn pass_stall_cut_and_pass_again() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("ns_pod.proxy");
        let upstream = echo_server().await;
        let proxy = SimProxy::start("127.0.0.1:0".parse().unwrap(), upstream, control.clone())
            .await
            .unwrap();
        let addr = proxy.local_addr();

        // Missing file: forward.
        let mut a = TcpStream::connect(addr).await.unwrap();
        echoes(&mut a, b"one").await;
        set(&control, "pass\n").await;
        echoes(&mut a, b"two").await;

        // Stall: nothing through, connections stay open, new ones are accepted and held.
        set(&control, "# frozen\nstall\n").await;
        a.write_all(b"held").await.unwrap();
        silent(&mut a).await;
        let mut b = TcpStream::connect(addr).await.unwrap();
        b.write_all(b"new").await.unwrap();
        silent(&mut b).await;
        // An empty file (a write in progress) changes nothing.
        set(&control, "").await;
        silent(&mut a).await;

        // Pass again: what was held comes through, and the connections carry on.
        set(&control, "pass").await;
        received(&mut a, b"held").await;
        received(&mut b, b"new").await;
        echoes(&mut a, b"three").await;

        // Cut: every open connection closes, new ones are closed at once.
        set(&control, "cut\n").await;
        closed(&mut a).await;
        closed(&mut b).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        closed(&mut c).await;
        // A malformed file leaves it cut.
        set(&control, "open sesame\n").await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        closed(&mut c).await;

        // Pass again (file removed): new connections are forwarded.
        std::fs::remove_file(&control).unwrap();
        tokio::time::sleep(POLL * 4).await;
        let mut d = TcpStream::connect(addr).await.unwrap();
        echoes(&mut d, b"four").await;

        // Stopped: its listener is gone, its connections closed.
        proxy.stop().await;
        closed(&mut d).await;
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn a_cut_during_a_stall_drops_what_was_held() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("ns_pod.proxy");
        let proxy = SimProxy::start(
            "127.0.0.1:0".parse().unwrap(),
            echo_server().await,
            control.clone(),
        )
        .await
        .unwrap();
        let mut a = TcpStream::connect(proxy.local_addr()).await.unwrap();
        echoes(&mut a, b"x").await;
        set(&control, "stall").await;
        a.write_all(b"lost").await.unwrap();
        silent(&mut a).await;
        set(&control, "cut").await;
        closed(&mut a).await;
    }

    #[tokio::test]
    async fn only_loopback_v4() {
        let up: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let f = PathBuf::from("/nonexistent/x.proxy");
        for bad in ["10.0.0.1:0", "0.0.0.0:0", "[::1]:0", "[::]:0"] {
            let r = SimProxy::start(bad.parse().unwrap(), up, f.clone()).await;
            assert!(matches!(r, Err(ProxyError::NotLoopback(_))), "{bad}");
        }
        let r = SimProxy::start(
            "127.0.0.1:0".parse().unwrap(),
            "192.168.1.1:80".parse().unwrap(),
            f,
        )
        .await;
        assert!(matches!(r, Err(ProxyError::NotLoopback(_))));
    }

    #[test]
    fn control_files() {
        assert_eq!(Mode::parse("pass"), Ok(Some(Mode::Pass)));
        assert_eq!(Mode::parse("# x\n\n stall \n"), Ok(Some(Mode::Stall)));
        assert_eq!(Mode::parse("cut # now\n"), Ok(Some(Mode::Cut)));
        assert_eq!(Mode::parse(""), Ok(None));
        assert_eq!(Mode::parse("# only a comment\n"), Ok(None));
        assert!(Mode::parse("Stall").unwrap_err().contains("line 1"));
        assert!(Mode::parse("pass\ncut").unwrap_err().contains("line 2"));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.proxy");
        assert_eq!(read_control(&f), Ok(Some(Mode::Pass)), "missing: pass");
        std::fs::write(&f, "x".repeat(5000)).unwrap();
        assert!(read_control(&f).unwrap_err().contains("larger"));
    }
}

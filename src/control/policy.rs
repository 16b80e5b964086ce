//! The control client as an explicit value: its policy (may it dial non-loopback addresses?)
//! and its connection cache. The operator builds one at start-up and hands it to every caller;
//! `envbridge task` builds its own. Nothing is process-global, so two values (two operators
//! in one test process, say) never share a connection nor a policy.
//!
//! Connections are cached per address (HTTP/2 multiplexes every call to one task over one
//! connection; a closed one is replaced at the next call), so driving thousands of tasks
//! costs one handshake per task, not one per call.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use super::conn::Conn;
use super::error::ControlError;

/// Set to `1` or `true` to let the client dial non-loopback addresses (a real deployment
/// does; tests and the local control plane never need to). Read by [`ControlClient::from_env`].
pub const ALLOW_REMOTE_ENV: &str = "ENVBRIDGE_CONTROL_ALLOW_REMOTE";

/// How long to wait for the TCP connection itself (the call deadline bounds it too).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The task control client: cheap to clone (clones share the policy and the cache). The
/// default refuses every address that is not loopback.
#[derive(Clone, Default)]
pub struct ControlClient {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    allow_remote: bool,
    conns: DashMap<SocketAddr, Cached>,
}

/// A cached connection, valid while the runtime that created it lives and the peer keeps it.
struct Cached {
    conn: Conn,
    /// A task parked in the creating runtime: finished once that runtime is gone, which
    /// makes the connection's driver gone too.
    runtime_alive: tokio::task::AbortHandle,
}

impl std::fmt::Debug for ControlClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlClient")
            .field("allow_remote", &self.shared.allow_remote)
            .field("cached_connections", &self.shared.conns.len())
            .finish()
    }
}

/// Whether a value of [`ALLOW_REMOTE_ENV`] allows remote dialing (`1` or `true`, nothing else).
pub fn allows_remote(value: Option<&str>) -> bool {
    matches!(value, Some("1" | "true"))
}

impl ControlClient {
    /// A client with an empty cache; `allow_remote` lets it dial non-loopback addresses.
    pub fn new(allow_remote: bool) -> Self {
        ControlClient {
            shared: Arc::new(Shared {
                allow_remote,
                conns: DashMap::new(),
            }),
        }
    }

    /// A client whose policy comes from [`ALLOW_REMOTE_ENV`] (read now, once).
    pub fn from_env() -> Self {
        Self::new(allows_remote(
            std::env::var(ALLOW_REMOTE_ENV).ok().as_deref(),
        ))
    }

    pub fn allow_remote(&self) -> bool {
        self.shared.allow_remote
    }

    /// Drops the cached connection to `addr` (e.g. when its pod is gone).
    pub fn forget(&self, addr: &SocketAddr) {
        self.shared.conns.remove(addr);
    }

    /// The policy alone: may this client dial `addr`?
    fn check(&self, addr: SocketAddr) -> Result<(), ControlError> {
        if addr.ip().is_loopback() || self.shared.allow_remote {
            Ok(())
        } else {
            Err(ControlError::NotLoopback { addr })
        }
    }

    /// The cached connection to `addr`, or a new one; a failure to connect names `call`.
    pub(super) async fn conn(&self, addr: SocketAddr, call: &str) -> Result<Conn, ControlError> {
        self.check(addr)?;
        let conns = &self.shared.conns;
        if let Some(c) = conns.get(&addr)
            && !c.runtime_alive.is_finished()
            && !c.conn.is_closed()
        {
            return Ok(c.conn.clone());
        }
        let conn = Conn::connect(addr, CONNECT_TIMEOUT)
            .await
            .map_err(|e| ControlError::Rpc {
                addr,
                call: call.into(),
                code: tonic::Code::Unavailable,
                message: format!("cannot connect: {e}"),
            })?;
        let runtime_alive = tokio::spawn(std::future::pending::<()>()).abort_handle();
        // Two first calls racing both connect; the last one stays cached, the other serves
        // its call and closes.
        if let Some(old) = conns.insert(
            addr,
            Cached {
                conn: conn.clone(),
                runtime_alive,
            },
        ) {
            old.runtime_alive.abort();
        }
        Ok(conn)
    }

    #[cfg(test)]
    fn cached(&self) -> usize {
        self.shared.conns.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Documentation range (RFC 5737): never dialled here (refused or only checked).
    const REMOTE: &str = "192.0.2.7:47100";
    const LOCAL: &str = "127.0.0.1:0";

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn the_default_refuses_a_non_loopback_address() {
        let client = ControlClient::default();
        assert!(!client.allow_remote());
        let e = client.conn(addr(REMOTE), "test").await.unwrap_err();
        assert!(matches!(e, ControlError::NotLoopback { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "refusing to dial 192.0.2.7:47100: not a loopback address \
             (set ENVBRIDGE_CONTROL_ALLOW_REMOTE=1 to allow)"
        );
        assert_eq!(client.cached(), 0);
        // IPv6 loopback is loopback.
        assert!(client.check(addr("[::1]:47100")).is_ok());
    }

    #[tokio::test]
    async fn allow_remote_lets_a_non_loopback_address_through() {
        // Checked, not dialled: tests never connect outside loopback.
        let client = ControlClient::new(true);
        assert!(client.allow_remote());
        assert!(client.check(addr(REMOTE)).is_ok());
    }

    #[tokio::test]
    async fn two_values_do_not_share_a_cache_but_clones_do() {
        let listener = tokio::net::TcpListener::bind(LOCAL).await.unwrap();
        let local = listener.local_addr().unwrap();
        let a = ControlClient::default();
        let b = ControlClient::default();
        let a2 = a.clone();
        a.conn(local, "test").await.unwrap();
        assert_eq!(a.cached(), 1);
        assert_eq!(a2.cached(), 1);
        assert_eq!(b.cached(), 0);
        // A second call reuses the cached connection: one accept only.
        a2.conn(local, "test").await.unwrap();
        let (_first, _) = listener.accept().await.unwrap();
        let second = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(second.is_err(), "a second connection was made");
        assert_eq!(a.cached(), 1);
        b.forget(&local);
        assert_eq!(a.cached(), 1);
        a2.forget(&local);
        assert_eq!(a.cached(), 0);
    }

    #[tokio::test]
    async fn a_connection_the_peer_closed_is_replaced() {
        let listener = tokio::net::TcpListener::bind(LOCAL).await.unwrap();
        let local = listener.local_addr().unwrap();
        let client = ControlClient::default();
        let first = client.conn(local, "test").await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        drop(server);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !first.is_closed() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "never saw the close"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let second = client.conn(local, "test").await.unwrap();
        assert!(!second.is_closed());
        tokio::time::timeout(Duration::from_secs(5), listener.accept())
            .await
            .expect("a new connection")
            .unwrap();
    }

    #[test]
    fn only_one_and_true_allow_remote() {
        assert!(allows_remote(Some("1")));
        assert!(allows_remote(Some("true")));
        for v in [
            None,
            Some(""),
            Some("0"),
            Some("yes"),
            Some("TRUE"),
            Some("false"),
        ] {
            assert!(!allows_remote(v), "{v:?}");
        }
    }
}

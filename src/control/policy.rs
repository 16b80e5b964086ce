//! The control client as an explicit value: its policy (may it dial non-loopback addresses?)
//! and its channel cache. The operator builds one at start-up and hands it to every caller;
//! `envbridge task` builds its own. Nothing is process-global, so two values (two operators
//! in one test process, say) never share a channel nor a policy.
//!
//! Channels are cached per address (HTTP/2 multiplexes every call to one task over one
//! connection, and reconnects on its own), so driving thousands of tasks costs one handshake
//! per task, not one per call.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use super::bare_path_io::BarePathIo;
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
    channels: DashMap<SocketAddr, Cached>,
}

/// A cached channel, valid while the runtime that created it lives.
struct Cached {
    channel: Channel,
    /// A task parked in the creating runtime: finished once that runtime is gone, which
    /// makes the channel's background worker gone too.
    runtime_alive: tokio::task::AbortHandle,
}

impl std::fmt::Debug for ControlClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlClient")
            .field("allow_remote", &self.shared.allow_remote)
            .field("cached_channels", &self.shared.channels.len())
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
                channels: DashMap::new(),
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

    /// Drops the cached channel to `addr` (e.g. when its pod is gone).
    pub fn forget(&self, addr: &SocketAddr) {
        self.shared.channels.remove(addr);
    }

    /// The policy alone: may this client dial `addr`?
    fn check(&self, addr: SocketAddr) -> Result<(), ControlError> {
        if addr.ip().is_loopback() || self.shared.allow_remote {
            Ok(())
        } else {
            Err(ControlError::NotLoopback { addr })
        }
    }

    /// The cached channel to `addr`, or a new lazy one (nothing is dialled until a call).
    pub(super) fn channel(&self, addr: SocketAddr) -> Result<Channel, ControlError> {
        self.check(addr)?;
        let channels = &self.shared.channels;
        if let Some(c) = channels.get(&addr)
            && !c.runtime_alive.is_finished()
        {
            return Ok(c.channel.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| ControlError::Rpc {
                addr,
                call: "connect".into(),
                code: tonic::Code::InvalidArgument,
                message: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT);
        // Every connection strips the slash of bare method names (`/GetState` -> `GetState`), as a
        // FairMQ device expects; paths with a service part are left alone (see `bare_path`).
        let connector = tower::service_fn(move |_uri: http::Uri| async move {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok::<_, std::io::Error>(TokioIo::new(BarePathIo::client(stream)))
        });
        let channel = endpoint.connect_with_connector_lazy(connector);
        let runtime_alive = tokio::spawn(std::future::pending::<()>()).abort_handle();
        // Two first calls racing both create a channel; the last one stays cached, the other
        // serves its call and is dropped.
        if let Some(old) = channels.insert(
            addr,
            Cached {
                channel: channel.clone(),
                runtime_alive,
            },
        ) {
            old.runtime_alive.abort();
        }
        Ok(channel)
    }

    #[cfg(test)]
    fn cached(&self) -> usize {
        self.shared.channels.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Documentation range (RFC 5737): never dialled here, channels are lazy.
    const REMOTE: &str = "192.0.2.7:47100";
    const LOCAL: &str = "127.0.0.1:47100";

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn the_default_refuses_a_non_loopback_address() {
        let client = ControlClient::default();
        assert!(!client.allow_remote());
        let e = client.channel(addr(REMOTE)).unwrap_err();
        assert!(matches!(e, ControlError::NotLoopback { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "refusing to dial 192.0.2.7:47100: not a loopback address \
             (set ENVBRIDGE_CONTROL_ALLOW_REMOTE=1 to allow)"
        );
        assert_eq!(client.cached(), 0);
        // IPv6 loopback is loopback.
        client.channel(addr("[::1]:47100")).unwrap();
        assert_eq!(client.cached(), 1);
    }

    #[tokio::test]
    async fn allow_remote_lets_a_non_loopback_address_through() {
        let client = ControlClient::new(true);
        assert!(client.allow_remote());
        client.channel(addr(REMOTE)).unwrap();
        assert_eq!(client.cached(), 1);
    }

    #[tokio::test]
    async fn two_values_do_not_share_a_cache_but_clones_do() {
        let a = ControlClient::default();
        let b = ControlClient::default();
        let a2 = a.clone();
        a.channel(addr(LOCAL)).unwrap();
        assert_eq!(a.cached(), 1);
        assert_eq!(a2.cached(), 1);
        assert_eq!(b.cached(), 0);
        // A second call reuses the cached channel.
        a2.channel(addr(LOCAL)).unwrap();
        assert_eq!(a.cached(), 1);
        b.forget(&addr(LOCAL));
        assert_eq!(a.cached(), 1);
        a2.forget(&addr(LOCAL));
        assert_eq!(a.cached(), 0);
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

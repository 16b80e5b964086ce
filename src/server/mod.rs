//! The daemon's network surface: the EnvBridge gRPC API (with health and reflection) and an
//! HTTP listener for /metrics and /healthz; with `--o2control-listen`, the anchor's API on a
//! listener of its own (`o2control`).
//!
//! Binds 127.0.0.1 by default. Listening beyond loopback requires both a bearer token and
//! TLS; the daemon refuses to start otherwise.

mod api;
pub mod auth;
pub mod convert;
mod http;
pub mod o2control;
pub mod pb;
mod ui;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::bridge::Bridge;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The callers' tokens; None only with `insecure` (every caller is then the admin).
    pub tokens: Option<Arc<auth::Tokens>>,
    /// `--insecure-no-auth`: no tokens, loopback only.
    pub insecure: bool,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The anchor's API on a listener of its own (`--o2control-listen`; docs/o2control.md).
    pub o2control: Option<o2control::O2ControlConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 50061)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 9464)),
            tokens: None,
            insecure: false,
            tls_cert: None,
            tls_key: None,
            o2control: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "refusing to listen on {0} (beyond loopback) without both a bearer token and TLS (--token, --tls-cert, --tls-key)"
    )]
    Insecure(SocketAddr),
    #[error(
        "refusing to start without identified callers: give --token-file FILE (docs/security.md), or --insecure-no-auth on loopback only"
    )]
    NoAuth,
    #[error("TLS: {0}")]
    Tls(String),
    #[error("bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("reflection: {0}")]
    Reflection(String),
    #[error(
        "refusing --o2control-listen {0}: beyond loopback the o2control listener requires TLS with client certificates (--o2control-client-ca CA.pem with --tls-cert, --tls-key and a --token-file naming the callers); or listen on 127.0.0.1 or ::1"
    )]
    O2ControlBeyondLoopback(SocketAddr),
    #[error("o2control TLS: {0}")]
    O2ControlTls(String),
    #[error("--o2control-role {0}: give viewer or operator")]
    O2ControlRole(auth::Role),
}

impl ServerConfig {
    /// What the o2control listener takes of these settings for its TLS.
    pub fn o2control_tls(&self) -> o2control::TlsParts<'_> {
        o2control::TlsParts {
            cert: self.tls_cert.as_deref(),
            key: self.tls_key.as_deref(),
            tokens: self.tokens.as_ref(),
        }
    }

    /// The security rule: beyond loopback, a token and TLS are both mandatory.
    pub fn check(&self) -> Result<(), ServerError> {
        if self.tokens.is_none() && !self.insecure {
            return Err(ServerError::NoAuth);
        }
        let secured = self.tokens.is_some() && self.tls_cert.is_some() && self.tls_key.is_some();
        if !self.grpc_addr.ip().is_loopback() && !secured {
            return Err(ServerError::Insecure(self.grpc_addr));
        }
        if (self.tls_cert.is_some()) != (self.tls_key.is_some()) {
            return Err(ServerError::Tls(
                "--tls-cert and --tls-key go together".into(),
            ));
        }
        if let Some(o) = &self.o2control {
            o.check(&self.o2control_tls())?;
        }
        Ok(())
    }
}

/// Where the listeners ended up (port 0 picks a free one).
/// Largest request accepted (a create's variables, a transition's arguments).
const MAX_MESSAGE: usize = 1024 * 1024;

#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// The o2control listener, when configured.
    pub o2control: Option<SocketAddr>,
}

/// Binds the listeners (and the o2control one, when configured) and serves until `stop`
/// is cancelled.
pub async fn serve(
    bridge: Arc<Bridge>,
    cfg: ServerConfig,
    stop: CancellationToken,
) -> Result<(Bound, tokio::task::JoinHandle<()>), ServerError> {
    cfg.check()?;
    let grpc = TcpListener::bind(cfg.grpc_addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: cfg.grpc_addr,
            source,
        })?;
    let http = TcpListener::bind(cfg.http_addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: cfg.http_addr,
            source,
        })?;
    let mut bound = Bound {
        grpc: grpc.local_addr().map_err(|source| ServerError::Bind {
            addr: cfg.grpc_addr,
            source,
        })?,
        http: http.local_addr().map_err(|source| ServerError::Bind {
            addr: cfg.http_addr,
            source,
        })?,
        o2control: None,
    };
    if !bound.http.ip().is_loopback() {
        tracing::warn!(addr = %bound.http, "/metrics and /healthz are served without authentication beyond loopback");
    }

    let mut builder = Server::builder();
    if let (Some(cert), Some(key)) = (&cfg.tls_cert, &cfg.tls_key) {
        let cert = std::fs::read(cert)
            .map_err(|e| ServerError::Tls(format!("{}: {e}", cert.display())))?;
        let key =
            std::fs::read(key).map_err(|e| ServerError::Tls(format!("{}: {e}", key.display())))?;
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
            .map_err(|e| ServerError::Tls(e.to_string()))?;
    }
    let (health, health_svc) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::env_bridge_server::EnvBridgeServer<api::Api>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServerError::Reflection(e.to_string()))?;
    if cfg.tokens.is_none() {
        tracing::warn!(addr = %bound.grpc, "--insecure-no-auth: every caller of the API is an unauthenticated admin");
    }
    let api = pb::env_bridge_server::EnvBridgeServer::new(api::Api {
        bridge: bridge.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE)
    .max_encoding_message_size(64 * MAX_MESSAGE);
    let svc = tonic::service::interceptor::InterceptedService::new(
        api,
        auth::BearerAuth::new(cfg.tokens.clone()),
    );
    // A slow or stuck client cannot exhaust the server: bounded calls per connection and
    // streams, dead connections found by keepalive, every call bounded in time (waits are
    // capped below it; WatchEvents' stream is not a call's head and goes on).
    let router = builder
        .concurrency_limit_per_connection(64)
        .max_concurrent_streams(Some(256))
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .timeout(api::MAX_WAIT + std::time::Duration::from_secs(60))
        .add_service(health_svc)
        .add_service(reflection)
        .add_service(svc);
    let o2control = match &cfg.o2control {
        Some(o) => {
            let (addr, handle) =
                o2control::serve(bridge.clone(), o, &cfg.o2control_tls(), stop.clone()).await?;
            bound.o2control = Some(addr);
            Some(handle)
        }
        None => None,
    };
    let http_app = http::router(bridge.clone()).merge(ui::router(bridge, cfg.tokens, bound.http));

    let grpc_stop = stop.clone();
    let handle = tokio::spawn(async move {
        let grpc = router.serve_with_incoming_shutdown(
            TcpListenerStream::new(grpc),
            grpc_stop.cancelled_owned(),
        );
        let http = axum::serve(http, http_app).with_graceful_shutdown(stop.cancelled_owned());
        let (g, h) = tokio::join!(grpc, http);
        if let Err(e) = g {
            tracing::error!(error = %e, "gRPC server failed");
        }
        if let Err(e) = h {
            tracing::error!(error = %e, "HTTP server failed");
        }
        if let Some(o) = o2control {
            let _ = o.await;
        }
    });
    tracing::info!(grpc = %bound.grpc, http = %bound.http, "serving");
    Ok((bound, handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_loopback_needs_token_and_tls() {
        let mut c = ServerConfig::default();
        assert!(matches!(c.check(), Err(ServerError::NoAuth)));
        c.insecure = true;
        assert!(c.check().is_ok());
        c.grpc_addr = "0.0.0.0:50061".parse().unwrap();
        assert!(matches!(c.check(), Err(ServerError::Insecure(_))));
        c.tokens = Some(Arc::new(
            auth::Tokens::admin("a-long-enough-token").unwrap(),
        ));
        assert!(matches!(c.check(), Err(ServerError::Insecure(_))));
        c.tls_cert = Some("c.pem".into());
        c.tls_key = Some("k.pem".into());
        assert!(c.check().is_ok());
    }
}

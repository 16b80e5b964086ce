//! The anchor's public run-control API, `o2control.Control` (proto/o2control.proto), on a
//! listener of its own (`--o2control-listen`), so that the anchor's clients (coconut, the
//! ControlGUI) can drive envbridge. It runs over the same bridge and roster as the daemon's
//! own API. What is served so far, the state mapping and the trust model: docs/o2control.md.
//!
//! - `pb`: the generated code; `apricot`: the configuration service beside it; `service`: the tonic service; `info`: roster records as the
//!   anchor's messages; `state_map`: envbridge's states in the anchor's words; `caller`: who
//!   is calling (one configured role, `requestUser` as a claim); `templates`: the workflows
//!   directory as the anchor's one repository; `roles`: the workflow tree (RoleInfo) from the
//!   roster's task paths; `detectors`: the store's inventory against the roster; `glob`: the anchor's patterns; `writes`: the methods that change
//!   environments; `auto`: NewAutoEnvironment and Subscribe; `events`: roster changes as the
//!   anchor's events; `subscriptions`: Subscribe's streams by id.

mod apricot;
mod auto;
pub mod caller;
mod detectors;
mod events;
mod glob;
pub mod info;
pub mod pb;
mod roles;
mod service;
pub mod state_map;
mod subscriptions;
mod templates;
mod writes;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use super::ServerError;
use super::auth::{Role, Tokens};
use crate::bridge::Bridge;

/// The o2control listener's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct O2ControlConfig {
    pub addr: SocketAddr,
    /// The role every caller gets (`--o2control-role`, viewer by default).
    pub role: Role,
    /// What GetFrameworkInfo calls this instance.
    pub instance_name: String,
    /// Where START_ACTIVITY's run numbers come from.
    pub run_numbers: crate::bridge::run_numbers::Source,
    /// `--o2control-client-ca`: TLS with client certificates verified against these CAs
    /// (the daemon's `--tls-cert`/`--tls-key` as the listener's own); required beyond
    /// loopback.
    pub client_ca: Option<PathBuf>,
    /// Whether `role` was given (`--o2control-role`): with client certificates it is the
    /// token file that gives roles, and a role given as well is refused.
    pub role_given: bool,
}

/// What the o2control listener needs of the daemon's own settings when it speaks TLS.
pub struct TlsParts<'a> {
    pub cert: Option<&'a Path>,
    pub key: Option<&'a Path>,
    pub tokens: Option<&'a Arc<Tokens>>,
}

impl O2ControlConfig {
    pub fn new(addr: SocketAddr, role: Role) -> Self {
        O2ControlConfig {
            addr,
            role,
            instance_name: default_instance_name(),
            run_numbers: Default::default(),
            client_ca: None,
            role_given: false,
        }
    }

    /// Beyond loopback the callers must be identified by client certificates; with them,
    /// the listener needs its own certificate and key and the token file's names.
    pub fn check(&self, tls: &TlsParts<'_>) -> Result<(), ServerError> {
        if self.role > Role::Operator {
            return Err(ServerError::O2ControlRole(self.role));
        }
        let Some(ca) = &self.client_ca else {
            if !self.addr.ip().is_loopback() {
                return Err(ServerError::O2ControlBeyondLoopback(self.addr));
            }
            return Ok(());
        };
        let missing = |what: &str| {
            Err(ServerError::O2ControlTls(format!(
                "--o2control-client-ca {} needs {what}",
                ca.display()
            )))
        };
        if tls.cert.is_none() || tls.key.is_none() {
            return missing("--tls-cert and --tls-key (the listener's own certificate)");
        }
        if tls.tokens.is_none() {
            return missing(
                "--token-file naming the callers (a certificate's subject CN is looked up there)",
            );
        }
        if self.role_given {
            return Err(ServerError::O2ControlTls(
                "--o2control-role: with --o2control-client-ca each caller's role is its name's in the token file".into(),
            ));
        }
        Ok(())
    }
}

/// `envbridge@<host name>` (in a pod, the pod's name).
pub fn default_instance_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("envbridge@{host}")
}

/// Binds the o2control listener (o2control.Control, gRPC health and reflection) and serves
/// it until `stop` is cancelled.
pub async fn serve(
    bridge: Arc<Bridge>,
    cfg: &O2ControlConfig,
    tls: &TlsParts<'_>,
    stop: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ServerError> {
    cfg.check(tls)?;
    // Certificates and keys are a few KB: a file beyond this is not one.
    const MAX_PEM: u64 = 1024 * 1024;
    let read = |p: &Path| {
        let err = |e: String| ServerError::O2ControlTls(format!("{}: {e}", p.display()));
        let len = std::fs::metadata(p).map_err(|e| err(e.to_string()))?.len();
        if len > MAX_PEM {
            return Err(err(format!("{len} bytes, at most {MAX_PEM} (a PEM file)")));
        }
        std::fs::read(p).map_err(|e| err(e.to_string()))
    };
    let (identify, tls_config) = match (&cfg.client_ca, tls.cert, tls.key, tls.tokens) {
        (Some(ca), Some(cert), Some(key), Some(tokens)) => {
            let identity = Identity::from_pem(read(cert)?, read(key)?);
            let config = ServerTlsConfig::new()
                .identity(identity)
                .client_ca_root(Certificate::from_pem(read(ca)?));
            (
                caller::Identify::by_certificate(tokens.clone()),
                Some(config),
            )
        }
        _ => (caller::Identify::loopback(cfg.role), None),
    };
    let bind_err = |source| ServerError::Bind {
        addr: cfg.addr,
        source,
    };
    let listener = TcpListener::bind(cfg.addr).await.map_err(bind_err)?;
    let bound = listener.local_addr().map_err(bind_err)?;
    let (health, health_svc) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::o2control::control_server::ControlServer<service::Control>>()
        .await;
    health
        .set_serving::<pb::apricot::apricot_server::ApricotServer<apricot::Apricot>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServerError::Reflection(e.to_string()))?;
    let control = pb::o2control::control_server::ControlServer::new(service::Control::new(
        bridge.clone(),
        cfg,
    ))
    .max_decoding_message_size(super::MAX_MESSAGE)
    .max_encoding_message_size(64 * super::MAX_MESSAGE);
    let control = InterceptedService::new(control, identify.clone());
    let apricot =
        pb::apricot::apricot_server::ApricotServer::new(apricot::Apricot::new(bridge.clone()))
            .max_decoding_message_size(super::MAX_MESSAGE);
    let apricot = InterceptedService::new(apricot, identify);
    let mut builder = Server::builder();
    if let Some(t) = tls_config {
        builder = builder
            .tls_config(t)
            .map_err(|e| ServerError::O2ControlTls(e.to_string()))?;
    }
    let router = builder
        .concurrency_limit_per_connection(64)
        .max_concurrent_streams(Some(256))
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .timeout(super::api::MAX_WAIT + std::time::Duration::from_secs(60))
        .add_service(health_svc)
        .add_service(reflection)
        .add_service(control)
        .add_service(apricot);
    let handle = tokio::spawn(async move {
        if let Err(e) = router
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop.cancelled_owned())
            .await
        {
            tracing::error!(error = %e, "o2control gRPC server failed");
        }
    });
    if cfg.client_ca.is_some() {
        tracing::info!(o2control = %bound, "serving o2control.Control over TLS, callers by client certificate");
    } else {
        tracing::info!(o2control = %bound, role = %cfg.role, "serving o2control.Control");
    }
    Ok((bound, handle))
}

/// Roster records for the unit tests of this layer.
#[cfg(test)]
pub(crate) mod fixture {
    use std::sync::Arc;
    use std::time::SystemTime;

    use crate::roster::{EnvKey, EnvRecord, TaskRecord};
    use crate::state::State;

    /// Environment runs/e1 with id `id`: `nodes` nodes, `tasks` tasks, in `state`, created at
    /// 1,700,000,000,123 ms.
    pub fn env(id: &str, nodes: u32, tasks: u32, state: Option<State>) -> EnvRecord {
        EnvRecord {
            id: id.into(),
            nodes,
            tasks,
            state,
            created_at: SystemTime::UNIX_EPOCH
                + std::time::Duration::from_millis(1_700_000_000_123),
            changed_at: SystemTime::now(),
            ..EnvRecord::bare(EnvKey::new("runs", "e1"))
        }
    }

    /// A readout task of environment runs/e1 at `path` on `node`, its pod running.
    pub fn task(
        name: &str,
        node: &str,
        path: &str,
        state: State,
        critical: bool,
    ) -> Arc<TaskRecord> {
        Arc::new(TaskRecord {
            name: name.into(),
            env: EnvKey::new("runs", "e1"),
            node: node.into(),
            class: "readout".into(),
            path: path.into(),
            critical,
            state,
            pod_phase: Some("Running".into()),
            pod_ip: None,
            message: None,
            transition: None,
            ports: Box::new([]),
            control_port: 47100,
            pid: 0,
            deleting: false,
            changed_at: SystemTime::now(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts<'a>(cert: bool, tokens: Option<&'a Arc<Tokens>>) -> TlsParts<'a> {
        TlsParts {
            cert: cert.then(|| Path::new("c.pem")),
            key: cert.then(|| Path::new("k.pem")),
            tokens,
        }
    }

    #[test]
    fn beyond_loopback_the_callers_need_client_certificates() {
        let none = parts(false, None);
        let ok = O2ControlConfig::new("127.0.0.1:32767".parse().unwrap(), Role::Viewer);
        assert!(ok.check(&none).is_ok());
        assert!(
            O2ControlConfig::new("[::1]:32767".parse().unwrap(), Role::Operator)
                .check(&none)
                .is_ok()
        );
        let mut open = O2ControlConfig::new("0.0.0.0:32767".parse().unwrap(), Role::Viewer);
        let e = open.check(&none).expect_err("beyond loopback").to_string();
        assert!(e.contains("TLS with client certificates"), "{e}");
        assert!(e.contains("--o2control-client-ca"), "{e}");
        assert!(ok.instance_name.starts_with("envbridge@"));

        open.client_ca = Some("ca.pem".into());
        let e = open.check(&none).expect_err("no certificate").to_string();
        assert!(e.contains("--tls-cert"), "{e}");
        let e = open
            .check(&parts(true, None))
            .expect_err("no names")
            .to_string();
        assert!(e.contains("--token-file"), "{e}");
        let tokens = Arc::new(Tokens::admin("a-long-enough-admin-token").unwrap());
        assert!(open.check(&parts(true, Some(&tokens))).is_ok());
        open.role_given = true;
        let e = open
            .check(&parts(true, Some(&tokens)))
            .expect_err("role and certificates")
            .to_string();
        assert!(e.contains("token file"), "{e}");
    }
}

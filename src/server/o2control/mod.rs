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
//!   environments.

mod apricot;
pub mod caller;
mod detectors;
mod glob;
pub mod info;
pub mod pb;
mod roles;
mod service;
pub mod state_map;
mod templates;
mod writes;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use super::ServerError;
use super::auth::Role;
use crate::bridge::Bridge;

/// The o2control listener's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct O2ControlConfig {
    pub addr: SocketAddr,
    /// The role every caller gets (`--o2control-role`, viewer by default).
    pub role: Role,
    /// What GetFrameworkInfo calls this instance.
    pub instance_name: String,
    /// The ConfigMap (namespace, name) START_ACTIVITY's run numbers come from.
    pub run_numbers: (String, String),
}

impl O2ControlConfig {
    pub fn new(addr: SocketAddr, role: Role) -> Self {
        O2ControlConfig {
            addr,
            role,
            instance_name: default_instance_name(),
            run_numbers: (
                "envbridge-system".to_string(),
                crate::bridge::run_numbers::DEFAULT_NAME.to_string(),
            ),
        }
    }

    /// Loopback only, for now: beyond it the callers must be identified by client
    /// certificates, which are not implemented yet.
    pub fn check(&self) -> Result<(), ServerError> {
        if !self.addr.ip().is_loopback() {
            return Err(ServerError::O2ControlBeyondLoopback(self.addr));
        }
        if self.role > Role::Operator {
            return Err(ServerError::O2ControlRole(self.role));
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
    stop: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ServerError> {
    cfg.check()?;
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
    let apricot = pb::apricot::apricot_server::ApricotServer::new(apricot::Apricot::new(
        bridge.clone(),
        cfg.role,
    ))
    .max_decoding_message_size(super::MAX_MESSAGE);
    let router = Server::builder()
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
    tracing::info!(o2control = %bound, role = %cfg.role, "serving o2control.Control");
    Ok((bound, handle))
}

/// Roster records for the unit tests of this layer.
#[cfg(test)]
pub(crate) mod fixture {
    use std::sync::Arc;
    use std::time::SystemTime;

    use crate::roster::{EnvKey, TaskRecord};
    use crate::state::State;

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
            deleting: false,
            changed_at: SystemTime::now(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_only_until_client_certificates_exist() {
        let ok = O2ControlConfig::new("127.0.0.1:32767".parse().unwrap(), Role::Viewer);
        assert!(ok.check().is_ok());
        assert!(
            O2ControlConfig::new("[::1]:32767".parse().unwrap(), Role::Operator)
                .check()
                .is_ok()
        );
        let open = O2ControlConfig::new("0.0.0.0:32767".parse().unwrap(), Role::Viewer);
        let e = open.check().expect_err("beyond loopback").to_string();
        assert!(e.contains("TLS with client certificates"), "{e}");
        assert!(e.contains("not implemented yet"), "{e}");
        assert!(ok.instance_name.starts_with("envbridge@"));
    }
}

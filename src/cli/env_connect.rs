//! The daemon's gRPC client as the CLI and the demo build it: address, bearer token (from a
//! flag or a file), TLS with an optional CA.

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use envbridge::server::pb::env_bridge_client::EnvBridgeClient;

use super::env::EnvArgs;

#[derive(Clone)]
pub(super) struct Auth(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub(super) type Client =
    EnvBridgeClient<tonic::service::interceptor::InterceptedService<Channel, Auth>>;

pub(super) async fn connect(a: &EnvArgs) -> Result<Client, String> {
    let from_file = match &a.token_file {
        Some(p) => Some(read_token(p)?),
        None => None,
    };
    let token = a.token.as_deref().or(from_file.as_deref());
    connect_to(&a.addr, token, a.ca_cert.as_deref()).await
}

/// A client's token file: its first non-empty line.
pub(super) fn read_token(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("{}: no token in it", path.display()))
}

/// A daemon client for `addr` (`http://` or `https://`), with an optional bearer token and CA.
pub(super) async fn connect_to(
    addr: &str,
    token: Option<&str>,
    ca_cert: Option<&std::path::Path>,
) -> Result<Client, String> {
    let mut ep =
        Channel::from_shared(addr.to_string()).map_err(|e| format!("address {addr}: {e}"))?;
    if addr.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = ca_cert {
            let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        ep = ep.tls_config(tls).map_err(|e| format!("TLS: {e}"))?;
    }
    let ch = ep
        .connect()
        .await
        .map_err(|e| format!("cannot reach the daemon at {addr}: {e}"))?;
    let token = match token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .map_err(|_| "the token is not valid ASCII".to_string())?,
        ),
        None => None,
    };
    Ok(EnvBridgeClient::with_interceptor(ch, Auth(token)))
}

pub(super) fn status_msg(s: tonic::Status) -> String {
    format!("{}: {}", code_name(s.code()), s.message())
}

fn code_name(c: tonic::Code) -> &'static str {
    match c {
        tonic::Code::InvalidArgument => "invalid",
        tonic::Code::NotFound => "not found",
        tonic::Code::FailedPrecondition => "refused",
        tonic::Code::Unauthenticated => "unauthenticated",
        tonic::Code::Unavailable => "unavailable",
        tonic::Code::DeadlineExceeded => "timeout",
        _ => "failed",
    }
}

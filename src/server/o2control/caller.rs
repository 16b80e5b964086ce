//! Who an o2control caller is. The anchor's clients send no token, only `requestUser`:
//!
//! - on loopback without TLS, every caller gets the listener's one role
//!   (`--o2control-role`);
//! - with TLS (`--o2control-client-ca`, required beyond loopback) every caller presents a
//!   client certificate: its subject's common name is the caller, and the token file's entry
//!   of that name gives its role (admin counts as operator: site variables stay with the
//!   daemon's own API). A certificate whose name the token file does not hold is refused.
//!
//! The user a request names is recorded as what the caller claims, never taken as who it
//! is. [`Identify`] puts the caller in every request's extensions; the methods read it back.

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::{Request, Status};

use super::pb::common::User;
use crate::server::auth::{Caller, Role, Tokens};

/// Identifies the caller of every o2control and apricot call.
#[derive(Clone)]
pub struct Identify {
    /// Every caller's role without client certificates.
    role: Role,
    /// With client certificates: the token file whose names give the roles.
    names: Option<Arc<Tokens>>,
}

impl Identify {
    pub fn loopback(role: Role) -> Self {
        Identify { role, names: None }
    }

    pub fn by_certificate(names: Arc<Tokens>) -> Self {
        Identify {
            role: Role::Viewer,
            names: Some(names),
        }
    }

    /// The caller a client certificate (DER) names, or why it is refused.
    pub fn certificate_caller(&self, der: Option<&[u8]>) -> Result<Caller, Status> {
        let Some(names) = &self.names else {
            return Ok(Caller {
                name: "o2control caller on loopback".into(),
                role: self.role,
            });
        };
        let der = der.ok_or_else(|| {
            Status::unauthenticated("o2control: this listener requires a client certificate")
        })?;
        let cn = subject_cn(der)?;
        let role = names.role_of(&cn).ok_or_else(|| {
            Status::permission_denied(format!(
                "o2control: the client certificate's subject CN={cn} is not a name in the daemon's token file"
            ))
        })?;
        Ok(Caller {
            name: format!("o2control client certificate CN={cn}"),
            role: role.min(Role::Operator),
        })
    }
}

impl Interceptor for Identify {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let certs = req.peer_certs();
        let first = certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref());
        let caller = self.certificate_caller(first)?;
        req.extensions_mut().insert(caller);
        Ok(req)
    }
}

/// A certificate's subject common name.
fn subject_cn(der: &[u8]) -> Result<String, Status> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| Status::unauthenticated(format!("o2control: client certificate: {e}")))?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string)
        .filter(|cn| !cn.is_empty());
    cn.ok_or_else(|| {
        Status::unauthenticated("o2control: the client certificate's subject has no common name")
    })
}

/// The caller [`Identify`] found for this request (a viewer with no name if none: a
/// request that bypassed the interceptor, which only tests do).
pub fn of<T>(req: &Request<T>) -> Caller {
    req.extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(|| Caller {
            name: "o2control caller".into(),
            role: Role::Viewer,
        })
}

/// The caller as the audit trail records it: who it is, and the user the request claims.
pub fn claimed(caller: &Caller, user: Option<&User>) -> Caller {
    let claim = user
        .map(|u| u.name.trim())
        .filter(|n| !n.is_empty())
        .map(|n| format!(" claiming to be {n:?}"))
        .unwrap_or_default();
    Caller {
        name: format!("{}{claim}", caller.name),
        role: caller.role,
    }
}

/// PERMISSION_DENIED unless the caller's role allows `rpc`.
pub fn require(caller: &Caller, need: Role, rpc: &str) -> Result<(), tonic::Status> {
    if caller.role < need {
        return Err(tonic::Status::permission_denied(format!(
            "{rpc}: {} has the {} role on this o2control listener; {rpc} needs the {need} role",
            caller.name, caller.role
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback(role: Role) -> Caller {
        Identify::loopback(role).certificate_caller(None).unwrap()
    }

    #[test]
    fn the_claimed_user_is_recorded_as_a_claim() {
        let u = User {
            name: "jdoe".into(),
            ..Default::default()
        };
        let c = claimed(&loopback(Role::Operator), Some(&u));
        assert_eq!(c.role, Role::Operator);
        assert_eq!(
            c.name,
            "o2control caller on loopback claiming to be \"jdoe\""
        );
        assert_eq!(
            claimed(&loopback(Role::Viewer), None).name,
            "o2control caller on loopback"
        );
        assert_eq!(
            claimed(&loopback(Role::Viewer), Some(&User::default())).name,
            "o2control caller on loopback"
        );
    }

    #[test]
    fn a_viewer_listener_refuses_what_needs_an_operator() {
        let viewer = loopback(Role::Viewer);
        assert!(require(&viewer, Role::Viewer, "GetEnvironments").is_ok());
        let e = require(&viewer, Role::Operator, "ControlEnvironment").expect_err("refused");
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message().contains("ControlEnvironment") && e.message().contains("viewer"),
            "{}",
            e.message()
        );
        assert!(
            require(
                &loopback(Role::Operator),
                Role::Operator,
                "ControlEnvironment"
            )
            .is_ok()
        );
    }

    fn cert(cn: Option<&str>) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "ALICE");
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_client_certificate_is_the_caller_its_name_the_role() {
        let names = Tokens::parse(
            "tokens:\n  - {name: alice, role: operator, token: aaaaaaaaaaaaaaaaaaaa}\n  - {name: root, role: admin, token: bbbbbbbbbbbbbbbbbbbb}\n  - {name: vera, role: viewer, token: cccccccccccccccccccc}\n",
            "tokens.yaml",
        )
        .unwrap();
        let id = Identify::by_certificate(Arc::new(names));
        let alice = id.certificate_caller(Some(&cert(Some("alice")))).unwrap();
        assert_eq!(alice.role, Role::Operator);
        assert_eq!(alice.name, "o2control client certificate CN=alice");
        let root = id.certificate_caller(Some(&cert(Some("root")))).unwrap();
        assert_eq!(root.role, Role::Operator, "admin counts as operator here");
        let vera = id.certificate_caller(Some(&cert(Some("vera")))).unwrap();
        assert_eq!(vera.role, Role::Viewer);

        let e = id
            .certificate_caller(Some(&cert(Some("mallory"))))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("CN=mallory"), "{}", e.message());
        let e = id.certificate_caller(None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = id.certificate_caller(Some(&cert(None))).unwrap_err();
        assert!(e.message().contains("no common name"), "{}", e.message());
        let e = id
            .certificate_caller(Some(b"not a certificate"))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
    }
}

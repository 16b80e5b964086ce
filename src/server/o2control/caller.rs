//! Who an o2control caller is: the anchor's clients send no token, only `requestUser`. In
//! this slice the listener is loopback only and gives every caller the one role it was
//! configured with; the user a request names is recorded as what the caller claims, never
//! taken as who it is.

use super::pb::common::User;
use crate::server::auth::{Caller, Role};

/// The caller of one request on a listener configured with `role`, naming the user the
/// request claims (if any) for the audit trail.
pub fn claimed(role: Role, user: Option<&User>) -> Caller {
    let claim = user
        .map(|u| u.name.trim())
        .filter(|n| !n.is_empty())
        .map(|n| format!(" claiming to be {n:?}"))
        .unwrap_or_default();
    Caller {
        name: format!("o2control caller on loopback{claim}"),
        role,
    }
}

/// PERMISSION_DENIED unless the listener's role allows `what`.
pub fn require(role: Role, need: Role, rpc: &str) -> Result<(), tonic::Status> {
    if role < need {
        return Err(tonic::Status::permission_denied(format!(
            "{rpc}: this o2control listener gives its callers the {role} role; {rpc} needs the {need} role (--o2control-role)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claimed_user_is_recorded_as_a_claim() {
        let u = User {
            name: "jdoe".into(),
            ..Default::default()
        };
        let c = claimed(Role::Operator, Some(&u));
        assert_eq!(c.role, Role::Operator);
        assert_eq!(
            c.name,
            "o2control caller on loopback claiming to be \"jdoe\""
        );
        assert_eq!(
            claimed(Role::Viewer, None).name,
            "o2control caller on loopback"
        );
        assert_eq!(
            claimed(Role::Viewer, Some(&User::default())).name,
            "o2control caller on loopback"
        );
    }

    #[test]
    fn a_viewer_listener_refuses_what_needs_an_operator() {
        assert!(require(Role::Viewer, Role::Viewer, "GetEnvironments").is_ok());
        let e = require(Role::Viewer, Role::Operator, "ControlEnvironment").expect_err("refused");
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message().contains("ControlEnvironment"),
            "{}",
            e.message()
        );
        assert!(require(Role::Operator, Role::Operator, "ControlEnvironment").is_ok());
    }
}

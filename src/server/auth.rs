//! Who is calling: bearer tokens mapped to a name and a role (docs/security.md).
//!
//! A token file is either one token (the single admin token of `--token`/`--token-file`, as
//! before) or YAML `tokens: [{name, role, token}]`. Tokens are kept as SHA-256 digests and
//! every digest is compared, in constant time, whatever the given token: neither the content
//! nor the length of a token leaks through timing.

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::{Request, Status};

/// What a caller may do: a viewer reads and watches; an operator also creates, transitions,
/// destroys and kills; an admin also sets the site's allow-listed variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        })
    }
}

/// The identified caller of one request (in the request's extensions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub role: Role,
}

impl Caller {
    /// Every caller of a daemon started with `--insecure-no-auth` (loopback only).
    pub fn unauthenticated() -> Caller {
        Caller {
            name: "anonymous (--insecure-no-auth)".into(),
            role: Role::Admin,
        }
    }

    /// The caller a request carries, or PERMISSION_DENIED when its role is below `need`.
    pub fn require<T>(req: &Request<T>, need: Role, what: &str) -> Result<Caller, Status> {
        let caller = req
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_else(Caller::unauthenticated);
        if caller.role < need {
            return Err(Status::permission_denied(format!(
                "{} ({}) may not {what}: it needs the {need} role",
                caller.name, caller.role
            )));
        }
        Ok(caller)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    role: Role,
    token: String,
}

/// The daemon's callers, by token digest.
pub struct Tokens {
    entries: Vec<([u8; 32], Caller)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field(
                "callers",
                &self.entries.iter().map(|(_, c)| c).collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Shortest token a roles file accepts (a guessable token is no identity).
const MIN_TOKEN: usize = 16;

impl Tokens {
    /// One admin token (`--token`, or a token file holding one token, as before roles).
    pub fn admin(token: &str) -> Result<Tokens, String> {
        let token = token.trim();
        if token.is_empty() {
            return Err("the token is empty".into());
        }
        if token.len() < MIN_TOKEN {
            tracing::warn!("the admin token is shorter than {MIN_TOKEN} characters: easy to guess");
        }
        Ok(Tokens {
            entries: vec![(
                digest(token),
                Caller {
                    name: "admin".into(),
                    role: Role::Admin,
                },
            )],
        })
    }

    /// A token file's text: YAML `tokens:` with names and roles, or one admin token.
    pub fn parse(text: &str, source: &str) -> Result<Tokens, String> {
        if !text.trim_start().starts_with("tokens:") {
            return Tokens::admin(text).map_err(|e| format!("{source}: {e}"));
        }
        let file: TokenFile = serde_saphyr::from_str(text).map_err(|e| format!("{source}: {e}"))?;
        let mut entries = Vec::new();
        for e in file.tokens {
            if e.token.trim().len() < MIN_TOKEN {
                return Err(format!(
                    "{source}: the token of {} is shorter than {MIN_TOKEN} characters",
                    e.name
                ));
            }
            let d = digest(e.token.trim());
            if entries.iter().any(|(x, _)| *x == d) {
                return Err(format!(
                    "{source}: {} reuses another caller's token",
                    e.name
                ));
            }
            entries.push((
                d,
                Caller {
                    name: e.name,
                    role: e.role,
                },
            ));
        }
        if entries.is_empty() {
            return Err(format!("{source}: no token"));
        }
        Ok(Tokens { entries })
    }

    /// Reads a token file; refused when others than its owner may read it. Its group may,
    /// when that group is this process's own: a Kubernetes Secret volume is owned by root and
    /// given to the pod's `fsGroup` (mode 0440), the only way a non-root container reads it.
    pub fn load(path: &Path) -> Result<Tokens, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            if let Some(why) = too_open(meta.mode(), meta.gid(), own_groups().as_slice()) {
                return Err(format!(
                    "{}: readable by {why} (mode {:o}): chmod 600 it",
                    path.display(),
                    meta.mode() & 0o777
                ));
            }
        }
        let _ = meta;
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Tokens::parse(&text, &path.display().to_string())
    }

    /// The role of the caller named `name` (the o2control listener maps a client
    /// certificate's subject to it).
    pub fn role_of(&self, name: &str) -> Option<Role> {
        self.entries
            .iter()
            .find(|(_, c)| c.name == name)
            .map(|(_, c)| c.role)
    }

    /// The caller a token identifies. Every digest is compared, each in constant time.
    pub fn identify(&self, given: &str) -> Option<Caller> {
        let d = digest(given);
        let mut found = None;
        for (x, caller) in &self.entries {
            let same = x
                .iter()
                .zip(d.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
            if same {
                found = Some(caller.clone());
            }
        }
        found
    }
}

/// Identifies the caller of every call (`authorization: Bearer <token>`); without tokens
/// (`--insecure-no-auth`) every caller is the unauthenticated admin.
#[derive(Clone)]
pub struct BearerAuth {
    tokens: Option<Arc<Tokens>>,
}

impl BearerAuth {
    pub fn new(tokens: Option<Arc<Tokens>>) -> Self {
        BearerAuth { tokens }
    }
}

impl tonic::service::Interceptor for BearerAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let Some(tokens) = &self.tokens else {
            req.extensions_mut().insert(Caller::unauthenticated());
            return Ok(req);
        };
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let Some(given) = given else {
            return Err(Status::unauthenticated(
                "missing bearer token (authorization: Bearer ...)",
            ));
        };
        match tokens.identify(given) {
            Some(caller) => {
                req.extensions_mut().insert(caller);
                Ok(req)
            }
            None => Err(Status::unauthenticated("invalid bearer token")),
        }
    }
}

/// Why a token file of `mode` and group `gid` is readable by too many, if it is: by anyone
/// (world bits), or by a group this process is not in.
fn too_open(mode: u32, gid: u32, own_groups: &[u32]) -> Option<&'static str> {
    if mode & 0o007 != 0 {
        return Some("others than its owner");
    }
    if mode & 0o070 != 0 && !own_groups.contains(&gid) {
        return Some("a group this process is not in");
    }
    None
}

/// This process's effective and supplementary groups.
#[cfg(unix)]
fn own_groups() -> Vec<u32> {
    // SAFETY: getegid cannot fail; getgroups fills at most `len` entries of the buffer.
    let mut groups = vec![unsafe { libc::getegid() }];
    let mut buf = [0 as libc::gid_t; 64];
    let n = unsafe { libc::getgroups(buf.len() as libc::c_int, buf.as_mut_ptr()) };
    if n > 0 {
        groups.extend_from_slice(&buf[..n as usize]);
    }
    groups
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor;

    use super::*;

    fn req(h: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(h) = h {
            r.metadata_mut().insert("authorization", h.parse().unwrap());
        }
        r
    }

    const FILE: &str = "tokens:\n  - name: alice\n    role: operator\n    token: alice-token-0123456789\n  - name: bob\n    role: viewer\n    token: bob-token-0123456789ab\n";

    #[test]
    fn tokens_identify_their_caller_and_role() {
        let t = Arc::new(Tokens::parse(FILE, "f").unwrap());
        let mut a = BearerAuth::new(Some(t));
        let ok = a.call(req(Some("Bearer alice-token-0123456789"))).unwrap();
        assert_eq!(
            ok.extensions().get::<Caller>(),
            Some(&Caller {
                name: "alice".into(),
                role: Role::Operator
            })
        );
        for bad in [Some("Bearer nope"), Some("alice-token-0123456789"), None] {
            assert_eq!(
                a.call(req(bad)).unwrap_err().code(),
                tonic::Code::Unauthenticated
            );
        }
        let viewer = a.call(req(Some("Bearer bob-token-0123456789ab"))).unwrap();
        let e = Caller::require(&viewer, Role::Operator, "create environments").unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message()
                .contains("bob (viewer) may not create environments")
        );
        assert!(Caller::require(&viewer, Role::Viewer, "list").is_ok());
    }

    #[test]
    fn a_single_token_is_the_admin_and_short_or_reused_tokens_are_refused() {
        let t = Tokens::parse("s3cret-token-of-admin\n", "f").unwrap();
        assert_eq!(
            t.identify("s3cret-token-of-admin").unwrap().role,
            Role::Admin
        );
        assert!(Tokens::parse("  \n", "f").is_err());
        let short = "tokens:\n  - {name: a, role: admin, token: short}\n";
        assert!(Tokens::parse(short, "f").is_err());
        let twice = "tokens:\n  - {name: a, role: admin, token: same-token-0123456789}\n  - {name: b, role: viewer, token: same-token-0123456789}\n";
        assert!(Tokens::parse(twice, "f").unwrap_err().contains("reuses"));
        let mut open = BearerAuth::new(None);
        let r = open.call(req(None)).unwrap();
        assert_eq!(r.extensions().get::<Caller>().unwrap().role, Role::Admin);
    }

    #[cfg(unix)]
    #[test]
    fn a_token_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens");
        std::fs::write(&p, FILE).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Tokens::load(&p).unwrap_err().contains("chmod 600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Tokens::load(&p).is_ok());
    }
}

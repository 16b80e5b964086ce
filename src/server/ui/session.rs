//! Dashboard sessions: a random id in an HttpOnly, SameSite=Strict cookie, the caller it
//! stands for held here with an expiry. Bounded: at most [`MAX_SESSIONS`]; the oldest goes
//! first when a new login would exceed it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header;

use crate::server::auth::Caller;

/// The cookie that carries the session id.
pub const COOKIE: &str = "envbridge_session";
/// A shift and then some: a session ends this long after its login.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions held at once (each login makes one; the oldest is dropped beyond this).
pub const MAX_SESSIONS: usize = 1024;

struct Session {
    caller: Caller,
    expires: Instant,
    created: Instant,
}

/// Sessions by id.
#[derive(Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
}

/// 244 random bits (two v4 UUIDs, 122 each, from the OS's CSPRNG), hex.
fn new_id() -> String {
    let a = uuid::Uuid::new_v4();
    let b = uuid::Uuid::new_v4();
    format!("{}{}", a.simple(), b.simple())
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new session for `caller`; returns its id.
    pub fn open(&self, caller: Caller) -> String {
        let now = Instant::now();
        let mut all = self.lock();
        all.retain(|_, s| s.expires > now);
        while all.len() >= MAX_SESSIONS {
            let Some(oldest) = all
                .iter()
                .min_by_key(|(_, s)| s.created)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            all.remove(&oldest);
        }
        let id = new_id();
        all.insert(
            id.clone(),
            Session {
                caller,
                expires: now + LIFETIME,
                created: now,
            },
        );
        id
    }

    /// The caller of a live session.
    pub fn caller(&self, id: &str) -> Option<Caller> {
        let now = Instant::now();
        let mut all = self.lock();
        match all.get(id) {
            Some(s) if s.expires > now => Some(s.caller.clone()),
            Some(_) => {
                all.remove(id);
                None
            }
            None => None,
        }
    }

    pub fn close(&self, id: &str) {
        self.lock().remove(id);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The session id a request's cookies carry.
pub fn cookie_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The Set-Cookie value for a new session (Secure when served over TLS).
pub fn set_cookie(id: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{}",
        LIFETIME.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The Set-Cookie value that ends a session in the browser.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if secure { "; Secure" } else { "" }
    )
}

/// A state-changing request must come from this page: a browser's `Origin` (sent on every
/// POST) must name the host the request was sent to, and `Sec-Fetch-Site` must not say
/// cross-site. Clients that send neither (scripts) rely on the SameSite cookie.
pub fn same_origin(headers: &HeaderMap) -> bool {
    if headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == "cross-site" || v == "same-site")
    {
        return false;
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let (Ok(origin), Some(host)) = (
        origin.to_str(),
        headers.get(header::HOST).and_then(|h| h.to_str().ok()),
    ) else {
        return false;
    };
    let bare = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    bare == Some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::auth::Role;

    fn caller(n: &str) -> Caller {
        Caller {
            name: n.into(),
            role: Role::Viewer,
        }
    }

    #[test]
    fn sessions_are_random_bounded_and_closable() {
        let s = Sessions::default();
        let a = s.open(caller("a"));
        let b = s.open(caller("b"));
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert_eq!(s.caller(&a).unwrap().name, "a");
        assert!(s.caller("0".repeat(64).as_str()).is_none());
        s.close(&a);
        assert!(s.caller(&a).is_none());
        for i in 0..MAX_SESSIONS + 10 {
            s.open(caller(&i.to_string()));
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert!(s.caller(&b).is_none(), "the oldest went first");
    }

    #[test]
    fn cookies_and_origins() {
        let mut h = HeaderMap::new();
        let id = "ab".repeat(32);
        h.insert(
            header::COOKIE,
            format!("x=1; {COOKIE}={id}").parse().unwrap(),
        );
        assert_eq!(cookie_id(&h), Some(id.clone()));
        h.insert(header::COOKIE, format!("{COOKIE}=short").parse().unwrap());
        assert_eq!(cookie_id(&h), None);
        let c = set_cookie(&id, true);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Secure"));
        assert!(!set_cookie(&id, false).contains("Secure"));

        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:9464".parse().unwrap());
        assert!(same_origin(&h), "no Origin: a script");
        h.insert(header::ORIGIN, "http://127.0.0.1:9464".parse().unwrap());
        assert!(same_origin(&h));
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, "http://127.0.0.1:9464".parse().unwrap());
        h.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(!same_origin(&h));
    }
}

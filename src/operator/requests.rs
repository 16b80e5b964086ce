//! Counts the requests the operator sends to the apiserver, by verb and resource (reported at
//! shutdown; the benchmark reads it).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Requests sent through a client built with `launch::client::observed`.
#[derive(Debug, Default)]
pub struct RequestCount {
    /// GET requests (gets, lists, watches).
    pub get: AtomicU64,
    /// Every other method (creates, patches, updates, deletes).
    pub write: AtomicU64,
    by_kind: Mutex<BTreeMap<String, u64>>,
}

impl RequestCount {
    pub fn total(&self) -> u64 {
        self.get.load(Ordering::Relaxed) + self.write.load(Ordering::Relaxed)
    }

    /// Counts per `verb resource[/subresource]`, e.g. `patch tasks/status`.
    pub fn by_kind(&self) -> BTreeMap<String, u64> {
        self.by_kind.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// `by_kind` on one line without spaces: `create:pods=2000,patch:tasks/status=2000`.
    pub fn summary(&self) -> String {
        self.by_kind()
            .iter()
            .map(|(k, n)| format!("{}={n}", k.replace(' ', ":")))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn record(&self, method: &http::Method, path: &str, query: Option<&str>) {
        let slot = if method == http::Method::GET {
            &self.get
        } else {
            &self.write
        };
        slot.fetch_add(1, Ordering::Relaxed);
        let key = classify(method, path, query);
        if let Ok(mut m) = self.by_kind.lock() {
            *m.entry(key).or_default() += 1;
        }
    }
}

/// `verb resource[/subresource]` of one request, verbs as the apiserver's audit log names
/// them (get, list, watch, create, patch, update, delete, deletecollection).
pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> String {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest: &[&str] = match segs.first() {
        Some(&"api") if segs.len() >= 2 => &segs[2..],
        Some(&"apis") if segs.len() >= 3 => &segs[3..],
        _ => return format!("{} {}", method.as_str().to_ascii_lowercase(), path),
    };
    // namespaces/<ns>/<resource>... (but `namespaces/<name>` alone is the Namespace itself)
    let rest = if rest.len() >= 3 && rest[0] == "namespaces" {
        &rest[2..]
    } else {
        rest
    };
    let resource = match rest {
        [r] | [r, _] => r.to_string(),
        [r, _, sub, ..] => format!("{r}/{sub}"),
        [] => String::new(),
    };
    let named = rest.len() >= 2;
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PATCH => "patch",
        http::Method::PUT => "update",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => return format!("{} {resource}", method.as_str().to_ascii_lowercase()),
    };
    format!("{verb} {resource}")
}

/// Every request (watches and lists included) is counted; throttled answers are retried
/// and show in the requests' times, not here.
impl crate::launch::client::Observe for RequestCount {
    fn sent(&self, method: &http::Method, path: &str, query: Option<&str>) {
        self.record(method, path, query);
    }
    fn throttled(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn requests_are_named_by_verb_and_resource() {
        let c = |m: &Method, p: &str, q: Option<&str>| classify(m, p, q);
        let tasks = "/apis/envbridge.dev/v1alpha1/namespaces/ns1/tasks";
        assert_eq!(
            c(&Method::GET, tasks, Some("watch=true&labelSelector=a")),
            "watch tasks"
        );
        assert_eq!(c(&Method::GET, tasks, Some("limit=500")), "list tasks");
        assert_eq!(
            c(&Method::PATCH, &format!("{tasks}/t1/status"), None),
            "patch tasks/status"
        );
        assert_eq!(
            c(&Method::PATCH, &format!("{tasks}/t1"), None),
            "patch tasks"
        );
        assert_eq!(
            c(&Method::POST, "/api/v1/namespaces/ns1/pods", None),
            "create pods"
        );
        assert_eq!(
            c(&Method::DELETE, "/api/v1/namespaces/ns1/pods/p", None),
            "delete pods"
        );
        assert_eq!(c(&Method::GET, "/api/v1/nodes", None), "list nodes");
        assert_eq!(
            c(&Method::GET, "/api/v1/namespaces/ns1", None),
            "get namespaces"
        );
        assert_eq!(c(&Method::GET, "/version", None), "get /version");
        let count = RequestCount::default();
        count.record(&Method::POST, "/api/v1/namespaces/a/pods", None);
        count.record(&Method::POST, "/api/v1/namespaces/b/pods", None);
        count.record(&Method::GET, "/api/v1/pods", Some("watch=true"));
        assert_eq!(count.total(), 3);
        assert_eq!(count.summary(), "create:pods=2,watch:pods=1");
    }
}

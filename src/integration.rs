//! An integration endpoint's HTTP call (docs/integrations.md): a JSON POST, and its answer
//! read the one way every caller reads it. The operator sends the workflows' `call:` roles
//! through it, the daemon asks a site's run-number service.

use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Answers are read up to this many bytes.
pub const MAX_ANSWER: usize = 64 * 1024;

/// An HTTP client for integration endpoints (`http://` only).
#[derive(Clone)]
pub struct Endpoints {
    http: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Endpoints {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        Endpoints {
            http: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

impl Endpoints {
    /// POSTs `body` (JSON) to `endpoint`: the answer's JSON (null when it is not JSON) when
    /// [`answer`] says it succeeded, else why not.
    pub async fn post(&self, endpoint: &str, body: Vec<u8>) -> Result<serde_json::Value, String> {
        let req = hyper::Request::post(endpoint)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("endpoint {endpoint}: {e}"))?;
        let resp = self
            .http
            .request(req)
            .await
            .map_err(|e| format!("endpoint {endpoint}: {e}"))?;
        let status = resp.status();
        let bytes = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("endpoint {endpoint}: reading the answer: {e}"))?
            .to_bytes();
        answer(status.as_u16(), &bytes)?;
        Ok(serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }
}

/// An integration's answer: 2xx and not `{"ok": false}` is success; the error is the
/// answer's `error` (or its text).
pub fn answer(status: u16, body: &[u8]) -> Result<(), String> {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let error = json
        .as_ref()
        .and_then(|j| j.get("error"))
        .and_then(|e| e.as_str())
        .map(str::to_string);
    let said_ok = json
        .as_ref()
        .and_then(|j| j.get("ok"))
        .and_then(|o| o.as_bool());
    if (200..300).contains(&status) && said_ok != Some(false) {
        return Ok(());
    }
    let text = String::from_utf8_lossy(body);
    let why = error.unwrap_or_else(|| text.chars().take(300).collect());
    Err(if (200..300).contains(&status) {
        why
    } else {
        format!("HTTP {status}: {why}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        assert_eq!(answer(200, b""), Ok(()));
        assert_eq!(answer(200, br#"{"ok": true}"#), Ok(()));
        assert_eq!(
            answer(200, br#"{"ok": false, "error": "DCS busy"}"#),
            Err("DCS busy".to_string())
        );
        assert_eq!(answer(500, b"boom"), Err("HTTP 500: boom".to_string()));
        assert_eq!(
            answer(404, br#"{"error": "no such function"}"#),
            Err("HTTP 404: no such function".to_string())
        );
    }
}

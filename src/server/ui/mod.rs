//! The shift's dashboard: a live web page for environments and tasks, served under `/ui/` on
//! the daemon's HTTP listener (docs/dashboard.md).
//!
//! Same trust boundary and roles as the gRPC API: a caller logs in with its token (a form
//! POST, never a URL), gets a server-side session in an HttpOnly, SameSite=Strict cookie,
//! and every action goes through the gRPC service's own handlers with that caller, so the
//! checks and the audit are the API's. Plain HTTP is served on loopback only.

mod actions;
mod data;
mod feed;
mod live;
mod pages;
pub mod session;
mod slots;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::api::Api;
use super::auth::{Caller, Tokens};
use crate::bridge::Bridge;

/// Largest request body the page sends (a create's variables).
const MAX_BODY: usize = 64 * 1024;

/// What the dashboard's handlers share.
pub struct Ui {
    bridge: Arc<Bridge>,
    /// The gRPC service itself: actions call its handlers (same checks, same audit).
    api: Api,
    /// None: `--insecure-no-auth` (loopback only): any token logs in as the admin.
    tokens: Option<Arc<Tokens>>,
    sessions: session::Sessions,
    streams: slots::Slots,
    /// The live changes, built once for every open page (feed.rs).
    feed: tokio::sync::broadcast::Sender<Arc<feed::Batch>>,
    /// Cookies carry `Secure` (the page is served over TLS).
    secure: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error("log in first")]
    NoSession,
    #[error("this request did not come from the dashboard's own page (Origin)")]
    CrossSite,
    #[error("too many live connections ({0}); close a dashboard tab")]
    Busy(usize),
    #[error("this session has {0} live connections already; close a dashboard tab")]
    SessionBusy(usize),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    /// An API call's refusal, in the daemon's own words.
    #[error("{}", .0.message())]
    Api(tonic::Status),
    #[error("reading the cluster: {0}")]
    Kube(String),
    #[error("reading the workflows: {0}")]
    Workflows(String),
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        use tonic::Code;
        let code = match &self {
            UiError::NoSession => StatusCode::UNAUTHORIZED,
            UiError::CrossSite => StatusCode::FORBIDDEN,
            UiError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            UiError::SessionBusy(_) => StatusCode::TOO_MANY_REQUESTS,
            UiError::NotFound(_) => StatusCode::NOT_FOUND,
            UiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            UiError::Kube(_) => StatusCode::BAD_GATEWAY,
            UiError::Workflows(_) => StatusCode::INTERNAL_SERVER_ERROR,
            UiError::Api(s) => match s.code() {
                Code::InvalidArgument => StatusCode::BAD_REQUEST,
                Code::NotFound => StatusCode::NOT_FOUND,
                Code::PermissionDenied => StatusCode::FORBIDDEN,
                Code::Unauthenticated => StatusCode::UNAUTHORIZED,
                Code::FailedPrecondition => StatusCode::CONFLICT,
                Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
                Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
        };
        let body = serde_json::json!({ "error": self.to_string() }).to_string();
        (
            code,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response()
    }
}

impl Ui {
    /// The session a request carries: its id and caller.
    fn session(&self, headers: &HeaderMap) -> Option<(String, Caller)> {
        let id = session::cookie_id(headers)?;
        let caller = self.sessions.caller(&id)?;
        Some((id, caller))
    }

    fn caller(&self, headers: &HeaderMap) -> Result<Caller, UiError> {
        self.session(headers)
            .map(|(_, c)| c)
            .ok_or(UiError::NoSession)
    }

    /// The caller of a state-changing request: a session, and from this page.
    fn acting_caller(&self, headers: &HeaderMap) -> Result<Caller, UiError> {
        let caller = self.caller(headers)?;
        if !session::same_origin(headers) {
            return Err(UiError::CrossSite);
        }
        Ok(caller)
    }
}

/// The dashboard's routes, for the HTTP listener bound to `http`. Beyond loopback without
/// TLS every page answers 403 saying so (the listener serves plain HTTP).
pub fn router(bridge: Arc<Bridge>, tokens: Option<Arc<Tokens>>, http: SocketAddr) -> Router {
    if !http.ip().is_loopback() {
        tracing::warn!(addr = %http, "the dashboard (/ui/) is not served beyond loopback: it needs TLS, which the HTTP listener does not offer");
        return Router::new()
            .route("/ui", get(pages::loopback_only))
            .route("/ui/", get(pages::loopback_only).post(pages::loopback_only))
            .route(
                "/ui/{*rest}",
                get(pages::loopback_only).post(pages::loopback_only),
            );
    }
    let feed = feed::start(&bridge.roster);
    let ui = Arc::new(Ui {
        api: Api {
            bridge: bridge.clone(),
        },
        bridge,
        tokens,
        sessions: session::Sessions::default(),
        streams: slots::Slots::default(),
        feed,
        secure: false,
    });
    Router::new()
        .route("/ui", get(pages::to_index))
        .route("/ui/", get(pages::index))
        .route("/ui/login", get(pages::login_form).post(pages::login))
        .route("/ui/logout", post(pages::logout))
        .route("/ui/new", get(pages::new_env))
        .route("/ui/env/{id}", get(pages::env))
        .route("/ui/assets/{file}", get(pages::asset))
        .route("/ui/events", get(data::events))
        .route("/ui/api/me", get(data::me))
        .route("/ui/api/workflows", get(data::workflows))
        .route("/ui/api/env/{id}/task/{task}", get(data::story))
        .route("/ui/api/create", post(actions::create))
        .route("/ui/api/env/{id}/transition", post(actions::transition))
        .route("/ui/api/env/{id}/destroy", post(actions::destroy))
        .route("/ui/api/env/{id}/kill", post(actions::kill))
        .route("/ui/{*rest}", get(pages::other))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(loopback_host))
        .with_state(ui)
}

/// Only requests addressed to a loopback host: a page of another site whose name resolves to
/// 127.0.0.1 (DNS rebinding) sends its own name as `Host` (and as `Origin`, which the action
/// check compares with `Host`), so it is refused here before any login or action.
async fn loopback_host(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if host_is_loopback(req.headers()) {
        next.run(req).await
    } else {
        (
            StatusCode::FORBIDDEN,
            "the dashboard answers requests to a loopback address only (127.0.0.1, [::1], localhost)",
        )
            .into_response()
    }
}

fn host_is_loopback(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;
    use crate::bridge::{BridgeConfig, BridgeError, Metrics};

    /// A bridge whose client points nowhere: these requests never reach a cluster.
    fn bridge() -> Arc<Bridge> {
        let cfg = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        let client = kube::Client::try_from(cfg).expect("client");
        let renderer: crate::bridge::Renderer =
            Arc::new(|_, _, _| Err(BridgeError::Render("none".into())));
        Bridge::new(client, BridgeConfig::default(), Metrics::new(), renderer)
    }

    async fn get_from(app: Router, path: &str, host: &str) -> StatusCode {
        let req = Request::get(path)
            .header(header::HOST, host)
            .body(Body::empty())
            .expect("request");
        app.oneshot(req).await.expect("answer").status()
    }

    async fn get(app: Router, path: &str) -> StatusCode {
        get_from(app, path, "127.0.0.1:9464").await
    }

    #[tokio::test]
    async fn only_requests_to_a_loopback_host_are_answered() {
        let app = router(bridge(), None, "127.0.0.1:9464".parse().expect("addr"));
        for host in [
            "127.0.0.1:9464",
            "localhost:9464",
            "[::1]:9464",
            "127.0.0.1",
        ] {
            assert_eq!(
                get_from(app.clone(), "/ui/login", host).await,
                StatusCode::OK,
                "{host}"
            );
        }
        // A rebinding site's name, a private address, a name that only starts like localhost.
        for host in [
            "evil.example:9464",
            "10.0.0.5:9464",
            "localhost.evil.example",
            "",
        ] {
            assert_eq!(
                get_from(app.clone(), "/ui/login", host).await,
                StatusCode::FORBIDDEN,
                "{host:?}"
            );
        }
    }

    #[tokio::test]
    async fn beyond_loopback_the_dashboard_is_not_served() {
        let app = router(bridge(), None, "0.0.0.0:9464".parse().expect("addr"));
        for path in [
            "/ui",
            "/ui/",
            "/ui/login",
            "/ui/events",
            "/ui/assets/env.js",
        ] {
            assert_eq!(
                get(app.clone(), path).await,
                StatusCode::FORBIDDEN,
                "{path}"
            );
        }
        let app = router(bridge(), None, "127.0.0.1:9464".parse().expect("addr"));
        assert_eq!(get(app.clone(), "/ui/login").await, StatusCode::OK);
        assert_eq!(get(app, "/ui/").await, StatusCode::SEE_OTHER);
    }
}

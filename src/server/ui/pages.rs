//! The pages: the login form and the three page shells (list, environment, create), whose
//! content the page's own script fills from the live feed; the embedded assets.

use std::sync::Arc;
use std::time::Duration;

use axum::Form;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{Ui, session};
use crate::server::auth::Caller;
use crate::state::Event;

/// The page may load only its own script, style and data; never be framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A wrong token costs this long (a guess per request, slowly).
const WRONG_TOKEN_DELAY: Duration = Duration::from_millis(300);

fn html(code: StatusCode, body: String) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // Not `no-referrer`: with it a browser sends `Origin: null` on form posts.
            (header::REFERRER_POLICY, "same-origin"),
        ],
        body,
    )
        .into_response()
}

/// Text for HTML (content and attribute values).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const LOGIN: &str = include_str!("assets/login.html");
const SHELL: &str = include_str!("assets/shell.html");

fn login_page(code: StatusCode, error: &str, insecure: bool) -> Response {
    let note = if insecure {
        "<p class=\"warn\">This daemon runs with --insecure-no-auth: any token logs in as the admin.</p>"
    } else {
        ""
    };
    let error = if error.is_empty() {
        String::new()
    } else {
        format!("<p class=\"error\" id=\"login-error\">{}</p>", esc(error))
    };
    html(
        code,
        LOGIN.replace("{{error}}", &error).replace("{{note}}", note),
    )
}

pub async fn login_form(State(ui): State<Arc<Ui>>) -> Response {
    login_page(StatusCode::OK, "", ui.tokens.is_none())
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
}

pub async fn login(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if !session::same_origin(&headers) {
        return login_page(
            StatusCode::FORBIDDEN,
            "This login did not come from the dashboard's own page.",
            ui.tokens.is_none(),
        );
    }
    let caller = match &ui.tokens {
        None => Some(Caller::unauthenticated()),
        Some(t) => t.identify(f.token.trim()),
    };
    let Some(caller) = caller else {
        tracing::warn!("dashboard: a login with a wrong token");
        tokio::time::sleep(WRONG_TOKEN_DELAY).await;
        return login_page(
            StatusCode::UNAUTHORIZED,
            "That token is not one of this daemon's callers.",
            ui.tokens.is_none(),
        );
    };
    tracing::info!(caller = %caller.name, role = %caller.role, "dashboard: logged in");
    let id = ui.sessions.open(caller);
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/ui/".to_string()),
            (header::SET_COOKIE, session::set_cookie(&id, ui.secure)),
            (header::CACHE_CONTROL, "no-store".to_string()),
        ],
    )
        .into_response()
}

pub async fn logout(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Response {
    if let Some((id, _)) = ui.session(&headers)
        && session::same_origin(&headers)
    {
        ui.sessions.close(&id);
    }
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/ui/login".to_string()),
            (header::SET_COOKIE, session::clear_cookie(ui.secure)),
        ],
    )
        .into_response()
}

fn to_login() -> Response {
    Redirect::to("/ui/login").into_response()
}

/// The events a person may send and where they lead, from the state machine itself
/// (`crate::state`), in its order: `[{"event": "CONFIGURE", "from": ["STANDBY"], "to":
/// "CONFIGURED"}, ...]`. GO_ERROR (from any state) is the daemon's own, not a button.
fn events_json() -> String {
    let table: Vec<serde_json::Value> = Event::ALL
        .iter()
        .filter_map(|e| {
            let from: Vec<&str> = e.source()?.iter().map(|s| s.as_str()).collect();
            Some(
                serde_json::json!({ "event": e.as_str(), "from": from, "to": e.target().as_str() }),
            )
        })
        .collect();
    serde_json::Value::Array(table).to_string()
}

/// One page shell: `page` names the script's view, `env` its environment.
fn shell(ui: &Ui, caller: &Caller, page: &str, title: &str, env: &str) -> Response {
    let body = SHELL
        .replace("{{events}}", &esc(&events_json()))
        .replace("{{title}}", &esc(title))
        .replace("{{page}}", page)
        .replace("{{env}}", &esc(env))
        .replace("{{caller}}", &esc(&caller.name))
        .replace("{{role}}", &caller.role.to_string())
        .replace(
            "{{leader}}",
            if ui.bridge.is_leader() {
                "true"
            } else {
                "false"
            },
        );
    html(StatusCode::OK, body)
}

pub async fn to_index() -> Response {
    Redirect::to("/ui/").into_response()
}

pub async fn index(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Response {
    match ui.session(&headers) {
        Some((_, c)) => shell(&ui, &c, "list", "Environments", ""),
        None => to_login(),
    }
}

pub async fn new_env(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Response {
    match ui.session(&headers) {
        Some((_, c)) => shell(&ui, &c, "new", "New environment", ""),
        None => to_login(),
    }
}

pub async fn env(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    match ui.session(&headers) {
        Some((_, c)) => shell(&ui, &c, "env", &format!("Environment {id}"), &id),
        None => to_login(),
    }
}

/// Any other path under /ui/: the login first, then "not found".
pub async fn other(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Response {
    match ui.session(&headers) {
        Some(_) => html(
            StatusCode::NOT_FOUND,
            "<!doctype html><title>Not found</title><p>No such page. <a href=\"/ui/\">Environments</a></p>".into(),
        ),
        None => to_login(),
    }
}

pub async fn loopback_only() -> Response {
    html(
        StatusCode::FORBIDDEN,
        "<!doctype html><title>Dashboard unavailable</title><p>The dashboard is served over plain HTTP on loopback only; this listener is beyond loopback and has no TLS (docs/dashboard.md).</p>".into(),
    )
}

/// The page's own style and script (no third-party code): public, they hold no data.
pub async fn asset(Path(file): Path<String>) -> Response {
    let (ty, body) = match file.as_str() {
        "app.css" => ("text/css; charset=utf-8", include_str!("assets/app.css")),
        "common.js" => (
            "text/javascript; charset=utf-8",
            include_str!("assets/common.js"),
        ),
        "list.js" => (
            "text/javascript; charset=utf-8",
            include_str!("assets/list.js"),
        ),
        "env.js" => (
            "text/javascript; charset=utf-8",
            include_str!("assets/env.js"),
        ),
        "new.js" => (
            "text/javascript; charset=utf-8",
            include_str!("assets/new.js"),
        ),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, ty),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_pages_event_table_is_the_state_machines() {
        let t: Vec<serde_json::Value> = serde_json::from_str(&super::events_json()).expect("json");
        let names: Vec<&str> = t.iter().filter_map(|e| e["event"].as_str()).collect();
        assert_eq!(
            names,
            ["CONFIGURE", "START", "STOP", "RESET", "RECOVER", "EXIT"],
            "the machine's order; GO_ERROR is no button"
        );
        assert_eq!(t[0]["from"], serde_json::json!(["STANDBY"]));
        assert_eq!(t[1]["to"], "RUNNING");
        assert_eq!(
            t[5]["from"],
            serde_json::json!(["STANDBY", "CONFIGURED", "ERROR"])
        );
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            super::esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }
}

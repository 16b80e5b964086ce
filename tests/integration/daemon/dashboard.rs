//! The dashboard's contract over plain HTTP (no browser): login, session cookie, redirects,
//! the live feed's 401, roles and Origin on actions, and a standby's read-only page. The
//! browser test is `dashboard_browser`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use envbridge::roster::{EnvKey, EnvRecord, Roster, TaskRecord};
use envbridge::server::auth::Tokens;
use envbridge::state::State;
use http_body_util::BodyExt;

use super::fixture::{Daemon, Setup, fixed_ns, test_renderer};
use super::web::{self, request, send, sse_event};

pub const ADMIN: &str = "dash-admin-token-0123456789";
pub const OPERATOR: &str = "dash-operator-token-0123456789";
pub const VIEWER: &str = "dash-viewer-token-0123456789";

pub fn tokens() -> Arc<Tokens> {
    Arc::new(
        Tokens::parse(
            &format!(
                "tokens:\n  - {{name: ada, role: admin, token: {ADMIN}}}\n  - {{name: otto, role: operator, token: {OPERATOR}}}\n  - {{name: vera, role: viewer, token: {VIEWER}}}\n"
            ),
            "test",
        )
        .expect("tokens"),
    )
}

async fn daemon(ns: &Setup) -> Daemon {
    Daemon::start_with_tokens(
        ns.client.clone(),
        fixed_ns(&ns.name),
        test_renderer(&ns.tpl.prefix),
        Some(tokens()),
    )
    .await
}

#[tokio::test]
async fn dashboard_login_sessions_and_redirects() {
    let ns = Setup::shared("dash-contract").await;
    let d = daemon(&ns).await;
    let addr = d.http;

    // The login form posts a `token` field; nothing is logged in by a URL.
    let form = request(addr, "GET", "/ui/login", &[], "").await;
    assert_eq!(form.status, 200);
    assert!(form.body.contains("name=\"token\""), "{}", form.body);
    assert!(form.body.contains("method=\"post\""), "{}", form.body);
    let by_url = request(addr, "GET", &format!("/ui/login?token={ADMIN}"), &[], "").await;
    assert!(by_url.header("set-cookie").is_empty());

    // Without a session: every page goes to the login, the live feed is 401.
    for path in [
        "/ui/",
        "/ui/env/x",
        "/ui/new",
        "/ui/anything/else",
        "/ui/api/me",
    ] {
        let a = request(addr, "GET", path, &[], "").await;
        if path.starts_with("/ui/api") {
            assert_eq!(a.status, 401, "{path}");
        } else {
            assert_eq!(a.status, 303, "{path}");
            assert_eq!(a.header("location"), "/ui/login", "{path}");
        }
    }
    let ev = request(addr, "GET", "/ui/events", &[], "").await;
    assert_eq!(ev.status, 401);
    let forged = format!("envbridge_session={}", "ab".repeat(32));
    let a = request(addr, "GET", "/ui/", &[("cookie", &forged)], "").await;
    assert_eq!(a.status, 303, "an unknown session id is no session");
    let ev = request(addr, "GET", "/ui/events", &[("cookie", &forged)], "").await;
    assert_eq!(ev.status, 401);

    // A wrong token: 401, no cookie.
    let form_ct = ("content-type", "application/x-www-form-urlencoded");
    let wrong = request(addr, "POST", "/ui/login", &[form_ct], "token=not-a-token").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_empty());
    assert!(
        wrong.body.contains("That token is not one of this daemon"),
        "{}",
        wrong.body
    );

    // A right token: 303 to /ui/ with an HttpOnly, SameSite=Strict cookie (not Secure: HTTP).
    let ok = request(
        addr,
        "POST",
        "/ui/login",
        &[form_ct],
        &format!("token={VIEWER}"),
    )
    .await;
    assert_eq!(ok.status, 303);
    assert_eq!(ok.header("location"), "/ui/");
    let set = ok.header("set-cookie");
    assert!(set.starts_with("envbridge_session="), "{set}");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "plain HTTP on loopback: {set}");
    let cookie = web::session_cookie(&ok);
    let viewer = [("cookie", cookie.as_str())];

    let list = request(addr, "GET", "/ui/", &viewer, "").await;
    assert_eq!(list.status, 200);
    assert!(list.body.contains("data-page=\"list\""));
    assert!(list.body.contains("data-role=\"viewer\""));
    assert!(
        list.header("content-security-policy")
            .contains("script-src 'self'")
    );
    let page = request(addr, "GET", "/ui/env/some-env", &viewer, "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("data-env=\"some-env\""));
    let js = request(addr, "GET", "/ui/assets/env.js", &[], "").await;
    assert_eq!(js.status, 200);
    assert!(js.body.contains("EventSource") || js.body.contains("live("));

    // The live feed starts with a snapshot.
    let res = send(addr, "GET", "/ui/events", &viewer, "").await;
    assert_eq!(res.status(), 200);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let snap: serde_json::Value = serde_json::from_str(&sse_event(res, "snapshot").await).unwrap();
    assert_eq!(snap["leader"], true);
    assert!(snap["envs"].is_array());
    // An environment the roster does not hold (yet): followed, reported missing.
    let res = send(addr, "GET", "/ui/events?env=not-yet", &viewer, "").await;
    assert_eq!(res.status(), 200);
    let snap: serde_json::Value = serde_json::from_str(&sse_event(res, "snapshot").await).unwrap();
    assert_eq!(snap["envs_gone"], serde_json::json!(["not-yet"]));

    // A viewer may not act: the API's own refusal, in its words.
    let json = ("content-type", "application/json");
    let create = r#"{"workflow":"readout-dataflow","variables":{"hosts":"flp001"}}"#;
    let a = request(addr, "POST", "/ui/api/create", &[viewer[0], json], create).await;
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(
        a.body.contains("vera (viewer) may not create environments"),
        "{}",
        a.body
    );

    // An operator from another origin is refused before anything happens.
    let op = web::login(addr, OPERATOR).await;
    let evil = [
        ("cookie", op.as_str()),
        json,
        ("origin", "http://evil.example"),
    ];
    let a = request(addr, "POST", "/ui/api/create", &evil, create).await;
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("Origin"), "{}", a.body);
    // From the page's own origin, the API's validation answers (here: an unknown environment).
    let origin = format!("http://{addr}");
    let same = [("cookie", op.as_str()), json, ("origin", origin.as_str())];
    let a = request(
        addr,
        "POST",
        "/ui/api/env/no-such-env/transition",
        &same,
        r#"{"event":"CONFIGURE"}"#,
    )
    .await;
    assert_eq!(a.status, 404, "{}", a.body);
    let err: serde_json::Value = serde_json::from_str(&a.body).expect("JSON");
    assert_eq!(err["error"], "environment \"no-such-env\" not found");
    let a = request(
        addr,
        "POST",
        "/ui/api/env/no-such-env/transition",
        &same,
        r#"{"event":"START"}"#,
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("run number"), "{}", a.body);
    // Bodies are bounded.
    let big = format!(
        r#"{{"workflow":"readout-dataflow","variables":{{"x":"{}"}}}}"#,
        "a".repeat(200 * 1024)
    );
    let a = request(addr, "POST", "/ui/api/create", &same, &big).await;
    assert_eq!(a.status, 413, "{}", a.body);

    // Log out ends the session on the server, not only in the browser.
    let a = request(
        addr,
        "POST",
        "/ui/logout",
        &[("cookie", op.as_str()), ("origin", origin.as_str())],
        "",
    )
    .await;
    assert_eq!(a.status, 303);
    let a = request(addr, "GET", "/ui/", &[("cookie", op.as_str())], "").await;
    assert_eq!(a.status, 303);
}

#[tokio::test]
async fn a_standby_replica_shows_the_dashboard_read_only() {
    let ns = Setup::shared("dash-standby").await;
    let d = daemon(&ns).await;
    // What leader election leaves a replica that does not hold the lease.
    d.bridge.leader_flag().store(false, Ordering::Release);
    let addr = d.http;
    let cookie = web::login(addr, ADMIN).await;
    let c = [("cookie", cookie.as_str())];
    let page = request(addr, "GET", "/ui/", &c, "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("data-leader=\"false\""), "{}", page.body);
    let res = send(addr, "GET", "/ui/events", &c, "").await;
    let snap: serde_json::Value = serde_json::from_str(&sse_event(res, "snapshot").await).unwrap();
    assert_eq!(snap["leader"], false);
    // Writes are the leader's: the API's standby refusal, even for an admin.
    let origin = format!("http://{addr}");
    let a = request(
        addr,
        "POST",
        "/ui/api/create",
        &[
            c[0],
            ("content-type", "application/json"),
            ("origin", origin.as_str()),
        ],
        r#"{"workflow":"readout-dataflow","variables":{"hosts":"flp001"}}"#,
    )
    .await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(a.body.contains("standby"), "{}", a.body);
}

/// An environment `key.name` of `tasks` tasks on `tasks / 20` nodes, RUNNING, for records put
/// straight into a daemon's roster (the page's source) by the page's scale tests.
pub fn synthetic_env(key: &EnvKey, tasks: u32) -> EnvRecord {
    EnvRecord {
        key: key.clone(),
        id: key.name.clone(),
        workflow: "readout-dataflow".into(),
        nodes: tasks.div_ceil(20),
        tasks,
        desired: State::Running,
        state: Some(State::Running),
        requested: None,
        observed: None,
        counts: [(State::Running, tasks)].into(),
        failing: vec![],
        failing_critical: 0,
        deleting: false,
        run_number: Some("77".into()),
        description: None,
        variables: Default::default(),
        run_variables: Default::default(),
        created_at: SystemTime::now(),
        changed_at: SystemTime::now(),
    }
}

/// Task `i` of [`synthetic_env`]: `<name>-task-NNNN` on `flp(i/20+1)`, four classes.
pub fn synthetic_task(
    r: &Roster,
    key: &EnvKey,
    i: usize,
    state: State,
    message: Option<&str>,
) -> TaskRecord {
    const CLASSES: [&str; 4] = ["readout", "stfbuilder", "stfsender", "qc"];
    let node = format!("flp{:03}", i / 20 + 1);
    TaskRecord {
        name: format!("{}-task-{i:04}", key.name).into(),
        env: key.clone(),
        node: r.intern(&node),
        class: r.intern(CLASSES[i % 4]),
        path: format!("{}.host-{node}.role{}.t{i:04}", key.name, i % 4).into(),
        critical: true,
        state,
        pod_phase: Some(r.intern("Running")),
        pod_ip: Some(r.intern(&format!("127.1.{}.{}", i / 250, i % 250))),
        message: message.map(Into::into),
        transition: None,
        ports: vec![40000 + (i % 20) as u16].into(),
        control_port: 40000 + (i % 20) as u16,
        pid: 0,
        deleting: false,
        changed_at: SystemTime::now(),
    }
}

/// A live client that does not read lags alone: another one keeps getting every change at
/// once, and the slow one, when it reads again, is given a fresh snapshot (its missed changes
/// were dropped, not buffered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_live_client_lags_alone_and_gets_a_fresh_snapshot() {
    let ns = Setup::shared("dash-slow").await;
    let d = daemon(&ns).await;
    let r = d.bridge.roster.clone();
    let key = EnvKey::new(&ns.name, "slow");
    r.apply_env(synthetic_env(&key, 2000));
    for i in 0..2000 {
        r.apply_task(synthetic_task(&r, &key, i, State::Running, None));
    }
    let cookie = web::login(d.http, VIEWER).await;
    let c = [("cookie", cookie.as_str())];
    // The slow client: its stream is opened and then not read.
    let slow = send(d.http, "GET", "/ui/events?env=slow", &c, "").await;
    assert_eq!(slow.status(), 200);
    let fast = send(d.http, "GET", "/ui/events?env=slow", &c, "").await;
    let mut fast = fast.into_body();
    // Rounds over every task, each its own batch of the dashboard's shared producer (a pause
    // longer than its 60 ms window after each): more batches than a page's stream may fall
    // behind (feed.rs: 64), and more bytes (about 60 MB) than the sockets' buffers take for
    // the client that does not read.
    for round in 0..100 {
        let state = if round % 2 == 0 {
            State::Configured
        } else {
            State::Running
        };
        for i in 0..2000 {
            r.apply_task(synthetic_task(&r, &key, i, state, None));
        }
        tokio::time::sleep(Duration::from_millis(80)).await;
    }
    r.apply_task(synthetic_task(
        &r,
        &key,
        1999,
        State::Error,
        Some("the last change"),
    ));
    let started = std::time::Instant::now();
    let mut seen = String::new();
    while !seen.contains("the last change") {
        let left = Duration::from_secs(20).saturating_sub(started.elapsed());
        let frame = tokio::time::timeout(left, fast.frame())
            .await
            .expect("the reading client got the last change within 20 s")
            .expect("stream open")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
            // Keep the tail only: the test needs the last message, not the whole history.
            if seen.len() > 1 << 20 {
                seen.drain(..seen.len() - (1 << 16));
            }
        }
    }
    eprintln!(
        "dashboard: a reading client had the last change {:?} after it, beside a stalled one",
        started.elapsed()
    );
    // The slow one: a first snapshot, then (it lagged) another snapshot carrying the truth.
    let mut slow = slow.into_body();
    let mut snapshots = 0;
    let mut total = 0;
    let mut tail = String::new();
    // The end of the previous frame: an event's head may be split across frames.
    let mut carry = String::new();
    let started = std::time::Instant::now();
    while snapshots < 2 || !tail.contains("the last change") {
        let left = Duration::from_secs(30).saturating_sub(started.elapsed());
        let frame = tokio::time::timeout(left, slow.frame())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the slow client: {snapshots} snapshot(s), {total} bytes and no last change within 30 s"
                )
            })
            .expect("stream open")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            total += data.len();
            let text = String::from_utf8_lossy(&data);
            let joined = format!("{carry}{text}");
            snapshots += joined.matches("event: snapshot").count();
            carry = joined
                .chars()
                .rev()
                .take(14)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            tail.push_str(&text);
            if tail.len() > 1 << 20 {
                tail.drain(..tail.len() - (1 << 16));
            }
        }
    }
    eprintln!(
        "dashboard: the stalled client read {total} bytes afterwards: {snapshots} snapshots (it lagged) and the truth"
    );
}

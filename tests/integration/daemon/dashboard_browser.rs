//! The dashboard end to end in a real headless Chromium (chromedriver, W3C WebDriver): the
//! daemon with tokens, the operator and one simulator process per pod on the local control
//! plane. Log in; create an environment from the form built from the workflow's public
//! variables; CONFIGURE; START with a run number; STOP; START again; a StfBuilder that moves
//! itself to ERROR while RUNNING shows highlighted on the page without a reload (timed from
//! the simulator's own logged change); its story; destroy. A screenshot of each step.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use super::dashboard::{ADMIN, synthetic_env, synthetic_task, tokens};
use super::fixture::{self, Daemon, fixed_ns};
use super::stack::Stack;
use super::web::{Browser, CutProxy, require_chromium};
use crate::support::{self, TestNamespace};

/// Generous: the figure is printed; the benchmark measures the live path itself.
/// Marks the page (a reload would drop the mark) and notes when a failing row first appears
/// (`window.__failSeenAt`).
const WATCH_FAILING: &str = "window.__sameDocument = 'yes';
     new MutationObserver(() => {
       if (!window.__failSeenAt && document.querySelector('.row.task.failing')) window.__failSeenAt = Date.now();
     }).observe(document.body, {subtree: true, childList: true, attributes: true});
     return 1";
const FAILURE_SEEN_WITHIN: Duration = Duration::from_secs(30);
const STEP: Duration = Duration::from_secs(90);
/// The simulator fails this long after RUNNING (the first run is STOPped before that: its
/// screenshot and the STOP dialog take about a second).
const FAIL_IN: &str = "RUNNING=8s";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_a_real_browser_drives_an_environment_and_shows_a_failure_live() {
    // Fail at once, and clearly, without a browser (never skip).
    require_chromium();
    let ns = TestNamespace::new("dash-browser").await;
    let suffix = support::random_suffix();
    let id = format!("dash{suffix}");
    let ports = 56000 + (u16::from_str_radix(&suffix[..4], 16).unwrap_or(0) % 90) * 100;

    let stack = Stack::start(&ns, &[&id], ports, Some(tokens())).await;
    let d = &stack.daemon;
    let base = format!("http://{}", d.http);

    let b = Browser::start().await;
    let took = Instant::now();

    // Log in: the page sends us to the login form first.
    b.goto(&format!("{base}/ui/")).await;
    b.find("#token", STEP).await;
    assert!(b.url().await.ends_with("/ui/login"));
    b.screenshot("01-login").await;
    b.type_in("#token", ADMIN).await;
    b.click("#login-submit").await;
    b.find("body[data-page=list]", STEP).await;
    b.find("#conn.live", STEP).await;
    b.screenshot("02-environments").await;

    // Create from the form built from readout-dataflow's public variables.
    b.click("#new-env").await;
    b.find("#workflow option[value=readout-dataflow]", STEP)
        .await;
    b.find("[data-var=dd_enabled] input[type=checkbox]", STEP)
        .await;
    let panels = b
        .js(
            "return [...document.querySelectorAll('fieldset legend')].map(l => l.textContent)",
            json!([]),
        )
        .await;
    // The anchor's panel names; its `detectors` (a selector without values) is left out.
    assert_eq!(
        panels,
        json!(["General Configuration", "Logging"]),
        "panels from `panel`"
    );
    assert!(
        b.js(
            "return document.querySelector('[data-var=detectors]') === null",
            json!([])
        )
        .await
            == json!(true),
        "the detectors selector follows the hosts: not in the form"
    );
    let label = b.text("[data-var=fmq_rate_logging] label").await;
    assert_eq!(label, "FairMQ rate logging (s)", "label from `label`");
    b.type_in("#env-id", &id).await;
    b.type_in("#hosts", "flp001,flp002").await;
    b.type_in("[name=var-fmq_rate_logging]", "0").await;
    b.type_in(
        "#site-vars",
        &format!("sim_fail_host=flp002\nsim_fail_in={FAIL_IN}"),
    )
    .await;
    b.screenshot("03-create-form").await;
    b.click("#create-submit").await;
    b.find(&format!("body[data-env={id}]"), STEP).await;
    b.find("#env-state[data-state=STANDBY]", STEP).await;
    // From here on the page is never reloaded: a reload would drop this mark. The observer
    // notes when a failing row first appears.
    b.js(WATCH_FAILING, json!([])).await;
    let rows = b
        .js(
            "return document.querySelectorAll('.row.task').length",
            json!([]),
        )
        .await;
    assert_eq!(rows, json!(6), "2 hosts x (readout, StfBuilder, StfSender)");
    b.screenshot("04-standby").await;

    // CONFIGURE, confirmed.
    transition(&b, "CONFIGURE", None, "CONFIGURED").await;
    b.screenshot("05-configured").await;
    // START with a run number, then STOP before the simulator's failure is due.
    transition(&b, "START", Some("4242"), "RUNNING").await;
    let running = Instant::now();
    assert_eq!(b.text("#env-run").await, "4242");
    b.screenshot("06-running").await;
    transition(&b, "STOP", None, "CONFIGURED").await;
    eprintln!(
        "dashboard: STOP done {:?} after RUNNING (the simulator fails {FAIL_IN})",
        running.elapsed()
    );
    b.screenshot("07-stopped").await;
    // The page's actions are the API's: audited with the logged-in caller.
    for what in ["create readout-dataflow", &format!("transition {id} START")] {
        audited(&ns.client, &ns.name, &format!("ada (admin) {what}")).await;
    }

    // START again: this time the StfBuilder on flp002 fails by itself while RUNNING.
    transition(&b, "START", Some("4243"), "RUNNING").await;
    assert_eq!(b.text("#env-run").await, "4243");
    let row = b
        .find(
            ".row.task.failing",
            FAILURE_SEEN_WITHIN + Duration::from_secs(8),
        )
        .await;
    let _ = row;
    let seen_at = b.js("return window.__failSeenAt || 0", json!([])).await;
    let same = b.js("return window.__sameDocument || ''", json!([])).await;
    assert_eq!(same, json!("yes"), "the page was not reloaded");
    let failing = b
        .js(
            "const r = document.querySelector('.row.task.failing');
             return {task: r.dataset.task, state: r.children[1].textContent,
                     bg: getComputedStyle(r).backgroundColor, first: r === document.querySelector('.row.task')}",
            json!([]),
        )
        .await;
    let task = failing["task"].as_str().expect("task").to_string();
    assert!(
        task.contains("flp002") || task.contains("stfb"),
        "{failing}"
    );
    assert_eq!(failing["state"], "ERROR", "{failing}");
    assert_eq!(
        failing["first"], true,
        "failing tasks come first: {failing}"
    );
    assert_ne!(failing["bg"], "rgba(0, 0, 0, 0)", "highlighted: {failing}");
    let changed = sim_change_ms(&stack.logs.path().join(format!("{}_{task}.log", ns.name)));
    let seen = seen_at.as_i64().expect("seen time") as u64;
    let latency = seen.saturating_sub(changed);
    eprintln!(
        "dashboard: the task's own ERROR (simulator log, unix_ms {changed}) shown highlighted on the page {latency} ms later, without a reload"
    );
    assert!(
        Duration::from_millis(latency) < FAILURE_SEEN_WITHIN,
        "{latency} ms"
    );
    b.find("#failing li", STEP).await;
    b.screenshot("08-failure").await;

    // Its story: the message, last log lines and pod events from the Task's status.
    b.click(&format!(".row.task[data-task=\"{task}\"]")).await;
    b.find("#story-message", STEP).await;
    let message = b.text("#story-message").await;
    assert!(
        message.contains("RUNNING") || message.contains("ERROR"),
        "{message}"
    );
    b.screenshot("09-story").await;

    // The daemon's own GO_ERROR leaves the environment in ERROR: STOP does not apply, and
    // the page does not offer it.
    b.find("#env-state[data-state=ERROR]", STEP).await;
    let stop_disabled = b
        .js(
            "return document.querySelector('button[data-event=STOP]').disabled",
            json!([]),
        )
        .await;
    assert_eq!(stop_disabled, json!(true));

    // Kill one task (a readout on flp001) from its story, confirmed: it leaves the page.
    let victim = b
        .js(
            "return [...document.querySelectorAll('.row.task')].map(r => r.dataset.task).find(n => n.startsWith('readout-flp001'))",
            json!([]),
        )
        .await;
    let victim = victim.as_str().expect("a readout on flp001").to_string();
    b.click(&format!(".row.task[data-task=\"{victim}\"]")).await;
    b.find("#story h2", STEP).await;
    b.click("#kill-task").await;
    b.find("#confirm[open]", STEP).await;
    b.click("#confirm-ok").await;
    wait_text(&b, "#action-done", &format!("{victim} is gone")).await;
    wait_text(&b, "#task-count", "5 of 5 tasks").await;

    // Destroy, confirmed; the page says when everything is gone.
    b.click("#destroy").await;
    b.click("#confirm-ok").await;
    // The kill's notice is still there until the destroy's replaces it.
    let done = text_where(&b, "#action-done", |t| t.starts_with("destroy: ")).await;
    assert!(done.contains("gone"), "{done}");
    b.find("#env-gone", STEP).await;
    b.screenshot("10-destroyed").await;
    eprintln!(
        "dashboard browser test: {:?}; screenshots in {}",
        took.elapsed(),
        b.shots.display()
    );
    drop(b);
    stack.stop().await;
}

/// Waits for an `Audit` Event whose note starts with `prefix`.
async fn audited(client: &kube::Client, ns: &str, prefix: &str) {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    loop {
        let list = events.list(&Default::default()).await.expect("events");
        if list.items.iter().any(|e| {
            e.reason.as_deref() == Some("Audit")
                && e.note.as_deref().is_some_and(|n| n.starts_with(prefix))
        }) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no audit event {prefix:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Clicks an event's button, confirms (START: with a run number), waits for `target`.
async fn transition(b: &Browser, event: &str, run: Option<&str>, target: &str) {
    b.click(&format!("button[data-event={event}]:not([disabled])"))
        .await;
    b.find("#confirm[open]", STEP).await;
    if let Some(n) = run {
        b.type_in("#confirm-run_number", n).await;
    }
    b.click("#confirm-ok").await;
    b.find(&format!("#env-state[data-state={target}]"), STEP)
        .await;
    let prefix = format!("{event} done");
    text_where(b, "#action-done", |t| t.starts_with(&prefix)).await;
}

/// The `unix_ms` of the simulator's last change by itself, from its log file.
fn sim_change_ms(log: &Path) -> u64 {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    envbridge::control::sim::last_self_error_ms(&text)
        .unwrap_or_else(|| panic!("{}: no self-inflicted change logged", log.display()))
}

/// The environment page with 2,000 tasks: only the rows in view exist, a change of one task
/// shows in place (failing first) at once, a burst of 2,000 changes is taken in, filters and
/// scrolling work. The tasks are put straight into the daemon's roster (the page's source):
/// the path from the cluster into the roster is the daemon tests' and the test above's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_with_2000_tasks_renders_only_what_is_visible_and_updates_in_place() {
    use envbridge::roster::EnvKey;
    use envbridge::state::State;

    require_chromium();
    let ns = TestNamespace::new("dash-big").await;
    let d = Daemon::start_with_tokens(
        ns.client.clone(),
        fixed_ns(&ns.name),
        fixture::test_renderer("unused"),
        Some(tokens()),
    )
    .await;
    let r = d.bridge.roster.clone();
    let key = EnvKey::new(&ns.name, "big");
    r.apply_env(synthetic_env(&key, 2000));
    let task =
        |i: usize, state: State, message: Option<&str>| synthetic_task(&r, &key, i, state, message);
    for i in 0..2000 {
        r.apply_task(task(i, State::Running, None));
    }

    let b = Browser::start().await;
    // The page goes through a proxy the test can cut, as a lost network would.
    let proxy = CutProxy::start(d.http).await;
    let base = format!("http://{}", proxy.addr);
    b.goto(&format!("{base}/ui/login")).await;
    b.type_in("#token", ADMIN).await;
    b.click("#login-submit").await;
    b.find("tr[data-env=big]", STEP).await;
    b.screenshot("13-environments").await;
    b.goto(&format!("{base}/ui/env/big")).await;
    let loaded = Instant::now();
    wait_text(&b, "#task-count", "2000 of 2000 tasks").await;
    eprintln!(
        "dashboard: 2,000 tasks listed {:?} after the page loaded",
        loaded.elapsed()
    );
    let rows = b
        .js("return document.querySelectorAll('.row').length", json!([]))
        .await;
    let rows = rows.as_u64().expect("rows");
    assert!(
        (10..=80).contains(&rows),
        "{rows} row elements for 2,000 tasks"
    );

    // One task fails: its row comes first, highlighted, in place.
    b.js(WATCH_FAILING, json!([])).await;
    let sent = unix_ms();
    r.apply_task(task(1234, State::Error, Some("boom: injected")));
    b.find(".row.task.failing[data-task=big-task-1234]", STEP)
        .await;
    let seen = b.js("return window.__failSeenAt || 0", json!([])).await;
    let latency = (seen.as_i64().expect("time") as u64).saturating_sub(sent);
    eprintln!(
        "dashboard: a change of one task in 2,000 shown {latency} ms after the roster had it"
    );
    let first = b
        .js(
            "return document.querySelector('.row.task').dataset.task",
            json!([]),
        )
        .await;
    assert_eq!(first, "big-task-1234", "the failing task comes first");
    b.screenshot("11-2000-tasks").await;

    // A burst: every task changes at once; the page takes it in and stays the same document.
    let sent = Instant::now();
    for i in 0..2000 {
        r.apply_task(task(i, State::Configured, None));
    }
    wait_text(&b, "#env-ready", "0 / 2000").await;
    eprintln!(
        "dashboard: a burst of 2,000 task changes shown within {:?}",
        sent.elapsed()
    );
    let same = b.js("return window.__sameDocument || ''", json!([])).await;
    assert_eq!(same, "yes", "no reload");

    // Scrolling brings the last rows; a filter narrows the list.
    b.js(
        "const s = document.querySelector('#task-rows'); s.scrollTop = s.scrollHeight; s.dispatchEvent(new Event('scroll')); return 1",
        json!([]),
    )
    .await;
    b.find(".row.task[data-task=big-task-1999]", STEP).await;
    b.js(
        "const s = document.querySelector('#f-node'); s.value = 'flp003'; s.dispatchEvent(new Event('change')); return 1",
        json!([]),
    )
    .await;
    wait_text(&b, "#task-count", "20 of 2000 tasks").await;

    // The connection is lost: the page says so; a change meanwhile shows once it resumes.
    proxy.cut(true);
    b.find("#conn.lost", STEP).await;
    r.apply_task(task(
        45,
        State::Error,
        Some("failed while the page was cut off"),
    ));
    b.screenshot("15-connection-lost").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cut_off = Instant::now();
    proxy.cut(false);
    b.find("#conn.live", STEP).await;
    b.find("#failing li[data-task=big-task-0045]", STEP).await;
    // Failing tasks come first: at the top of the (scrolled) list.
    b.js(
        "const s = document.querySelector('#task-rows'); s.scrollTop = 0; s.dispatchEvent(new Event('scroll')); return 1",
        json!([]),
    )
    .await;
    b.find(".row.task.failing[data-task=big-task-0045]", STEP)
        .await;
    eprintln!(
        "dashboard: live again {:?} after the network came back",
        cut_off.elapsed()
    );
    let same = b.js("return window.__sameDocument || ''", json!([])).await;
    assert_eq!(same, "yes", "resumed without a reload");

    // The replica loses the lead: the open page turns read-only by itself.
    d.bridge
        .leader_flag()
        .store(false, std::sync::atomic::Ordering::Release);
    b.find("#standby:not([hidden])", STEP).await;
    b.find("#env-actions[hidden]", STEP).await;
    let shown = b
        .js(
            "return [...document.querySelectorAll('#env-actions button, #nav-new')].filter(e => e.offsetParent !== null).length",
            json!([]),
        )
        .await;
    assert_eq!(shown, json!(0), "no action is offered on a standby");
    b.screenshot("12-standby-read-only").await;
    drop(b);
    drop(d);
}

async fn wait_text(b: &Browser, css: &str, want: &str) {
    text_where(b, css, |t| t == want).await;
}

/// The text of `css` once `holds` accepts it, waiting up to `STEP`.
async fn text_where(b: &Browser, css: &str, holds: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    loop {
        let got = b.text(css).await;
        if holds(&got) {
            return got;
        }
        assert!(
            started.elapsed() < STEP,
            "{css}: {got:?} is not what was awaited within {STEP:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

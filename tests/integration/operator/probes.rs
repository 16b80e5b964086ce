//! The operator's own listener (`--metrics-listen`) on a running operator: `/healthz` answers
//! from the start, `/readyz` once it leads (a Lease) and has listed, and `/metrics` counts the
//! reconciles and requests an Environment causes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envbridge::operator::metrics::Metrics;
use envbridge::operator::requests::RequestCount;
use envbridge::plan::ControlMode;
use envbridge::state::State;
use tokio_util::sync::CancellationToken;

use super::{
    Res, Running, WAIT, args, deploy, destroy, finish, fixture, operator_config, state_is,
    task_ref, wait_env,
};

/// One HTTP/1.0 GET: the status line, headers and body as text.
async fn get(addr: SocketAddr, path: &str) -> Res<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// The value of the sample `series` (name and labels exactly as exposed), 0 when absent.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_serves_its_reconciles_and_leadership_on_its_own_listener() -> Res {
    let fx = fixture("probes").await?;
    let count = Arc::new(RequestCount::default());
    let config = operator_config(&fx.kubeconfig).await?;
    let client = envbridge::launch::client::observed(
        config,
        count.clone(),
        envbridge::launch::in_flight::IN_FLIGHT,
    )?;
    let metrics = Arc::new(Metrics::new(count));
    let stop = CancellationToken::new();
    let (addr, served) = envbridge::operator::http::listen(
        "127.0.0.1:0".parse()?,
        metrics.clone(),
        stop.child_token(),
    )
    .await?;

    // Before any leadership: alive, not ready, and saying why.
    let health = get(addr, "/healthz").await?;
    assert!(
        health.starts_with("HTTP/1.0 200") && health.ends_with("ok\n"),
        "{health}"
    );
    let ready = get(addr, "/readyz").await?;
    assert!(
        ready.starts_with("HTTP/1.0 503") && ready.contains("standby"),
        "{ready}"
    );

    let lease = fx.ns.clone();
    let op = Running {
        stop: stop.clone(),
        handle: tokio::spawn(envbridge::operator::run_with_metrics(
            client,
            args(&fx.ns, Some(&lease)),
            stop.clone(),
            metrics.clone(),
        )),
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let ready = get(addr, "/readyz").await?;
        if ready.starts_with("HTTP/1.0 200") {
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {ready}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let env_reconciles = "envbridge_operator_reconciles_total{controller=\"environment\"}";
    let task_reconciles = "envbridge_operator_reconciles_total{controller=\"task\"}";
    let before = get(addr, "/metrics").await?;
    assert_eq!(value(&before, "envbridge_operator_leader"), 1.0, "{before}");

    deploy(
        &fx,
        "em",
        &[task_ref("em", "flp001", "readout", 1, ControlMode::Basic)],
        true,
    )
    .await?;
    wait_env(&fx, "em", "STANDBY", state_is(State::Standby)).await?;
    let after = get(addr, "/metrics").await?;
    assert!(
        after.contains("content-type: text/plain; version=0.0.4"),
        "{after}"
    );
    assert!(
        value(&after, env_reconciles) > value(&before, env_reconciles),
        "the Environment was reconciled: {after}"
    );
    assert!(value(&after, task_reconciles) >= 1.0, "{after}");
    assert_eq!(
        value(&after, "envbridge_operator_tasks{state=\"STANDBY\"}"),
        1.0,
        "{after}"
    );
    assert!(
        value(
            &after,
            "envbridge_operator_apiserver_requests_total{verb=\"create\",kind=\"pods\"}"
        ) >= 1.0,
        "{after}"
    );
    println!("{after}");

    destroy(&fx, "em").await?;
    op.stop().await?;
    tokio::time::timeout(WAIT, served).await??;
    finish(fx).await
}

//! The operator's own listener (`--metrics-listen`, default 127.0.0.1:9465): `/metrics`
//! (Prometheus text, the families of [`super::metrics`]), `/healthz` (the process's runtime
//! answers) and `/readyz` (this replica leads and its controllers run). A standby is alive but
//! not ready: with two replicas, a Service in front of them routes to the leader only.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::metrics::{CONTENT_TYPE, Metrics, Sample};
use super::{Error, Result};

pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(metrics)
}

/// Binds `addr` (port 0 picks a free one) and serves [`router`] until `stop`; returns where it
/// listens. Beyond loopback only when asked for: the answers carry no secret, but they are
/// served without authentication.
pub async fn listen(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listen_error = |source| Error::Listen { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(listen_error)?;
    let bound = listener.local_addr().map_err(listen_error)?;
    if !bound.ip().is_loopback() {
        tracing::warn!(addr = %bound, "/metrics, /healthz and /readyz are served without authentication beyond loopback");
    }
    let handle = tokio::spawn(async move {
        let served = axum::serve(listener, router(metrics))
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "metrics listener failed");
        }
    });
    tracing::info!(addr = %bound, "serving /metrics, /healthz, /readyz");
    Ok((bound, handle))
}

/// Ready: this replica leads (holds the lease, or runs without election), its controllers
/// run and every watch has listed. Otherwise the one-line reason why not.
pub fn readiness(leading: bool, running: Option<&Sample>) -> Result<(), &'static str> {
    match running {
        _ if !leading => Err("standby: this replica does not hold the leadership lease"),
        None => Err("leader, but the controllers are not running (yet)"),
        Some(s) if !s.listed => Err("leader, but the watches have not listed yet"),
        Some(_) => Ok(()),
    }
}

async fn scrape(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], m.encode())
}

/// Answered by the process's runtime: if it answers, it is alive (a standby too).
async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    match readiness(m.leading(), m.sample().as_ref()) {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_leading_with_listed_controllers() {
        let listed = Sample {
            listed: true,
            ..Sample::default()
        };
        let listing = Sample::default();
        assert_eq!(readiness(true, Some(&listed)), Ok(()));
        let standby = readiness(false, None).unwrap_err();
        assert!(standby.starts_with("standby"), "{standby}");
        // Leadership lost while the controllers still stop: not ready any more.
        assert!(readiness(false, Some(&listed)).is_err());
        assert!(readiness(true, None).unwrap_err().contains("not running"));
        assert!(
            readiness(true, Some(&listing))
                .unwrap_err()
                .contains("listed")
        );
        for why in [
            readiness(false, None),
            readiness(true, None),
            readiness(true, Some(&listing)),
        ] {
            assert!(!why.unwrap_err().contains('\n'), "one line");
        }
    }

    #[tokio::test]
    async fn the_listener_answers_metrics_healthz_and_readyz() {
        let metrics = Arc::new(Metrics::default());
        let stop = CancellationToken::new();
        let (addr, served) = listen(([127, 0, 0, 1], 0).into(), metrics.clone(), stop.clone())
            .await
            .expect("listen");
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        let health = get("/healthz").await;
        assert!(
            health.starts_with("HTTP/1.0 200") && health.ends_with("ok\n"),
            "{health}"
        );
        let ready = get("/readyz").await;
        assert!(
            ready.starts_with("HTTP/1.0 503") && ready.contains("standby"),
            "{ready}"
        );
        metrics.set_leading(true);
        let _running = metrics.attach(Box::new(|| {
            Some(Sample {
                listed: true,
                ..Sample::default()
            })
        }));
        let ready = get("/readyz").await;
        assert!(ready.starts_with("HTTP/1.0 200"), "{ready}");
        let text = get("/metrics").await;
        assert!(text.contains("text/plain; version=0.0.4"), "{text}");
        assert!(text.contains("\nenvbridge_operator_leader 1\n"), "{text}");
        stop.cancel();
        served.await.expect("stops");
    }
}

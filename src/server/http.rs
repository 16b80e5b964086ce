//! /metrics (Prometheus text format), /healthz (liveness: a standby still serves reads) and
//! /readyz (write traffic: only the leader that has listed the cluster).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::bridge::Bridge;

pub fn router(bridge: Arc<Bridge>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(bridge)
}

async fn metrics(State(b): State<Arc<Bridge>>) -> impl IntoResponse {
    let sizes = b.roster.sizes();
    b.metrics.roster_environments.set(sizes.environments as i64);
    b.metrics.roster_tasks.set(sizes.tasks as i64);
    b.metrics
        .roster_task_bytes
        .set(b.roster.task_heap_bytes() as i64);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        b.metrics.encode(),
    )
}

/// 200 once the roster has been listed from the cluster; 503 before.
async fn healthz(State(b): State<Arc<Bridge>>) -> impl IntoResponse {
    let synced = b.synced.all();
    let body = serde_json::json!({ "synced": synced, "leader": b.is_leader() }).to_string();
    let code = if synced {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, [(header::CONTENT_TYPE, "application/json")], body)
}

/// 200 when this replica takes writes: it holds the leader lease and its roster is listed.
async fn readyz(State(b): State<Arc<Bridge>>) -> impl IntoResponse {
    let (synced, leader) = (b.synced.all(), b.is_leader());
    let body = serde_json::json!({ "synced": synced, "leader": leader }).to_string();
    let code = if synced && leader {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, [(header::CONTENT_TYPE, "application/json")], body)
}

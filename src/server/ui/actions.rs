//! The page's actions. Each calls the gRPC service's own handler with the session's caller
//! in the request, exactly as a gRPC call's interceptor would: the role checks, the
//! validation, the standby refusal and the audit are the API's, and a refusal is shown in
//! its words.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{Ui, UiError};
use crate::server::auth::Caller;
use crate::server::pb;
use crate::server::pb::env_bridge_server::EnvBridge;

/// A gRPC request as the interceptor leaves it: the caller in its extensions.
fn as_caller<T>(caller: &Caller, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.extensions_mut().insert(caller.clone());
    r
}

#[derive(Deserialize)]
pub struct CreateForm {
    workflow: String,
    #[serde(default)]
    variables: HashMap<String, String>,
    #[serde(default)]
    env_id: String,
}

#[derive(Serialize)]
struct Created {
    id: String,
    tasks: u32,
    nodes: u32,
    created: bool,
}

/// Creates without waiting: the page follows the deployment live.
pub async fn create(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Json(f): Json<CreateForm>,
) -> Result<Response, UiError> {
    let caller = ui.acting_caller(&headers)?;
    let reply = ui
        .api
        .create_environment(as_caller(
            &caller,
            pb::CreateEnvironmentRequest {
                workflow: f.workflow,
                variables: f.variables,
                env_id: f.env_id.trim().to_string(),
                wait: false,
                ..Default::default()
            },
        ))
        .await
        .map_err(UiError::Api)?
        .into_inner();
    Ok(Json(Created {
        id: reply.id,
        tasks: reply.tasks,
        nodes: reply.nodes,
        created: reply.created,
    })
    .into_response())
}

#[derive(Deserialize)]
pub struct TransitionForm {
    event: String,
    #[serde(default)]
    run_number: Option<u64>,
    #[serde(default)]
    run_type: Option<String>,
}

#[derive(Serialize)]
struct TransitionDone {
    ok: bool,
    event: String,
    target: String,
    outcome: String,
    message: String,
    elapsed_ms: u64,
    failures: Vec<pb::Failure>,
    warnings: Vec<pb::Failure>,
}

/// A transition, awaited (the page shows its progress from the live feed meanwhile). START
/// takes the run number (required, as the anchor's START needs one) and the run type.
pub async fn transition(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(f): Json<TransitionForm>,
) -> Result<Response, UiError> {
    let caller = ui.acting_caller(&headers)?;
    let mut arguments = HashMap::new();
    if f.event.eq_ignore_ascii_case("START") {
        let n = f
            .run_number
            .filter(|n| *n > 0)
            .ok_or_else(|| UiError::BadRequest("START needs a run number (> 0)".into()))?;
        arguments.insert("run_number".to_string(), n.to_string());
    }
    if let Some(t) = f
        .run_type
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
    {
        arguments.insert("run_type".to_string(), t);
    }
    let r = ui
        .api
        .transition(as_caller(
            &caller,
            pb::TransitionRequest {
                id,
                event: f.event.to_ascii_uppercase(),
                arguments,
                wait: true,
                ..Default::default()
            },
        ))
        .await
        .map_err(UiError::Api)?
        .into_inner();
    Ok(Json(TransitionDone {
        ok: r.ok,
        event: r.event,
        target: r.target_state,
        outcome: r.outcome,
        message: r.message,
        elapsed_ms: r.elapsed_ms,
        failures: r.failures,
        warnings: r.warnings,
    })
    .into_response())
}

/// Destroys and waits until the tasks and pods are gone.
pub async fn destroy(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, UiError> {
    let caller = ui.acting_caller(&headers)?;
    let r = ui
        .api
        .destroy_environment(as_caller(
            &caller,
            pb::DestroyEnvironmentRequest {
                id,
                wait: true,
                timeout_seconds: 0,
            },
        ))
        .await
        .map_err(UiError::Api)?
        .into_inner();
    Ok(Json(serde_json::json!({ "gone": r.gone, "message": r.message })).into_response())
}

#[derive(Deserialize)]
pub struct KillForm {
    task: String,
}

pub async fn kill(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(f): Json<KillForm>,
) -> Result<Response, UiError> {
    let caller = ui.acting_caller(&headers)?;
    let r = ui
        .api
        .kill_task(as_caller(
            &caller,
            pb::KillTaskRequest {
                id,
                task: f.task,
                timeout_seconds: 0,
            },
        ))
        .await
        .map_err(UiError::Api)?
        .into_inner();
    Ok(Json(serde_json::json!({ "gone": r.gone })).into_response())
}

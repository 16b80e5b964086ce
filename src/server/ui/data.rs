//! What the page reads besides the live feed: who is logged in, the workflows with their
//! public variables (the create form), and a task's story from the cluster.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{Ui, UiError, live, slots};
use crate::crd::Task;

#[derive(Deserialize)]
pub struct EventsQuery {
    env: Option<String>,
}

/// How long reading one Task for its story may take.
const STORY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// The live feed (401 without a session, not a redirect: an EventSource follows none).
pub async fn events(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<EventsQuery>,
) -> Result<Response, UiError> {
    let (session, _) = ui.session(&headers).ok_or(UiError::NoSession)?;
    // An environment the roster does not hold (yet) is followed until it appears.
    if q.env.as_ref().is_some_and(|e| e.len() > 253) {
        return Err(UiError::BadRequest(
            "env: an environment id or name is at most 253 characters".into(),
        ));
    }
    let env = q.env.filter(|e| !e.is_empty());
    let slot = ui.streams.take(&session).map_err(|full| match full {
        slots::Full::All(n) => UiError::Busy(n),
        slots::Full::Session(n) => UiError::SessionBusy(n),
    })?;
    Ok(live::stream(ui.clone(), session, env, slot).into_response())
}

pub async fn me(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Result<Response, UiError> {
    let caller = ui.caller(&headers)?;
    Ok(Json(serde_json::json!({
        "name": caller.name,
        "role": caller.role.to_string(),
        "leader": ui.bridge.is_leader(),
    }))
    .into_response())
}

#[derive(Serialize)]
pub struct WorkflowForm {
    name: String,
    /// Why its variables could not be read (the create still reports it in full).
    error: Option<String>,
    vars: Vec<VarForm>,
}

/// One public variable with the anchor's metadata as written (label, description, type,
/// widget, values, panel, index, visibleif, ...).
#[derive(Serialize)]
pub struct VarForm {
    name: String,
    default: Option<String>,
    fields: std::collections::BTreeMap<String, serde_json::Value>,
}

/// The workflows of the workflows directory, each with its public variables.
pub async fn workflows(State(ui): State<Arc<Ui>>, headers: HeaderMap) -> Result<Response, UiError> {
    ui.caller(&headers)?;
    let cfg = ui.bridge.cfg.clone();
    let list = tokio::task::spawn_blocking(move || crate::bridge::templates::list(&cfg))
        .await
        .map_err(|e| UiError::Workflows(e.to_string()))?
        .map_err(|e| UiError::Workflows(e.to_string()))?;
    Ok(Json(list.into_iter().map(form_of).collect::<Vec<_>>()).into_response())
}

fn form_of(t: crate::bridge::templates::TemplateInfo) -> WorkflowForm {
    WorkflowForm {
        name: t.name,
        error: t.error,
        vars: t
            .vars
            .into_iter()
            .filter(|d| d.meta.public)
            .map(|d| VarForm {
                name: d.name.to_string(),
                default: d.default,
                fields: d.meta.fields,
            })
            .collect(),
    }
}

/// A task's story: its status as the operator wrote it, with the last log lines and the
/// pod's events of a failed process.
#[derive(Serialize)]
pub struct Story {
    name: String,
    node: String,
    class: String,
    path: String,
    state: String,
    message: String,
    last_log: String,
    pod_events: Vec<String>,
    control_port: u16,
}

pub async fn story(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path((id, task)): Path<(String, String)>,
) -> Result<Response, UiError> {
    ui.caller(&headers)?;
    let env = ui
        .bridge
        .resolve(&id)
        .map_err(|e| UiError::NotFound(e.to_string()))?;
    // Only a task of this environment: the name is checked against the roster first.
    if ui.bridge.roster.task(&env.key, &task).is_none() {
        return Err(UiError::NotFound(format!(
            "task {task:?} not found in environment {id}"
        )));
    }
    let api: kube::Api<Task> = kube::Api::namespaced(ui.bridge.client.clone(), &env.key.namespace);
    // Bounded: a slow apiserver makes this one answer fail, not hang the page.
    let t = tokio::time::timeout(STORY_DEADLINE, api.get_opt(&task))
        .await
        .map_err(|_| UiError::Kube(format!("no answer within {STORY_DEADLINE:?}")))?
        .map_err(|e| UiError::Kube(e.to_string()))?
        .ok_or_else(|| UiError::NotFound(format!("task {task:?} is gone")))?;
    let s = t.status.clone().unwrap_or_default();
    Ok(Json(Story {
        name: task,
        node: t.spec.task.node.clone(),
        class: t.spec.task.class.clone(),
        path: t.spec.task.path.to_string(),
        state: s.state.map(|x| x.to_string()).unwrap_or_default(),
        message: s.message.unwrap_or_default(),
        last_log: s.last_log.unwrap_or_default(),
        pod_events: s.pod_events,
        control_port: t.spec.task.control_port,
    })
    .into_response())
}

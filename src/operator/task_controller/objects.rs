//! A task's cluster objects: its pod (created on the resolved node) and headless Service,
//! and what the stores show of them.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::debug;

use super::outcome::{Step, fail};
use crate::crd::{Task, TaskStatus};
use crate::operator::context::Ctx;
use crate::operator::names::{service_name, task_annotations};
use crate::operator::pod::build_pod;
use crate::operator::pod_status::PodView;
use crate::operator::service::{build_service, service_matches};
use crate::operator::stored_pod::StoredPod;
use crate::operator::{Error, FIELD_MANAGER, Result, unread};
use crate::state::State;

/// Pod annotation: the transition id a hook task's pod runs for.
pub const HOOK_RUN: &str = "envbridge.dev/hook-run";

pub(super) const POD: &str = "Pod";
pub(super) const SERVICE: &str = "Service";
pub(super) const POD_DELETION: &str = "Pod deletion";
pub(super) const SERVICE_DELETION: &str = "Service deletion";

/// Time left to wait when this operator sent the request `what` for the task moments ago.
pub(super) fn awaiting_store(ctx: &Ctx, what: &'static str, task_uid: &str) -> Option<Duration> {
    ctx.awaiting_store(what, task_uid)
}

pub(super) fn pod_age(pod: &StoredPod) -> Duration {
    match pod.metadata.creation_timestamp.as_ref() {
        Some(t) => {
            Duration::try_from(jiff::Timestamp::now().duration_since(t.0)).unwrap_or_default()
        }
        None => Duration::ZERO,
    }
}

pub(super) fn running_for(pod: &StoredPod) -> Duration {
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .or(pod.metadata.creation_timestamp.as_ref())
        .map(|t| t.0);
    match started {
        Some(t) => Duration::try_from(jiff::Timestamp::now().duration_since(t)).unwrap_or_default(),
        None => Duration::ZERO,
    }
}

pub(super) async fn create_pod(
    task: &Task,
    ctx: &Ctx,
    st: &mut TaskStatus,
    step: &mut Step,
    labels: &std::collections::BTreeMap<String, String>,
    hook_run: Option<&str>,
) -> Result<()> {
    let ns = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let tref = &task.spec.task;
    let mut annotations = task_annotations(tref);
    if let Some(run) = hook_run {
        annotations.insert(HOOK_RUN.into(), run.into());
    }
    let node = match ctx.node_index.resolve(&tref.node) {
        Ok(n) => n,
        Err(e) => {
            fail(st, task, e.to_string());
            // Nodes may appear later: look again from time to time.
            step.action = Some(Action::requeue(Duration::from_secs(15)));
            return Ok(());
        }
    };
    let Some(template) = ctx.templates.get(&ObjectRef::new(&tref.template)) else {
        fail(
            st,
            task,
            format!("TaskTemplate {:?} not found", tref.template),
        );
        step.action = Some(Action::requeue(Duration::from_secs(15)));
        return Ok(());
    };
    let pod = match build_pod(
        task,
        &tref.template,
        &template.spec,
        &node,
        labels,
        &annotations,
        &ctx.pod_settings,
    ) {
        Ok(p) => p,
        Err(e) => {
            fail(st, task, e.to_string());
            step.action = Some(Action::requeue(Duration::from_secs(30)));
            return Ok(());
        }
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match unread::create(&api, &pp, &pod).await {
        Ok(()) => debug!(task = %name, %node, "pod created"),
        // Created before (store lag, or by an earlier operator run): re-attached, never duplicated.
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(Error::kube("create", "Pod", &ns, &name, e)),
    }
    ctx.requested.insert(
        (POD, task.uid().unwrap_or_default()),
        std::time::Instant::now(),
    );
    if st.state == Some(State::Error) && st.message.is_some() {
        // An earlier node or template problem is solved now.
        st.state = None;
        st.message = None;
    }
    // The pod's own events bring the next reconcile, which writes the status (one write
    // per task instead of two while pods start).
    step.write_status = st.state.is_none() && task.status.is_some();
    if step.write_status {
        st.state = Some(State::Deploying);
        st.node_name = Some(node);
    }
    step.action = Some(Action::requeue(Duration::from_secs(60)));
    Ok(())
}

pub(super) async fn ensure_service(
    task: &Task,
    ctx: &Ctx,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    let ns = task.namespace().unwrap_or_default();
    let port = ctx.args.headless_discovery_port;
    let sname = service_name(&task.name_any());
    let key = (SERVICE, task.uid().unwrap_or_default());
    if let Some(svc) = ctx.services.get(&ObjectRef::new(&sname).within(&ns)) {
        ctx.requested.remove(&key);
        if service_matches(&svc, port) {
            return Ok(());
        }
    } else if awaiting_store(ctx, SERVICE, &key.1).is_some() {
        return Ok(());
    }
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let svc = build_service(task, labels, port);
    let exists = ctx
        .services
        .get(&ObjectRef::new(&sname).within(&ns))
        .is_some();
    let res = if exists {
        let mut body = serde_json::to_value(&svc).unwrap_or_default();
        body["apiVersion"] = json!("v1");
        body["kind"] = json!("Service");
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        unread::patch(&api, &sname, &pp, &Patch::Apply(&body)).await
    } else {
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        unread::create(&api, &pp, &svc).await
    };
    match res {
        Ok(()) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(Error::kube("write", "Service", &ns, &sname, e)),
    }
    if !exists {
        ctx.requested.insert(key, std::time::Instant::now());
    }
    Ok(())
}

/// What the Task's status shows of its pod: phase, IP and node.
pub(super) fn record_pod(st: &mut TaskStatus, view: &PodView, pod: &StoredPod) {
    st.pod_phase = Some(view.phase.clone());
    st.pod_ip = view.ip.clone();
    st.node_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .or(st.node_name.take());
}

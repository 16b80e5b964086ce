//! The EnvBridge gRPC service: thin glue from requests to the bridge and the roster.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::auth::{Caller, Role};
use super::convert::{self, status};
use super::pb;
use crate::bridge::audit::Audit;
use crate::bridge::transition::TransitionCall;
use crate::bridge::{Bridge, CreateSpec};
use crate::roster::{Change, EnvKey, Outcome};
use crate::state::{Event, State};

pub struct Api {
    pub bridge: Arc<Bridge>,
}

/// The longest wait a call may ask for (a create, a transition, a destroy).
pub const MAX_WAIT: Duration = Duration::from_secs(900);

fn secs(s: u32) -> Option<Duration> {
    (s > 0).then(|| Duration::from_secs(u64::from(s)).min(MAX_WAIT))
}

/// Creates an environment and audits the create, whichever API asked for it.
pub(super) async fn create_audited(
    bridge: &Bridge,
    caller: &Caller,
    spec: &CreateSpec,
    target: &str,
) -> Result<crate::bridge::deploy::Created, Status> {
    let created = bridge.create(spec).await.map_err(status);
    let env = created
        .as_ref()
        .ok()
        .map(|c| (c.namespace.clone(), c.name.clone()));
    audit(bridge, caller, "create", target, env.as_ref(), &created).await;
    created
}

/// Audits a write: `outcome` is `ok...` or the error.
pub(super) async fn audit<T>(
    bridge: &Bridge,
    caller: &Caller,
    action: &str,
    target: &str,
    env: Option<&(String, String)>,
    result: &Result<T, Status>,
) {
    let outcome = match result {
        Ok(_) => "ok".to_string(),
        Err(s) => format!("refused: {}", s.message()),
    };
    let role = caller.role.to_string();
    bridge
        .audit(
            &Audit {
                caller: &caller.name,
                role: &role,
                action,
                target,
                outcome: &outcome,
            },
            env.map(|(n, m)| (n.as_str(), m.as_str())),
        )
        .await;
}

/// The environment an id names, for the audit trail (None when it names none).
fn env_of(bridge: &Bridge, id: &str) -> Option<(String, String)> {
    bridge
        .resolve(id)
        .ok()
        .map(|e| (e.key.namespace.to_string(), e.key.name.to_string()))
}

fn opt(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::RosterEvent, Status>> + Send>>;

#[tonic::async_trait]
impl pb::env_bridge_server::EnvBridge for Api {
    async fn create_environment(
        &self,
        req: Request<pb::CreateEnvironmentRequest>,
    ) -> Result<Response<pb::CreateEnvironmentReply>, Status> {
        let caller = Caller::require(&req, Role::Operator, "create environments")?;
        let r = req.into_inner();
        let target = format!("{} {:?}", r.workflow, r.variables);
        let spec = CreateSpec {
            workflow: r.workflow,
            variables: r.variables.into_iter().collect(),
            idempotency_key: opt(r.idempotency_key),
            env_id: opt(r.env_id),
            site_variables: caller.role == Role::Admin,
        };
        let c = create_audited(&self.bridge, &caller, &spec, &target).await?;
        let mut reply = pb::CreateEnvironmentReply {
            id: c.id,
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            nodes: c.nodes,
            tasks: c.tasks,
            created: c.created,
            ..Default::default()
        };
        if r.wait {
            let key = EnvKey::new(&c.namespace, &c.name);
            let timeout = secs(r.timeout_seconds).unwrap_or(self.bridge.cfg.deploy_timeout);
            let out = self
                .bridge
                .roster
                .wait_state(&key, State::Standby, tokio::time::Instant::now() + timeout)
                .await;
            fill_outcome(
                out,
                &mut reply.outcome,
                &mut reply.message,
                &mut reply.failures,
                &mut reply.warnings,
            );
        }
        Ok(Response::new(reply))
    }

    async fn list_environments(
        &self,
        req: Request<pb::ListEnvironmentsRequest>,
    ) -> Result<Response<pb::ListEnvironmentsReply>, Status> {
        Caller::require(&req, Role::Viewer, "list environments")?;
        let r = &self.bridge.roster;
        let environments = r
            .envs()
            .iter()
            .map(|e| convert::environment(r, e, false))
            .collect();
        Ok(Response::new(pb::ListEnvironmentsReply { environments }))
    }

    async fn get_environment(
        &self,
        req: Request<pb::GetEnvironmentRequest>,
    ) -> Result<Response<pb::Environment>, Status> {
        Caller::require(&req, Role::Viewer, "read environments")?;
        let e = self.bridge.resolve(&req.into_inner().id).map_err(status)?;
        Ok(Response::new(convert::environment(
            &self.bridge.roster,
            &e,
            true,
        )))
    }

    async fn transition(
        &self,
        req: Request<pb::TransitionRequest>,
    ) -> Result<Response<pb::TransitionReply>, Status> {
        let caller = Caller::require(&req, Role::Operator, "run transitions")?;
        let r = req.into_inner();
        let event = match r.event.as_str() {
            "" => None,
            e => Some(
                e.parse::<Event>()
                    .map_err(|e| Status::invalid_argument(e.to_string()))?,
            ),
        };
        let call = TransitionCall {
            env: r.id,
            event,
            arguments: r.arguments.into_iter().collect::<BTreeMap<_, _>>(),
            wait: r.wait,
            timeout: secs(r.timeout_seconds),
            transition_id: opt(r.transition_id),
        };
        let env = env_of(&self.bridge, &call.env);
        let target = format!("{} {} {:?}", call.env, r.event, call.arguments);
        let res = self.bridge.transition(&call).await.map_err(status);
        audit(
            &self.bridge,
            &caller,
            "transition",
            &target,
            env.as_ref(),
            &res,
        )
        .await;
        let res = res?;
        let mut reply = pb::TransitionReply {
            transition_id: res.id.clone(),
            event: res.event.to_string(),
            target_state: res.target.to_string(),
            ok: res.ok(),
            outcome: "requested".into(),
            elapsed_ms: res.elapsed.as_millis() as u64,
            ..Default::default()
        };
        if let Some(out) = res.outcome {
            if let Ok(Outcome::Reached { tasks, .. }) = &out {
                reply.tasks = *tasks as u32;
            }
            fill_outcome(
                out,
                &mut reply.outcome,
                &mut reply.message,
                &mut reply.failures,
                &mut reply.warnings,
            );
        }
        Ok(Response::new(reply))
    }

    async fn destroy_environment(
        &self,
        req: Request<pb::DestroyEnvironmentRequest>,
    ) -> Result<Response<pb::DestroyEnvironmentReply>, Status> {
        let caller = Caller::require(&req, Role::Operator, "destroy environments")?;
        let r = req.into_inner();
        let env = env_of(&self.bridge, &r.id);
        // Audited before: the Environment (and its Events) may be gone after.
        audit(
            &self.bridge,
            &caller,
            "destroy",
            &r.id,
            env.as_ref(),
            &Ok::<(), Status>(()),
        )
        .await;
        let gone = self
            .bridge
            .destroy(&r.id, r.wait, secs(r.timeout_seconds))
            .await
            .map_err(status)?;
        let message = match (r.wait, gone) {
            (false, _) => "deletion requested".to_string(),
            (true, true) => "environment, tasks and pods are gone".to_string(),
            (true, false) => "timed out waiting for tasks and pods to be gone".to_string(),
        };
        Ok(Response::new(pb::DestroyEnvironmentReply {
            gone: r.wait && gone,
            message,
        }))
    }

    async fn kill_task(
        &self,
        req: Request<pb::KillTaskRequest>,
    ) -> Result<Response<pb::KillTaskReply>, Status> {
        let caller = Caller::require(&req, Role::Operator, "kill tasks")?;
        let r = req.into_inner();
        let env = env_of(&self.bridge, &r.id);
        let gone = self
            .bridge
            .kill_task(&r.id, &r.task, secs(r.timeout_seconds))
            .await
            .map_err(status);
        audit(
            &self.bridge,
            &caller,
            "kill",
            &format!("{} {}", r.id, r.task),
            env.as_ref(),
            &gone,
        )
        .await;
        let gone = gone?;
        Ok(Response::new(pb::KillTaskReply { gone }))
    }

    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        req: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        Caller::require(&req, Role::Viewer, "watch events")?;
        let r = req.into_inner();
        let roster = self.bridge.roster.clone();
        let filter = match r.id.as_str() {
            "" => None,
            id => Some(self.bridge.resolve(id).map_err(status)?.key.clone()),
        };
        let mut rx = roster.subscribe();
        let (tx, out) = mpsc::channel::<Result<pb::RosterEvent, Status>>(1024);
        let snapshot = r.snapshot;
        tokio::spawn(async move {
            let send_snapshot = |tx: mpsc::Sender<_>| {
                let roster = roster.clone();
                let filter = filter.clone();
                async move {
                    for e in roster
                        .envs()
                        .iter()
                        .filter(|e| filter.as_ref().is_none_or(|f| *f == e.key))
                    {
                        let ev = env_event("env-applied", convert::environment(&roster, e, false));
                        if tx.send(Ok(ev)).await.is_err() {
                            return false;
                        }
                        for t in roster.tasks_of(&e.key) {
                            if tx
                                .send(Ok(task_event("task-applied", &t.env, convert::task(&t))))
                                .await
                                .is_err()
                            {
                                return false;
                            }
                        }
                    }
                    true
                }
            };
            if snapshot && !send_snapshot(tx.clone()).await {
                return;
            }
            loop {
                let change = match rx.recv().await {
                    Ok(c) => c,
                    Err(RecvError::Lagged(n)) => {
                        // Too slow a reader: tell it, then give it the whole view again.
                        let reset = pb::RosterEvent {
                            kind: format!("lagged:{n}"),
                            ..Default::default()
                        };
                        if tx.send(Ok(reset)).await.is_err() || !send_snapshot(tx.clone()).await {
                            return;
                        }
                        continue;
                    }
                    Err(RecvError::Closed) => return,
                };
                let ev = match change {
                    Change::EnvApplied(e) if filter.as_ref().is_none_or(|f| *f == e.key) => {
                        env_event("env-applied", convert::environment(&roster, &e, false))
                    }
                    Change::EnvDeleted(k) if filter.as_ref().is_none_or(|f| *f == k) => {
                        pb::RosterEvent {
                            kind: "env-deleted".into(),
                            namespace: k.namespace.to_string(),
                            env_name: k.name.to_string(),
                            ..Default::default()
                        }
                    }
                    Change::TaskApplied(t) if filter.as_ref().is_none_or(|f| *f == t.env) => {
                        task_event("task-applied", &t.env, convert::task(&t))
                    }
                    Change::TaskDeleted { env, name }
                        if filter.as_ref().is_none_or(|f| *f == env) =>
                    {
                        pb::RosterEvent {
                            kind: "task-deleted".into(),
                            namespace: env.namespace.to_string(),
                            env_name: env.name.to_string(),
                            task_name: name.to_string(),
                            ..Default::default()
                        }
                    }
                    Change::Reset(kind) => pb::RosterEvent {
                        kind: format!("reset:{kind:?}"),
                        ..Default::default()
                    },
                    _ => continue,
                };
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }
}

fn env_event(kind: &str, e: pb::Environment) -> pb::RosterEvent {
    pb::RosterEvent {
        kind: kind.into(),
        namespace: e.namespace.clone(),
        env_name: e.name.clone(),
        environment: Some(e),
        ..Default::default()
    }
}

fn task_event(kind: &str, env: &EnvKey, t: pb::Task) -> pb::RosterEvent {
    pb::RosterEvent {
        kind: kind.into(),
        namespace: env.namespace.to_string(),
        env_name: env.name.to_string(),
        task_name: t.name.clone(),
        task: Some(t),
        ..Default::default()
    }
}

/// Failures and warnings listed in one reply, at most (as in `Environment.status`).
const LISTED: usize = 100;

fn fill_outcome(
    out: Result<Outcome, crate::roster::Progress>,
    outcome: &mut String,
    message: &mut String,
    failures: &mut Vec<pb::Failure>,
    warnings: &mut Vec<pb::Failure>,
) {
    match out {
        Ok(Outcome::Reached { tasks, warnings: w }) => {
            *outcome = "reached".into();
            *message = format!("{tasks} task(s) reached the target");
            *warnings = w.iter().take(LISTED).map(convert::failure).collect();
        }
        Ok(Outcome::Failed {
            message: m,
            failures: f,
            warnings: w,
        }) => {
            *outcome = "failed".into();
            *message = m;
            // The message counts them all; the lists are capped as the Environment's are.
            *failures = f.iter().take(LISTED).map(convert::failure).collect();
            *warnings = w.iter().take(LISTED).map(convert::failure).collect();
        }
        Err(p) => {
            *outcome = "timeout".into();
            *message = format!(
                "timed out: {}/{} task(s) in the target state",
                p.in_target, p.expected
            );
            if let Some(m) = p.message.filter(|m| !m.is_empty()) {
                message.push_str(&format!(" ({m})"));
            }
        }
    }
}

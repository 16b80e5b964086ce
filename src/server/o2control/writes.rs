//! The o2control methods that change something (NewEnvironment, NewEnvironmentAsync,
//! ControlEnvironment, DestroyEnvironment) over the bridge's own create, transition and
//! destroy: the same caller-variable boundary, the same audit trail (the caller as the
//! listener's role, `requestUser` as a claim).

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use prost::Message;
use tonic::Status;

use super::caller;
use super::info;
use super::pb::o2control as pb;
use super::service::Control;
use super::state_map;
use crate::bridge::deploy::Created;
use crate::bridge::transition::TransitionCall;
use crate::bridge::{Bridge, CreateSpec};
use crate::roster::{EnvKey, Outcome};
use crate::server::api::{audit, create_audited};
use crate::server::auth::Caller;
use crate::server::convert::{self, millis};
use crate::state::{Event, State};

use pb::control_environment_request::Optype;

/// What a create asks for, whichever o2control method it came by.
pub(super) struct NewRequest<'a> {
    pub workflow_template: &'a str,
    pub vars: &'a std::collections::HashMap<String, String>,
    pub request_user: Option<&'a super::pb::common::User>,
}

/// The workflow a `workflowTemplate` names: `NAME`, or the anchor's
/// `REPO/workflows/NAME[@REVISION]` (the GUI's form). envbridge has one repository, its
/// workflows directory: the repository and revision parts are accepted and not used.
pub fn workflow_name(template: &str) -> Result<String, Status> {
    let t = template.trim();
    let t = t.split_once('@').map_or(t, |(w, _rev)| w);
    let name = match t.rsplit_once("/workflows/") {
        Some((_repo, name)) => name,
        None => t,
    };
    let name = name.strip_suffix(".yaml").unwrap_or(name);
    if name.is_empty() || name.contains('/') {
        return Err(Status::invalid_argument(format!(
            "workflowTemplate {template:?}: give NAME or REPO/workflows/NAME@REVISION"
        )));
    }
    Ok(name.to_string())
}

/// envbridge's event for an anchor ControlEnvironment type.
pub fn event_of(t: i32) -> Result<Event, Status> {
    match Optype::try_from(t) {
        Ok(Optype::Configure) => Ok(Event::Configure),
        Ok(Optype::StartActivity) => Ok(Event::Start),
        Ok(Optype::StopActivity) => Ok(Event::Stop),
        Ok(Optype::Reset) => Ok(Event::Reset),
        Ok(Optype::GoError) => Ok(Event::GoError),
        Ok(Optype::Deploy) => Err(Status::failed_precondition(
            "DEPLOY: an environment is deployed when it is created (NewEnvironment); it is DEPLOYED once its tasks are up",
        )),
        Ok(Optype::Noop) => Err(Status::invalid_argument("ControlEnvironment: type NOOP")),
        Err(_) => Err(Status::invalid_argument(format!(
            "ControlEnvironment: unknown type {t}"
        ))),
    }
}

/// google.rpc.Status and google.protobuf.Any, the shape of `grpc-status-details-bin`.
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<ProtoAny>,
}

#[derive(Clone, PartialEq, Message)]
struct ProtoAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// A failed create as the anchor answers it: INTERNAL `cannot create new environment: ...`
/// with an EnvironmentInfo (the id, the time, state ERROR) in the status details.
pub fn failed_create(id: &str, why: &str) -> Status {
    let message = format!("cannot create new environment: {why}");
    let info = pb::EnvironmentInfo {
        id: id.to_string(),
        created_when: millis(SystemTime::now()),
        state: "ERROR".into(),
        ..Default::default()
    };
    let details = RpcStatus {
        code: tonic::Code::Internal as i32,
        message: message.clone(),
        details: vec![ProtoAny {
            type_url: "type.googleapis.com/o2control.EnvironmentInfo".into(),
            value: info.encode_to_vec(),
        }],
    };
    Status::with_details(
        tonic::Code::Internal,
        message,
        details.encode_to_vec().into(),
    )
}

/// STOP_ACTIVITY's arguments, as the anchor's core gives them: the run's end time, the
/// transition's start `at`.
pub(super) fn stop_arguments(at: SystemTime) -> BTreeMap<String, String> {
    BTreeMap::from([("run_end_time_ms".to_string(), millis(at).to_string())])
}

/// A waited outcome in words: Ok when reached, else the daemon's message.
fn outcome_words(out: Result<Outcome, crate::roster::Progress>) -> Result<(), String> {
    match out {
        Ok(Outcome::Reached { .. }) => Ok(()),
        Ok(Outcome::Failed { message, .. }) => Err(message),
        Err(p) => Err(format!(
            "timed out: {} of {} task(s) in the target{}",
            p.in_target,
            p.expected,
            p.message.map(|m| format!(" ({m})")).unwrap_or_default()
        )),
    }
}

/// Runs `event` on environment `key` and waits for it; Ok or the daemon's words.
pub(super) async fn run(
    bridge: &Bridge,
    caller: &Caller,
    key: &EnvKey,
    event: Event,
    arguments: BTreeMap<String, String>,
) -> Result<(), String> {
    let call = TransitionCall {
        env: key.to_string(),
        event: Some(event),
        arguments,
        wait: true,
        timeout: None,
        transition_id: None,
    };
    let target = format!("{key} {event} {:?}", call.arguments);
    let res = bridge.transition(&call).await.map_err(convert::status);
    let env = Some((key.namespace.to_string(), key.name.to_string()));
    audit(bridge, caller, "transition", &target, env.as_ref(), &res).await;
    let res = res.map_err(|s| s.message().to_string())?;
    match res.outcome {
        Some(out) => outcome_words(out),
        None => Ok(()),
    }
}

/// What NewEnvironment does after the create: up in STANDBY, then CONFIGURE.
pub(super) async fn deploy_and_configure(
    bridge: &Bridge,
    caller: &Caller,
    key: &EnvKey,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + bridge.cfg.deploy_timeout;
    let up = bridge
        .roster
        .wait_state(key, State::Standby, deadline)
        .await;
    outcome_words(up).map_err(|m| format!("deployment failed: {m}"))?;
    run(bridge, caller, key, Event::Configure, BTreeMap::new())
        .await
        .map_err(|m| format!("CONFIGURE failed: {m}"))
}

impl Control {
    fn info_of(&self, key: &EnvKey) -> Option<pb::EnvironmentInfo> {
        let r = &self.bridge.roster;
        let inv = self.inventory().unwrap_or_default();
        r.env(key)
            .map(|e| self.environment(&e, &r.tasks_of(key), true, &inv))
    }

    /// Creates the environment a request asks for (nothing deployed yet): the key, the
    /// caller and the create's answer. A refused variable or an unknown workflow is
    /// INVALID_ARGUMENT with nothing written; any other failure the anchor's failed create.
    pub(super) async fn create_only(
        &self,
        caller: &Caller,
        r: &NewRequest<'_>,
    ) -> Result<(EnvKey, Caller, Created), Status> {
        let caller = caller::claimed(caller, r.request_user);
        let workflow = workflow_name(r.workflow_template)?;
        let mut spec = CreateSpec {
            workflow,
            variables: r.vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            idempotency_key: None,
            env_id: None,
            // Site variables stay with the daemon's own API (an admin).
            site_variables: false,
        };
        // The id exists before anything is written, so that a failed create can name it.
        let id = crate::bridge::deploy::environment_id(&spec).map_err(convert::status)?;
        spec.env_id = Some(id.clone());
        let target = format!("{} {:?}", r.workflow_template, spec.variables);
        let c = match create_audited(&self.bridge, &caller, &spec, &target).await {
            Ok(c) => c,
            // Bad input (a refused variable, an unknown workflow) keeps its own code.
            Err(s) if s.code() == tonic::Code::InvalidArgument => return Err(s),
            Err(s) => return Err(failed_create(&id, s.message())),
        };
        Ok((EnvKey::new(&c.namespace, &c.name), caller, c))
    }

    /// NewEnvironment (`wait`: deployed and configured before the answer, as the anchor's
    /// core does) and NewEnvironmentAsync (answered once created).
    pub(super) async fn create(
        &self,
        caller: &Caller,
        r: pb::NewEnvironmentRequest,
        wait: bool,
    ) -> Result<pb::NewEnvironmentReply, Status> {
        let req = NewRequest {
            workflow_template: &r.workflow_template,
            vars: &r.vars,
            request_user: r.request_user.as_ref(),
        };
        let (key, caller, c) = self.create_only(caller, &req).await?;
        if wait {
            deploy_and_configure(&self.bridge, &caller, &key)
                .await
                .map_err(|why| failed_create(&c.id, &why))?;
        } else {
            let (bridge, key, caller) = (self.bridge.clone(), key.clone(), caller.clone());
            tokio::spawn(async move {
                if let Err(why) = deploy_and_configure(&bridge, &caller, &key).await {
                    tracing::warn!(environment = %key, error = %why, "NewEnvironmentAsync: the environment did not reach CONFIGURED");
                }
            });
        }
        let environment = self.info_of(&key).unwrap_or_else(|| pb::EnvironmentInfo {
            id: c.id.clone(),
            created_when: millis(SystemTime::now()),
            state: state_map::environment_state(None).into(),
            root_role: workflow_name(&r.workflow_template).unwrap_or_default(),
            ..Default::default()
        });
        Ok(pb::NewEnvironmentReply {
            environment: Some(environment),
            public: r.public,
            timestamp: millis(SystemTime::now()),
        })
    }

    /// ControlEnvironment: one transition, waited for; START_ACTIVITY takes the next run
    /// number. A failed transition answers ABORTED with the daemon's words (the
    /// environment's state then says ERROR where a task failed).
    pub(super) async fn control(
        &self,
        caller: &Caller,
        r: pb::ControlEnvironmentRequest,
    ) -> Result<pb::ControlEnvironmentReply, Status> {
        let caller = caller::claimed(caller, r.request_user.as_ref());
        let event = event_of(r.r#type)?;
        let rec = self.bridge.resolve(&r.id).map_err(convert::status)?;
        // The transition starts before its run number is taken, and the run's start or end
        // time is the transition's start (reported as start_of_transition): one instant.
        let sot = SystemTime::now();
        let t0 = Instant::now();
        let arguments = match event {
            Event::Start => self.start_arguments(&rec.id, sot).await?,
            Event::Stop => stop_arguments(sot),
            _ => BTreeMap::new(),
        };
        let done = run(&self.bridge, &caller, &rec.key, event, arguments).await;
        let took = t0.elapsed();
        let eot = SystemTime::now();
        if let Err(why) = done {
            return Err(Status::aborted(format!(
                "transition {} failed: {why}",
                state_map::event_name(event)
            )));
        }
        let now = self.bridge.roster.env(&rec.key).unwrap_or(rec);
        let info = info::environment(&now, &[], false);
        Ok(pb::ControlEnvironmentReply {
            id: now.id.to_string(),
            state: info.state,
            current_run_number: info.current_run_number,
            start_of_transition: millis(sot),
            end_of_transition: millis(eot),
            transition_duration: took.as_millis() as i64,
            timestamp: millis(SystemTime::now()),
        })
    }

    /// START_ACTIVITY's arguments, as the anchor's core gives them: the next run number
    /// (from the site's run-number source) and the run's start time, the transition's
    /// start `at`.
    pub(super) async fn start_arguments(
        &self,
        env_id: &str,
        at: SystemTime,
    ) -> Result<BTreeMap<String, String>, Status> {
        let n = self
            .bridge
            .next_run_number(&self.run_numbers, env_id)
            .await
            .map_err(convert::status)?;
        Ok(BTreeMap::from([
            ("run_number".to_string(), n.to_string()),
            ("run_start_time_ms".to_string(), millis(at).to_string()),
        ]))
    }

    /// Tears environment `key` down (audited) and waits for its tasks and pods to be gone.
    pub(super) async fn destroy_env(&self, key: &EnvKey, caller: &Caller) -> Result<(), Status> {
        let env = Some((key.namespace.to_string(), key.name.to_string()));
        audit(
            &self.bridge,
            caller,
            "destroy",
            &key.to_string(),
            env.as_ref(),
            &Ok::<(), Status>(()),
        )
        .await;
        let gone = self
            .bridge
            .destroy(&key.to_string(), true, None)
            .await
            .map_err(convert::status)?;
        if !gone {
            return Err(Status::deadline_exceeded(format!(
                "DestroyEnvironment {key}: timed out waiting for its tasks and pods to be gone"
            )));
        }
        Ok(())
    }

    /// DestroyEnvironment as the anchor does it: a RUNNING environment is stopped first
    /// when `allowInRunningState`, a CONFIGURED one reset, then it is torn down; `force`
    /// skips both. A step that fails does not stop the teardown.
    pub(super) async fn destroy(
        &self,
        caller: &Caller,
        r: pb::DestroyEnvironmentRequest,
    ) -> Result<pb::DestroyEnvironmentReply, Status> {
        if r.keep_tasks {
            return Err(Status::failed_precondition(
                "DestroyEnvironment: keepTasks is not supported: envbridge's tasks end with their environment",
            ));
        }
        let caller = caller::claimed(caller, r.request_user.as_ref());
        let rec = self.bridge.resolve(&r.id).map_err(convert::status)?;
        let key = rec.key.clone();
        let killed: Vec<pb::ShortTaskInfo> = self
            .bridge
            .roster
            .tasks_of(&key)
            .iter()
            .map(|t| info::short_task(t))
            .collect();
        let mut state = rec.state;
        if !r.force {
            if state == Some(State::Running) && r.allow_in_running_state {
                let stopped = run(
                    &self.bridge,
                    &caller,
                    &key,
                    Event::Stop,
                    stop_arguments(SystemTime::now()),
                )
                .await;
                state = stopped.is_ok().then_some(State::Configured);
            }
            if state == Some(State::Configured) {
                let _ = run(&self.bridge, &caller, &key, Event::Reset, BTreeMap::new()).await;
            }
        }
        self.destroy_env(&key, &caller).await?;
        let now = millis(SystemTime::now());
        Ok(pb::DestroyEnvironmentReply {
            cleanup_tasks_reply: Some(pb::CleanupTasksReply {
                killed_tasks: killed,
                running_tasks: vec![],
                timestamp: now,
            }),
            timestamp: now,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_templates_in_the_anchors_forms() {
        for t in [
            "readout-dataflow",
            "envbridge/workflows/readout-dataflow@main",
            "github.com/AliceO2Group/ControlWorkflows/workflows/readout-dataflow@master",
            "readout-dataflow@main",
            "repo/workflows/readout-dataflow.yaml",
        ] {
            assert_eq!(workflow_name(t).unwrap(), "readout-dataflow", "{t}");
        }
        for bad in ["", "@main", "a/b", "repo/workflows/"] {
            let e = workflow_name(bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
        }
    }

    #[test]
    fn control_types_map_to_events_and_the_rest_is_refused() {
        assert_eq!(
            event_of(Optype::Configure as i32).unwrap(),
            Event::Configure
        );
        assert_eq!(
            event_of(Optype::StartActivity as i32).unwrap(),
            Event::Start
        );
        assert_eq!(event_of(Optype::StopActivity as i32).unwrap(), Event::Stop);
        assert_eq!(event_of(Optype::Reset as i32).unwrap(), Event::Reset);
        assert_eq!(event_of(Optype::GoError as i32).unwrap(), Event::GoError);
        let e = event_of(Optype::Deploy as i32).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("deployed when it is created"));
        assert_eq!(
            event_of(Optype::Noop as i32).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            event_of(99).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn a_failed_create_carries_the_environment_id_in_its_details() {
        let s = failed_create("2abcdefghij", "CONFIGURE failed: boom");
        assert_eq!(s.code(), tonic::Code::Internal);
        assert_eq!(
            s.message(),
            "cannot create new environment: CONFIGURE failed: boom"
        );
        let st = RpcStatus::decode(s.details()).unwrap();
        assert_eq!(st.code, tonic::Code::Internal as i32);
        assert_eq!(st.details.len(), 1);
        assert_eq!(
            st.details[0].type_url,
            "type.googleapis.com/o2control.EnvironmentInfo"
        );
        let info = pb::EnvironmentInfo::decode(st.details[0].value.as_slice()).unwrap();
        assert_eq!(
            (info.id.as_str(), info.state.as_str()),
            ("2abcdefghij", "ERROR")
        );
    }
}

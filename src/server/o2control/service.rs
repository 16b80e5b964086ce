//! The `o2control.Control` service: thin glue from the anchor's requests to the bridge and
//! the roster the daemon's own API uses. Methods this slice does not serve answer
//! UNIMPLEMENTED naming themselves.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use futures::Stream;
use tonic::{Request, Response, Status};

use super::caller;
use super::detectors::{self, Inventory};
use super::info;
use super::pb::events;
use super::pb::o2control as pb;
use super::roles;
use super::templates;
use crate::bridge::Bridge;
use crate::roster::{EnvRecord, TaskRecord};
use crate::server::auth::{Caller, Role};
use crate::server::convert::{self, millis};

#[derive(Clone)]
pub struct Control {
    pub(super) bridge: Arc<Bridge>,
    /// Subscribe's streams by subscription id (NewAutoEnvironment's events).
    pub(super) subscriptions: Arc<super::subscriptions::Subscriptions>,
    /// Where START_ACTIVITY's run numbers come from.
    pub(super) run_numbers: crate::bridge::run_numbers::Source,
    instance_name: String,
    /// This listener's framework id (the anchor's is its scheduler's): new at every start.
    framework_id: String,
}

impl Control {
    pub fn new(bridge: Arc<Bridge>, cfg: &super::O2ControlConfig) -> Self {
        Control {
            bridge,
            subscriptions: Arc::default(),
            run_numbers: cfg.run_numbers.clone(),
            instance_name: cfg.instance_name.clone(),
            framework_id: format!("envbridge-{}", uuid::Uuid::new_v4()),
        }
    }

    /// The request's caller (identified by the listener), if its role allows `rpc`.
    pub(super) fn allow<T>(
        &self,
        req: &Request<T>,
        need: Role,
        rpc: &str,
    ) -> Result<Caller, Status> {
        let caller = caller::of(req);
        caller::require(&caller, need, rpc)?;
        Ok(caller)
    }

    /// Every environment the roster holds, with its tasks.
    fn environments(&self, with_tasks: bool) -> Vec<pb::EnvironmentInfo> {
        let r = &self.bridge.roster;
        let inv = self.inventory().unwrap_or_default();
        r.envs()
            .iter()
            .map(|e| self.environment(e, &r.tasks_of(&e.key), with_tasks, &inv))
            .collect()
    }

    /// One environment in the anchor's shape, with its detectors from the inventory.
    pub(super) fn environment(
        &self,
        e: &EnvRecord,
        tasks: &[Arc<TaskRecord>],
        with_tasks: bool,
        inv: &Inventory,
    ) -> pb::EnvironmentInfo {
        let mut i = info::environment(e, tasks, with_tasks);
        detectors::fill(&mut i, inv, tasks);
        i
    }

    /// The configuration store's detector inventory; a store that does not load is
    /// UNAVAILABLE in its own words.
    pub(super) fn inventory(&self) -> Result<Inventory, Status> {
        let store = self
            .bridge
            .store()
            .map_err(|e| Status::unavailable(format!("configuration store: {e}")))?;
        Ok(Inventory::new(store.inventory()))
    }

    /// Where the configuration store is read: `file://PATH` or `configmap://NS/NAME`.
    fn configuration_endpoint(&self) -> String {
        let cfg = &self.bridge.cfg;
        match (&cfg.config_store, &cfg.config_map) {
            (Some(p), _) => format!("file://{}", p.display()),
            (None, Some((ns, name))) => format!("configmap://{ns}/{name}"),
            (None, None) => String::new(),
        }
    }

    /// (active, available) detectors: those the roster's environments are on, and the rest.
    fn detector_split(&self, inv: &Inventory) -> (Vec<String>, Vec<String>) {
        let r = &self.bridge.roster;
        let per_env: Vec<Vec<Arc<TaskRecord>>> =
            r.envs().iter().map(|e| r.tasks_of(&e.key)).collect();
        inv.split(per_env.iter().map(Vec::as_slice))
    }
}

/// GetRoles' `pathSpec` bound: a role path is short, a longer pattern is a mistake.
const MAX_PATH_SPEC: usize = 4096;

fn now() -> i64 {
    millis(SystemTime::now())
}

fn unimplemented(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "o2control.Control/{rpc} is not implemented by envbridge yet (docs/o2control.md)"
    ))
}

/// The service's impl: the methods served (`served`), and those not served yet, each
/// answering UNIMPLEMENTED naming itself. One macro around the whole impl, so that
/// `async_trait` sees every method.
macro_rules! control_impl {
    (
        served { $($served:tt)* }
        not_yet { $($fn:ident($req:ty) -> $reply:ty = $rpc:literal;)* }
    ) => {
        #[tonic::async_trait]
        impl pb::control_server::Control for Control {
            $($served)*
            $(
                async fn $fn(&self, _: Request<$req>) -> Result<Response<$reply>, Status> {
                    Err(unimplemented($rpc))
                }
            )*
        }
    };
}

type EventStream = Pin<Box<dyn Stream<Item = Result<events::Event, Status>> + Send>>;

control_impl! {
    served {
        async fn get_framework_info(
            &self,
            req: Request<pb::GetFrameworkInfoRequest>,
        ) -> Result<Response<pb::GetFrameworkInfoReply>, Status> {
            self.allow(&req, Role::Viewer, "GetFrameworkInfo")?;
            let r = &self.bridge.roster;
            let envs = r.envs();
            let mut tasks = 0usize;
            let mut hosts = BTreeSet::new();
            for e in &envs {
                for t in r.tasks_of(&e.key) {
                    tasks += 1;
                    hosts.insert(t.node.clone());
                }
            }
            // As the anchor: a store that cannot be read lists the one detector NIL.
            let (all, (active, available)) = match self.inventory() {
                Ok(inv) => {
                    let all = inv.all().to_vec();
                    (all, self.detector_split(&inv))
                }
                Err(_) => (vec!["NIL".to_string()], Default::default()),
            };
            let state = if self.bridge.synced.all() {
                "CONNECTED"
            } else {
                "DISCONNECTED"
            };
            Ok(Response::new(pb::GetFrameworkInfoReply {
                framework_id: self.framework_id.clone(),
                environments_count: envs.len() as i32,
                tasks_count: tasks as i32,
                state: state.into(),
                hosts_count: hosts.len() as i32,
                instance_name: self.instance_name.clone(),
                version: Some(info::version()),
                configuration_endpoint: self.configuration_endpoint(),
                detectors_in_instance: all,
                active_detectors: active,
                available_detectors: available,
                timestamp: now(),
            }))
        }

        async fn get_environments(
            &self,
            req: Request<pb::GetEnvironmentsRequest>,
        ) -> Result<Response<pb::GetEnvironmentsReply>, Status> {
            self.allow(&req, Role::Viewer, "GetEnvironments")?;
            // `showAll` asks for environments the anchor would hide; envbridge hides none.
            let r = req.into_inner();
            Ok(Response::new(pb::GetEnvironmentsReply {
                framework_id: self.framework_id.clone(),
                environments: self.environments(r.show_task_infos),
                timestamp: now(),
            }))
        }

        async fn get_environment(
            &self,
            req: Request<pb::GetEnvironmentRequest>,
        ) -> Result<Response<pb::GetEnvironmentReply>, Status> {
            self.allow(&req, Role::Viewer, "GetEnvironment")?;
            let r = req.into_inner();
            let e = self.bridge.resolve(&r.id).map_err(convert::status)?;
            let tasks = self.bridge.roster.tasks_of(&e.key);
            Ok(Response::new(pb::GetEnvironmentReply {
                environment: Some(self.environment(
                    &e,
                    &tasks,
                    true,
                    &self.inventory().unwrap_or_default(),
                )),
                workflow: r
                    .show_workflow_tree
                    .then(|| roles::tree(&e.workflow, &tasks)),
                // envbridge hides no environment from any caller.
                public: true,
                timestamp: now(),
            }))
        }

        async fn get_tasks(
            &self,
            req: Request<pb::GetTasksRequest>,
        ) -> Result<Response<pb::GetTasksReply>, Status> {
            self.allow(&req, Role::Viewer, "GetTasks")?;
            let r = &self.bridge.roster;
            let tasks = r
                .envs()
                .iter()
                .flat_map(|e| r.tasks_of(&e.key))
                .map(|t| info::short_task(&t))
                .collect();
            Ok(Response::new(pb::GetTasksReply {
                tasks,
                timestamp: now(),
            }))
        }

        async fn get_task(
            &self,
            req: Request<pb::GetTaskRequest>,
        ) -> Result<Response<pb::GetTaskReply>, Status> {
            self.allow(&req, Role::Viewer, "GetTask")?;
            let id = req.into_inner().task_id;
            let r = &self.bridge.roster;
            let found = r
                .envs()
                .into_iter()
                .find_map(|e| {
                    r.task(&e.key, &id)
                        .map(|t| (info::task(&t, &e), e.key.namespace.to_string()))
                });
            let Some((mut task, namespace)) = found else {
                return Err(Status::not_found(format!("GetTask: no task {id:?}")));
            };
            // The command, channels and properties are on the Task object, not in the roster.
            let api: kube::Api<crate::crd::Task> =
                kube::Api::namespaced(self.bridge.client.clone(), &namespace);
            match api.get_opt(&id).await {
                Ok(Some(t)) => info::task_detail(&t.spec.task, &mut task),
                Ok(None) => {}
                Err(e) => tracing::warn!(task = %id, error = %e, "GetTask: could not read the Task object"),
            }
            Ok(Response::new(pb::GetTaskReply {
                task: Some(task),
                timestamp: now(),
            }))
        }

        async fn new_environment(
            &self,
            req: Request<pb::NewEnvironmentRequest>,
        ) -> Result<Response<pb::NewEnvironmentReply>, Status> {
            let caller = self.allow(&req, Role::Operator, "NewEnvironment")?;
            let r = self.create(&caller, req.into_inner(), true).await?;
            Ok(Response::new(r))
        }

        async fn new_environment_async(
            &self,
            req: Request<pb::NewEnvironmentRequest>,
        ) -> Result<Response<pb::NewEnvironmentReply>, Status> {
            let caller = self.allow(&req, Role::Operator, "NewEnvironmentAsync")?;
            let r = self.create(&caller, req.into_inner(), false).await?;
            Ok(Response::new(r))
        }

        async fn control_environment(
            &self,
            req: Request<pb::ControlEnvironmentRequest>,
        ) -> Result<Response<pb::ControlEnvironmentReply>, Status> {
            let caller = self.allow(&req, Role::Operator, "ControlEnvironment")?;
            Ok(Response::new(self.control(&caller, req.into_inner()).await?))
        }

        async fn destroy_environment(
            &self,
            req: Request<pb::DestroyEnvironmentRequest>,
        ) -> Result<Response<pb::DestroyEnvironmentReply>, Status> {
            let caller = self.allow(&req, Role::Operator, "DestroyEnvironment")?;
            Ok(Response::new(self.destroy(&caller, req.into_inner()).await?))
        }

        async fn get_workflow_templates(
            &self,
            req: Request<pb::GetWorkflowTemplatesRequest>,
        ) -> Result<Response<pb::GetWorkflowTemplatesReply>, Status> {
            self.allow(&req, Role::Viewer, "GetWorkflowTemplates")?;
            let cfg = self.bridge.cfg.clone();
            let all = tokio::task::spawn_blocking(move || crate::bridge::templates::list(&cfg))
                .await
                .map_err(|e| Status::internal(format!("GetWorkflowTemplates: {e}")))?
                .map_err(|e| Status::internal(e.to_string()))?;
            Ok(Response::new(pb::GetWorkflowTemplatesReply {
                workflow_templates: templates::reply(req.get_ref(), all),
                timestamp: now(),
            }))
        }

        async fn list_repos(
            &self,
            req: Request<pb::ListReposRequest>,
        ) -> Result<Response<pb::ListReposReply>, Status> {
            self.allow(&req, Role::Viewer, "ListRepos")?;
            let mut r = templates::repos(req.get_ref());
            r.timestamp = now();
            Ok(Response::new(r))
        }

        async fn get_roles(
            &self,
            req: Request<pb::GetRolesRequest>,
        ) -> Result<Response<pb::GetRolesReply>, Status> {
            self.allow(&req, Role::Viewer, "GetRoles")?;
            let r = req.into_inner();
            if r.env_id.is_empty() {
                return Err(Status::invalid_argument("GetRoles: envId is required"));
            }
            if r.path_spec.len() > MAX_PATH_SPEC {
                return Err(Status::invalid_argument(format!(
                    "GetRoles: pathSpec is {} bytes, at most {MAX_PATH_SPEC}",
                    r.path_spec.len()
                )));
            }
            let e = self.bridge.resolve(&r.env_id).map_err(convert::status)?;
            let tree = roles::tree(&e.workflow, &self.bridge.roster.tasks_of(&e.key));
            Ok(Response::new(pb::GetRolesReply {
                roles: roles::query(&tree, &r.path_spec),
                timestamp: now(),
            }))
        }

        async fn get_integrated_services(
            &self,
            req: Request<pb::Empty>,
        ) -> Result<Response<pb::ListIntegratedServicesReply>, Status> {
            self.allow(&req, Role::Viewer, "GetIntegratedServices")?;
            Ok(Response::new(pb::ListIntegratedServicesReply {
                services: info::integrated_services(&self.bridge.cfg.integrations),
                timestamp: now(),
            }))
        }

        async fn get_active_detectors(
            &self,
            req: Request<pb::Empty>,
        ) -> Result<Response<pb::GetActiveDetectorsReply>, Status> {
            self.allow(&req, Role::Viewer, "GetActiveDetectors")?;
            Ok(Response::new(pb::GetActiveDetectorsReply {
                detectors: self.detector_split(&self.inventory()?).0,
                timestamp: now(),
            }))
        }

        async fn get_available_detectors(
            &self,
            req: Request<pb::Empty>,
        ) -> Result<Response<pb::GetAvailableDetectorsReply>, Status> {
            self.allow(&req, Role::Viewer, "GetAvailableDetectors")?;
            Ok(Response::new(pb::GetAvailableDetectorsReply {
                detectors: self.detector_split(&self.inventory()?).1,
                timestamp: now(),
            }))
        }

        type SubscribeStream = EventStream;

        async fn subscribe(
            &self,
            req: Request<pb::SubscribeRequest>,
        ) -> Result<Response<EventStream>, Status> {
            self.allow(&req, Role::Viewer, "Subscribe")?;
            let stream = Control::subscribe(self, &req.into_inner().id)?;
            Ok(Response::new(Box::pin(stream)))
        }

        async fn new_auto_environment(
            &self,
            req: Request<pb::NewAutoEnvironmentRequest>,
        ) -> Result<Response<pb::NewAutoEnvironmentReply>, Status> {
            let caller = self.allow(&req, Role::Operator, "NewAutoEnvironment")?;
            Ok(Response::new(self.new_auto(&caller, req.into_inner()).await?))
        }
    }
    not_yet {
        teardown(pb::TeardownRequest) -> pb::TeardownReply = "Teardown";
        modify_environment(pb::ModifyEnvironmentRequest) -> pb::ModifyEnvironmentReply = "ModifyEnvironment";
        cleanup_tasks(pb::CleanupTasksRequest) -> pb::CleanupTasksReply = "CleanupTasks";
        add_repo(pb::AddRepoRequest) -> pb::AddRepoReply = "AddRepo";
        remove_repo(pb::RemoveRepoRequest) -> pb::RemoveRepoReply = "RemoveRepo";
        refresh_repos(pb::RefreshReposRequest) -> pb::Empty = "RefreshRepos";
        set_default_repo(pb::SetDefaultRepoRequest) -> pb::Empty = "SetDefaultRepo";
        set_global_default_revision(pb::SetGlobalDefaultRevisionRequest) -> pb::Empty = "SetGlobalDefaultRevision";
        set_repo_default_revision(pb::SetRepoDefaultRevisionRequest) -> pb::SetRepoDefaultRevisionReply = "SetRepoDefaultRevision";
    }
}

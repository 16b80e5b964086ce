//! The one context every reconcile is handed: the client, the settings, the stores fed by
//! the watches, and the operator's memory between reconciles. Built by `runtime`; read by both
//! controllers (which therefore never import the runtime that runs them).

use std::sync::Arc;

use dashmap::{DashMap, DashSet};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};

use super::OperatorArgs;
use super::control_api::ControlClient;
use super::pod::PodSettings;
use crate::crd::{Task, TaskSet, TaskTemplate};

/// A transition's answer as this operator recorded it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: crate::crd::TaskStatus,
    /// The status write succeeded (false: the apiserver or etcd refused it; write it again).
    pub written: bool,
}

/// Everything a reconcile reads: stores fed by watches (never a GET per reconcile).
pub struct Ctx {
    pub client: Client,
    pub args: OperatorArgs,
    pub pod_settings: PodSettings,
    pub tasks: Store<Task>,
    /// The Task store's names by environment (fed by the same watch).
    pub task_index: Arc<super::task_index::TaskIndex>,
    pub pods: Store<Pod>,
    pub services: Store<Service>,
    pub nodes: Store<Node>,
    pub templates: Store<TaskTemplate>,
    pub task_sets: Store<TaskSet>,
    pub recorder: Recorder,
    /// Tasks whose process state was read since this operator started (re-attach check).
    pub verified: DashSet<String>,
    /// Task uid -> this operator's last answer to a transition and whether its status write
    /// landed (read while the store lags behind that write, or instead of sending the step
    /// again after the write failed; see `task_controller::answered`).
    pub answered: DashMap<String, Answer>,
    /// Environment uid -> when this operator last wrote its status (progress is coalesced to
    /// one write a window; see `status_pace`).
    pub status_written: DashMap<String, std::time::Instant>,
    /// TaskSet uid -> (resourceVersion, content hash): TaskSets are immutable, hash each once.
    pub set_hashes: DashMap<String, (String, String)>,
    /// (what, task uid) -> when this operator created (or deleted) the task's Pod or
    /// Service, until its store shows it: a reconcile in between (store lag) does not send
    /// the same request again.
    pub requested: DashMap<(&'static str, String), std::time::Instant>,
    /// Integration calls in flight and their outcomes.
    pub calls: Arc<super::calls::Calls>,
    /// Live task state between transitions (followers of the task processes).
    pub live: Arc<super::live::Live>,
    /// The task control client every caller uses (one policy, one channel cache).
    pub control: ControlClient,
    /// Turns true once every watch has listed.
    pub(super) listed: tokio::sync::watch::Receiver<bool>,
}

impl Ctx {
    /// The stored Tasks of Environment `env` in `namespace` (by the index, no scan).
    pub fn tasks_of(&self, namespace: &str, env: &str) -> Vec<Arc<Task>> {
        self.task_index
            .names(namespace, env)
            .iter()
            .filter_map(|n| self.tasks.get(&ObjectRef::new(n).within(namespace)))
            .collect()
    }

    /// Reconciles wait here until every watch has listed (no decision on a partial view).
    pub async fn listed(&self) {
        let mut rx = self.listed.clone();
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

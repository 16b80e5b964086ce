//! The daemon's Kubernetes edge: deploy, watch, transitions, kills, leader election.
//!
//! Everything here talks to the apiserver; the decisions it acts on live in the pure core
//! (the roster, the state machine, the render core).

pub mod audit;
pub mod caller;
pub mod config;
pub mod config_map_store;
pub mod config_store;
pub mod convert;
pub mod deploy;
pub mod detectors;
pub mod error;
pub mod go_error;
pub mod kill;
pub mod leader;
pub mod metrics;
pub mod namespace;
pub mod render;
pub mod run_numbers;
pub mod sweep;
pub mod sweep_namespaces;
pub mod templates;
pub mod transition;
pub mod validate;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use dashmap::DashMap;

pub use crate::objects::Objects;
pub use config::{BridgeConfig, NamespaceMode};
pub use error::{BridgeError, Result};
pub use metrics::Metrics;

use crate::roster::{EnvKey, EnvRecord, Roster};

/// What CreateEnvironment asks for.
#[derive(Clone, Debug, Default)]
pub struct CreateSpec {
    pub workflow: String,
    pub variables: BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    pub env_id: Option<String>,
    /// The caller may set the site's allow-listed variables (an admin).
    pub site_variables: bool,
}

/// Ports other live environments hold, per node (render must allocate around them).
pub type TakenPorts = BTreeMap<String, BTreeSet<u16>>;

/// Turns a create request (with its resolved environment id) into objects.
pub type Renderer = Arc<dyn Fn(&CreateSpec, &str, &TakenPorts) -> Result<Objects> + Send + Sync>;

pub struct Bridge {
    pub client: kube::Client,
    pub roster: Arc<Roster>,
    pub cfg: BridgeConfig,
    pub metrics: Metrics,
    pub synced: Arc<watch::Synced>,
    renderer: Renderer,
    /// The configuration store the renders read: its inventory is what the o2control and
    /// apricot APIs report.
    store: render::StoreSource,
    /// False on a standby replica: it serves reads only.
    leader: Arc<AtomicBool>,
    /// Creates run one at a time so that port allocation sees every earlier environment.
    create_lock: tokio::sync::Mutex<()>,
    /// Ports of environments created here whose Tasks the roster does not show yet.
    reserved: DashMap<EnvKey, TakenPorts>,
    /// The HTTP client of integration endpoints (the site's run-number service).
    endpoints: crate::integration::Endpoints,
}

impl Bridge {
    pub fn new(
        client: kube::Client,
        cfg: BridgeConfig,
        metrics: Metrics,
        renderer: Renderer,
    ) -> Arc<Bridge> {
        let store = render::StoreSource::of(&cfg);
        Bridge::with_store(client, cfg, metrics, renderer, store)
    }

    /// [`Bridge::new`] reading the configuration store from `store` (the daemon's: a file or
    /// a watched ConfigMap), the one its renderer reads.
    pub fn with_store(
        client: kube::Client,
        cfg: BridgeConfig,
        metrics: Metrics,
        renderer: Renderer,
        store: render::StoreSource,
    ) -> Arc<Bridge> {
        Arc::new(Bridge {
            client,
            roster: Arc::new(Roster::new()),
            cfg,
            metrics,
            synced: Arc::new(watch::Synced::default()),
            renderer,
            store,
            leader: Arc::new(AtomicBool::new(true)),
            create_lock: tokio::sync::Mutex::new(()),
            reserved: DashMap::new(),
            endpoints: Default::default(),
        })
    }

    /// The configuration store as it is now.
    pub fn store(&self) -> std::result::Result<Arc<crate::workflow::store::ConfigStore>, String> {
        self.store.current()
    }

    /// The flag leader election flips (true: this replica may write).
    pub fn leader_flag(&self) -> Arc<AtomicBool> {
        self.leader.clone()
    }

    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    fn ensure_leader(&self) -> Result<()> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(BridgeError::NotLeader)
        }
    }

    /// Runs the watches that feed the roster, and what follows from them (the automatic
    /// GO_ERROR of an environment whose critical task failed while RUNNING; the sweep of
    /// TaskSets a crashed create left and of the namespaces left behind), until `stop`.
    pub async fn run_watches(self: &Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let watches = watch::run(
            self.client.clone(),
            self.cfg.watch_namespace.as_deref(),
            self.roster.clone(),
            self.metrics.clone(),
            self.synced.clone(),
            stop.clone(),
        );
        futures::join!(
            watches,
            self.run_go_error(stop.clone()),
            self.run_sweeps(stop)
        );
    }

    /// Waits until both watches have listed once (the roster is a true view).
    pub async fn wait_synced(&self, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.synced.all() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        true
    }

    /// The environment named by id or name (`namespace/name` disambiguates).
    pub fn resolve(&self, id: &str) -> Result<Arc<EnvRecord>> {
        if let Some((ns, name)) = id.split_once('/') {
            return self
                .roster
                .env(&EnvKey::new(ns, name))
                .ok_or_else(|| BridgeError::NotFound(id.into()));
        }
        let mut found = self.roster.find_env(id);
        match found.len() {
            0 => Err(BridgeError::NotFound(id.into())),
            1 => Ok(found.remove(0)),
            _ => Err(BridgeError::Ambiguous(id.into())),
        }
    }

    /// Ports held on each node by every other live environment.
    pub fn taken_ports(&self, except: Option<&EnvKey>) -> TakenPorts {
        let mut taken = self.roster.ports_in_use(except);
        // A reservation stands until the roster shows all of the environment's tasks (their
        // ports are then counted from the roster); destroy drops it.
        self.reserved.retain(|k, _| {
            self.roster
                .env(k)
                .is_none_or(|e| self.roster.with_tasks(k, |t| t.count()) < e.tasks as usize)
        });
        for r in self.reserved.iter() {
            if Some(r.key()) == except {
                continue;
            }
            for (node, ports) in r.value() {
                taken.entry(node.clone()).or_default().extend(ports);
            }
        }
        taken
    }
}

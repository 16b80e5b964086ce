//! The bridge's settings: namespaces, field manager, and one timeout per kind of wait.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::state::Event;

/// Where an environment's objects live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NamespaceMode {
    /// One namespace per environment, named `<prefix><environment id>`.
    PerEnvironment { prefix: String },
    /// Every environment in this one namespace.
    Fixed { namespace: String },
}

#[derive(Clone, Debug)]
pub struct BridgeConfig {
    pub namespaces: NamespaceMode,
    /// Watch only this namespace (None: all; required with per-environment namespaces).
    pub watch_namespace: Option<String>,
    /// The operator shard of the environments this daemon creates (their `envbridge.dev/shard`
    /// label; None: the operator without a shard).
    pub shard: Option<String>,
    /// Field manager for server-side apply.
    pub field_manager: String,
    /// Namespace found Terminating: how long to wait for it to be gone (404).
    pub namespace_gone_timeout: Duration,
    /// Namespace created: how long to wait for phase Active.
    pub namespace_active_timeout: Duration,
    /// Create with wait: how long until every task is STANDBY.
    pub deploy_timeout: Duration,
    /// Destroy: how long to wait for the Tasks and Pods to be gone.
    pub destroy_timeout: Duration,
    /// Kill: how long to wait for the Task to leave the roster.
    pub kill_timeout: Duration,
    /// Per-event default deadline of a waited transition.
    pub transition_timeouts: HashMap<Event, Duration>,
    pub default_transition_timeout: Duration,
    /// Port ranges render allocates from (control ports; TCP channel ports).
    pub control_ports: std::ops::RangeInclusive<u16>,
    pub tcp_ports: std::ops::RangeInclusive<u16>,
    /// Task classes, workflows and site profiles for rendering CreateEnvironment requests.
    pub tasks_dir: PathBuf,
    pub workflows_dir: PathBuf,
    pub defaults_files: Vec<PathBuf>,
    /// The site's configuration store file (the anchor's layout), reloaded when it changes.
    pub config_store: Option<PathBuf>,
    /// The site's configuration store in a ConfigMap (namespace, name), key `config.yaml`,
    /// watched through the API (instead of `config_store`).
    pub config_map: Option<(String, String)>,
    /// Integration plugin -> endpoint URL that receives its calls (docs/integrations.md).
    pub integrations: std::collections::BTreeMap<String, String>,
    /// The site's class -> TaskTemplate mapping (read at start).
    pub templates: Option<PathBuf>,
    /// What callers may set, and the per-environment quotas (docs/security.md).
    pub caller: super::caller::CallerPolicy,
    /// How long one render may take (it runs off the async runtime; a runaway is an error).
    pub render_deadline: Duration,
    /// The `dpl.*` functions: the `jit/` directory and the site's generator (its generated
    /// workflows are shared by the daemon's renders).
    pub jit: crate::workflow::jit::JitOptions,
    /// The operator's ServiceAccount (namespace, name): granted the workloads role in every
    /// namespace environments go to (None: the site grants it otherwise).
    pub operator_account: Option<(String, String)>,
    /// A TaskSet without its Environment this old is swept (a create crashed between its
    /// writes), and so is a per-environment namespace without one.
    pub orphan_grace: Duration,
    /// A crash-test hook (zero but in tests): a pause between a create's TaskSet writes and
    /// its Environment write.
    pub hold_before_environment_write: Duration,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        let mut transition_timeouts = HashMap::new();
        // The anchor's figures as defaults: CONFIGURE 120 s, other transitions 80 s.
        transition_timeouts.insert(Event::Configure, Duration::from_secs(120));
        BridgeConfig {
            namespaces: NamespaceMode::Fixed {
                namespace: "envbridge".into(),
            },
            watch_namespace: None,
            shard: None,
            field_manager: "envbridge-daemon".into(),
            namespace_gone_timeout: Duration::from_secs(180),
            namespace_active_timeout: Duration::from_secs(30),
            deploy_timeout: Duration::from_secs(90),
            destroy_timeout: Duration::from_secs(120),
            kill_timeout: Duration::from_secs(60),
            transition_timeouts,
            default_transition_timeout: Duration::from_secs(80),
            control_ports: crate::plan::DEFAULT_CONTROL_PORTS,
            tcp_ports: crate::plan::DEFAULT_TCP_PORTS,
            tasks_dir: PathBuf::from("manifests/control-workflows/tasks"),
            workflows_dir: PathBuf::from("manifests/control-workflows/workflows"),
            defaults_files: vec![],
            config_store: None,
            config_map: None,
            integrations: Default::default(),
            templates: None,
            caller: super::caller::CallerPolicy::new(),
            render_deadline: Duration::from_secs(10),
            jit: Default::default(),
            orphan_grace: Duration::from_secs(120),
            hold_before_environment_write: Duration::ZERO,
            operator_account: Some(("envbridge-system".into(), "envbridge-operator".into())),
        }
    }
}

impl BridgeConfig {
    pub fn transition_timeout(&self, event: Event) -> Duration {
        self.transition_timeouts
            .get(&event)
            .copied()
            .unwrap_or(self.default_transition_timeout)
    }

    /// The namespace an environment with this object name lives in.
    pub fn namespace_for(&self, env_name: &str) -> String {
        match &self.namespaces {
            NamespaceMode::PerEnvironment { prefix } => format!("{prefix}{env_name}"),
            NamespaceMode::Fixed { namespace } => namespace.clone(),
        }
    }

    /// Whether this daemon puts environments in namespace `ns` (its sweeps stay there).
    pub fn owns_namespace(&self, ns: &str) -> bool {
        match &self.namespaces {
            NamespaceMode::PerEnvironment { prefix } => ns
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| !rest.is_empty()),
            NamespaceMode::Fixed { namespace } => ns == namespace,
        }
    }

    pub fn per_env_namespace(&self) -> bool {
        matches!(self.namespaces, NamespaceMode::PerEnvironment { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_owns_only_the_namespaces_it_puts_environments_in() {
        let per_env = BridgeConfig {
            namespaces: NamespaceMode::PerEnvironment {
                prefix: "env-".into(),
            },
            ..BridgeConfig::default()
        };
        assert!(per_env.owns_namespace("env-a"));
        assert!(!per_env.owns_namespace("env-"));
        assert!(!per_env.owns_namespace("other-a"));
        let fixed = BridgeConfig::default();
        assert!(fixed.owns_namespace("envbridge"));
        assert!(!fixed.owns_namespace("envbridge-a"));
    }
}

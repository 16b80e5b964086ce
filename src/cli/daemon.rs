//! `envbridge daemon`: settings from a config file (YAML or TOML), overridden by environment
//! variables, overridden by flags; then the watches, the API and leader election.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use envbridge::bridge::config_map_store::{self, SharedStore};
use envbridge::bridge::render::StoreSource;
use envbridge::bridge::{Bridge, BridgeConfig, Metrics, NamespaceMode};
use envbridge::launch::lease::{DaemonLease, LeaseConfig};
use envbridge::launch::legacy_env::Renamed;
use envbridge::launch::logging::LogFormat;
use envbridge::server::auth::Role;
use envbridge::server::o2control::O2ControlConfig;
use envbridge::server::{self, ServerConfig};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::daemon_file::{self, load_file};
use super::daemon_values::{
    event_timeout, namespaced_name, o2control_role, plugin_endpoint, port_range,
};

/// The daemon's settings, read twice into this one structure: from flags and environment
/// variables (clap), and from the config file (serde, kebab-case keys, see daemon_file.rs);
/// [`DaemonArgs::over_file`] then merges the two. Fields without a file key are `serde(skip)`.
#[derive(clap::Args, Deserialize, Debug, Default, PartialEq)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct DaemonArgs {
    /// Config file (.yaml/.yml or .toml); flags and environment variables override it.
    #[arg(long, env = "ENVBRIDGE_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// gRPC listen address (default 127.0.0.1:50061). Beyond loopback: --token and TLS required.
    #[arg(long, env = "ENVBRIDGE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// /metrics and /healthz listen address (default 127.0.0.1:9464).
    #[arg(long, env = "ENVBRIDGE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Bearer token clients must present.
    #[arg(long, env = "ENVBRIDGE_TOKEN", hide_env_values = true)]
    #[serde(skip)]
    pub token: Option<String>,
    /// The callers' token file (mode 600): one admin token, or YAML
    /// `tokens: [{name, role: viewer|operator|admin, token}]` (docs/security.md).
    #[arg(long, env = "ENVBRIDGE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve without identifying callers: every caller is an admin. Loopback only.
    #[arg(long, env = "ENVBRIDGE_INSECURE_NO_AUTH")]
    #[serde(skip)]
    pub insecure_no_auth: bool,
    #[arg(long, env = "ENVBRIDGE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    #[arg(long, env = "ENVBRIDGE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Also serve the anchor's API (o2control.Control, what coconut and the ControlGUI
    /// speak) on this address, with gRPC health and reflection. Loopback only for now
    /// (docs/o2control.md).
    #[arg(long, env = "ENVBRIDGE_O2CONTROL_LISTEN", value_name = "ADDR")]
    pub o2control_listen: Option<SocketAddr>,
    /// The role every o2control caller gets: viewer (the default) or operator.
    #[arg(long, env = "ENVBRIDGE_O2CONTROL_ROLE", value_name = "ROLE", value_parser = o2control_role)]
    #[serde(deserialize_with = "daemon_file::o2control_role")]
    pub o2control_role: Option<Role>,
    /// Where o2control's START_ACTIVITY takes its run numbers: a ConfigMap NAMESPACE/NAME
    /// holding the last number given (created at the first START; never reused, across
    /// restarts too), or the site's run-number service, an http:// URL asked once per run
    /// (docs/o2control.md). Default envbridge-system/envbridge-run-numbers.
    #[arg(
        long,
        env = "ENVBRIDGE_O2CONTROL_RUN_NUMBERS",
        value_name = "NAMESPACE/NAME|URL"
    )]
    #[serde(deserialize_with = "daemon_file::o2control_run_numbers")]
    pub o2control_run_numbers: Option<envbridge::bridge::run_numbers::Source>,
    /// The CA certificates (PEM) whose client certificates the o2control listener
    /// accepts: with it the listener speaks TLS (its certificate --tls-cert/--tls-key),
    /// every caller presents a certificate, and the certificate's subject CN is looked up
    /// among --token-file's names for its role. Required beyond loopback.
    #[arg(long, env = "ENVBRIDGE_O2CONTROL_CLIENT_CA", value_name = "FILE")]
    pub o2control_client_ca: Option<PathBuf>,
    /// Put every environment in this namespace.
    #[arg(
        long,
        env = "ENVBRIDGE_DAEMON_NAMESPACE",
        conflicts_with = "namespace_prefix"
    )]
    pub namespace: Option<String>,
    /// Give every environment its own namespace `<prefix><id>`.
    #[arg(long, env = "ENVBRIDGE_NAMESPACE_PREFIX")]
    pub namespace_prefix: Option<String>,
    /// Watch only this namespace (default: all, needed with per-environment namespaces).
    #[arg(long, env = "ENVBRIDGE_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// The operator shard of the environments this daemon creates: their objects carry the
    /// label `envbridge.dev/shard=SHARD` and only `envbridge operator --shard SHARD`
    /// reconciles them (default: the operator started without --shard).
    #[arg(long, env = "ENVBRIDGE_DAEMON_SHARD", value_name = "SHARD", value_parser = envbridge::crd::shard::parse)]
    #[serde(deserialize_with = "daemon_file::shard")]
    pub shard: Option<String>,
    #[arg(long, env = "ENVBRIDGE_TASKS_DIR")]
    pub tasks_dir: Option<PathBuf>,
    #[arg(long, env = "ENVBRIDGE_WORKFLOWS_DIR")]
    pub workflows_dir: Option<PathBuf>,
    /// Site profile (repeatable).
    #[arg(long = "defaults", env = "ENVBRIDGE_DEFAULTS", value_delimiter = ',')]
    pub defaults: Vec<PathBuf>,
    /// The site's configuration store (the anchor's layout): site variables, inventory,
    /// component configuration. Reloaded when the file changes (a mounted ConfigMap).
    #[arg(long, env = "ENVBRIDGE_CONFIG_STORE", value_name = "FILE")]
    pub config_store: Option<PathBuf>,
    /// The site's configuration store in a ConfigMap, NAMESPACE/NAME, key `config.yaml`,
    /// watched through the API (instead of --config-store).
    #[arg(long, env = "ENVBRIDGE_CONFIG_MAP", value_name = "NAMESPACE/NAME", value_parser = namespaced_name, conflicts_with = "config_store")]
    #[serde(deserialize_with = "daemon_file::config_map")]
    pub config_map: Option<(String, String)>,
    /// An integration plugin's endpoint, PLUGIN=URL (repeatable): where its `call:` roles
    /// are sent (docs/integrations.md).
    #[arg(long = "integration", value_name = "PLUGIN=URL", value_parser = plugin_endpoint)]
    #[serde(deserialize_with = "daemon_file::integrations")]
    pub integrations: Vec<(String, String)>,
    /// The site's mapping from task classes and control modes to TaskTemplates.
    #[arg(long, env = "ENVBRIDGE_TEMPLATES", value_name = "FILE")]
    pub templates: Option<PathBuf>,
    /// A variable callers may set besides `hosts` and the workflow's public ones
    /// (repeatable; the site's allow-list, docs/security.md).
    #[arg(
        long = "allow-variable",
        value_name = "NAME",
        env = "ENVBRIDGE_ALLOW_VARIABLES",
        value_delimiter = ','
    )]
    #[serde(rename = "caller-variables")]
    pub allow_variables: Vec<String>,
    /// At most this many hosts per environment (default 1000).
    #[arg(long, env = "ENVBRIDGE_MAX_HOSTS")]
    pub max_hosts: Option<usize>,
    /// At most this many tasks per environment (default 20000).
    #[arg(long, env = "ENVBRIDGE_MAX_TASKS")]
    pub max_tasks: Option<usize>,
    /// Seconds one render may take before the create fails (default 10).
    #[arg(long, env = "ENVBRIDGE_RENDER_DEADLINE")]
    pub render_deadline: Option<u64>,
    /// The workflow repository's `jit/` directory of DPL commands (default: `jit` beside
    /// the workflows directory).
    #[arg(long, env = "ENVBRIDGE_JIT_DIR", value_name = "DIR")]
    pub jit_dir: Option<PathBuf>,
    /// A program that generates a JIT workflow where the anchor runs the experiment's
    /// software (docs/workflow-language.md, "JIT workflows"); without one such a create fails.
    #[arg(long, env = "ENVBRIDGE_JIT_GENERATOR", value_name = "PROGRAM")]
    pub jit_generator: Option<PathBuf>,
    /// Seconds one generation may take (default 10; within the render deadline).
    #[arg(long, env = "ENVBRIDGE_JIT_GENERATOR_DEADLINE")]
    pub jit_generator_deadline: Option<u64>,
    /// Most bytes one generation may write (default 4194304).
    #[arg(long, env = "ENVBRIDGE_JIT_GENERATOR_MAX_BYTES")]
    pub jit_generator_max_bytes: Option<usize>,
    /// Control ports to allocate, FIRST-LAST (default 47100-47999).
    #[arg(long, env = "ENVBRIDGE_CONTROL_PORTS", value_parser = port_range)]
    #[serde(deserialize_with = "daemon_file::control_ports")]
    pub control_ports: Option<(u16, u16)>,
    /// TCP channel ports to allocate, FIRST-LAST (default 48000-49999).
    #[arg(long, env = "ENVBRIDGE_TCP_PORTS", value_parser = port_range)]
    #[serde(deserialize_with = "daemon_file::tcp_ports")]
    pub tcp_ports: Option<(u16, u16)>,
    /// Seconds until every task of a new environment is STANDBY.
    #[arg(long, env = "ENVBRIDGE_DEPLOY_TIMEOUT")]
    pub deploy_timeout: Option<u64>,
    #[arg(long, env = "ENVBRIDGE_DESTROY_TIMEOUT")]
    pub destroy_timeout: Option<u64>,
    #[arg(long, env = "ENVBRIDGE_KILL_TIMEOUT")]
    pub kill_timeout: Option<u64>,
    /// Seconds to wait for a Terminating namespace to be gone.
    #[arg(long, env = "ENVBRIDGE_NAMESPACE_GONE_TIMEOUT")]
    pub namespace_gone_timeout: Option<u64>,
    /// Seconds to wait for a new namespace to be Active.
    #[arg(long, env = "ENVBRIDGE_NAMESPACE_ACTIVE_TIMEOUT")]
    pub namespace_active_timeout: Option<u64>,
    /// Per-event transition timeout, EVENT=SECONDS (repeatable).
    #[arg(
        long = "transition-timeout",
        env = "ENVBRIDGE_TRANSITION_TIMEOUTS",
        value_delimiter = ','
    )]
    #[serde(deserialize_with = "daemon_file::transition_timeouts")]
    pub transition_timeouts: Vec<String>,
    /// Seconds, for events without their own timeout.
    #[arg(long, env = "ENVBRIDGE_DEFAULT_TRANSITION_TIMEOUT")]
    pub default_transition_timeout: Option<u64>,
    /// Seconds a TaskSet without its Environment (a create cut short by a crash), or a
    /// per-environment namespace without one (a destroy cut short), is kept before the leader
    /// removes it (default 120).
    #[arg(long, env = "ENVBRIDGE_ORPHAN_GRACE")]
    pub orphan_grace: Option<u64>,
    #[command(flatten)]
    #[serde(skip)]
    pub lease: DaemonLease,
    /// The lease group's keys in a file, read beside the group and merged into it by
    /// over_file. Not `serde(flatten)`: that passes values through serde's untyped buffer
    /// (YAML's `lease-name: y` arrives as a bool, positions are lost) and cannot combine
    /// with `deny_unknown_fields`.
    #[arg(skip)]
    #[serde(rename = "leader-election")]
    pub file_leader_election: Option<bool>,
    #[arg(skip)]
    #[serde(rename = "lease-name")]
    pub file_lease_name: Option<String>,
    #[arg(skip)]
    #[serde(rename = "lease-namespace")]
    pub file_lease_namespace: Option<String>,
    /// Log format: text or json.
    #[arg(long, env = "ENVBRIDGE_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
}

/// A crash-test hook, never set in production: the daemon waits this long between a create's
/// TaskSet writes and its Environment write, so that a test can kill it right there.
const HOLD_ENV: &str = "ENVBRIDGE_TEST_HOLD_BEFORE_ENVIRONMENT_WRITE_MS";

fn hold_before_environment_write() -> Result<Duration, String> {
    match std::env::var(HOLD_ENV) {
        Err(_) => Ok(Duration::ZERO),
        Ok(v) => match v.trim().parse::<u64>() {
            // Bounded: a crash test needs seconds; a hold must never keep creates locked for long.
            Ok(ms) if ms <= 600_000 => Ok(Duration::from_millis(ms)),
            Ok(_) => Err(format!("{HOLD_ENV}={v:?}: at most 600000 (10 minutes)")),
            Err(e) => Err(format!("{HOLD_ENV}={v:?}: {e}")),
        },
    }
}

/// The `dpl.*` settings of `--jit-dir` and `--jit-generator*` (shared by `envbridge render`).
pub fn jit_options(
    dir: Option<PathBuf>,
    generator: Option<PathBuf>,
    deadline: Option<u64>,
    max_bytes: Option<usize>,
) -> Result<envbridge::workflow::jit::JitOptions, String> {
    use envbridge::workflow::jit::{Generator, JitOptions};
    let generator = match generator {
        Some(p) => {
            let mut g = Generator::new(p);
            if let Some(s) = deadline {
                g.deadline = Duration::from_secs(s.max(1));
            }
            if let Some(n) = max_bytes {
                g.max_bytes = n;
            }
            Some(g)
        }
        None if deadline.is_some() || max_bytes.is_some() => {
            return Err(
                "jit-generator-deadline and jit-generator-max-bytes need a jit-generator".into(),
            );
        }
        None => None,
    };
    Ok(JitOptions::new(dir, generator))
}

/// Everything the daemon needs, resolved from file, environment and flags.
pub struct Settings {
    pub bridge: BridgeConfig,
    pub server: ServerConfig,
    pub lease: Option<LeaseConfig>,
    pub log_format: LogFormat,
    /// Older variable names that were read (logged once logging is up).
    pub renamed: Renamed,
}

impl DaemonArgs {
    /// Fills what flags and `ENVBRIDGE_DAEMON_*` left unset from the unprefixed variable names
    /// of earlier versions (shared with the operator), noting each in `renamed`. Before the
    /// file: an older variable still overrides the config file.
    fn with_renamed(mut self, renamed: &mut Renamed) -> Self {
        self.namespace = renamed.read(
            self.namespace,
            "ENVBRIDGE_NAMESPACE",
            "ENVBRIDGE_DAEMON_NAMESPACE",
        );
        let c = self.lease.choice().renamed(DaemonLease::PREFIX, renamed);
        self.lease = DaemonLease::from_choice(c);
        self
    }
}

pub fn resolve(a: DaemonArgs) -> Result<Settings, String> {
    let f = match &a.config {
        Some(p) => load_file(p)?,
        None => DaemonArgs::default(),
    };
    let mut renamed = Renamed::default();
    let a = a.with_renamed(&mut renamed).over_file(f);
    let mut b = BridgeConfig::default();
    b.namespaces = match (a.namespace, a.namespace_prefix) {
        (Some(_), Some(_)) => {
            return Err("namespace and namespace-prefix exclude each other".into());
        }
        (Some(namespace), None) => NamespaceMode::Fixed { namespace },
        (None, Some(prefix)) => NamespaceMode::PerEnvironment { prefix },
        (None, None) => b.namespaces,
    };
    b.watch_namespace = a.watch_namespace;
    b.shard = a.shard;
    if b.per_env_namespace() && b.watch_namespace.is_some() {
        return Err("watch-namespace cannot be used with per-environment namespaces".into());
    }
    if let Some(d) = a.tasks_dir {
        b.tasks_dir = d;
    }
    if let Some(d) = a.workflows_dir {
        b.workflows_dir = d;
    }
    b.config_store = a.config_store;
    b.templates = a.templates;
    // The file's entries come first: a flag for the same plugin wins.
    b.integrations.extend(a.integrations);
    b.caller.allowed = a
        .allow_variables
        .into_iter()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if let Some(n) = a.max_hosts {
        b.caller.max_hosts = n;
    }
    if let Some(n) = a.max_tasks {
        b.caller.max_tasks = n;
    }
    if let Some(s) = a.render_deadline {
        b.render_deadline = Duration::from_secs(s.max(1));
    }
    b.jit = jit_options(
        a.jit_dir,
        a.jit_generator,
        a.jit_generator_deadline,
        a.jit_generator_max_bytes,
    )?;
    b.config_map = a.config_map;
    if b.config_map.is_some() && b.config_store.is_some() {
        return Err("config-store and config-map name two stores: give one".to_string());
    }
    b.defaults_files = a.defaults;
    if let Some((first, last)) = a.control_ports {
        b.control_ports = first..=last;
    }
    if let Some((first, last)) = a.tcp_ports {
        b.tcp_ports = first..=last;
    }
    let secs = Duration::from_secs;
    if let Some(s) = a.deploy_timeout {
        b.deploy_timeout = secs(s);
    }
    if let Some(s) = a.destroy_timeout {
        b.destroy_timeout = secs(s);
    }
    if let Some(s) = a.kill_timeout {
        b.kill_timeout = secs(s);
    }
    if let Some(s) = a.orphan_grace {
        b.orphan_grace = secs(s);
    }
    b.hold_before_environment_write = hold_before_environment_write()?;
    if let Some(s) = a.namespace_gone_timeout {
        b.namespace_gone_timeout = secs(s);
    }
    if let Some(s) = a.namespace_active_timeout {
        b.namespace_active_timeout = secs(s);
    }
    if let Some(s) = a.default_transition_timeout {
        b.default_transition_timeout = secs(s);
    }
    // The file's entries come first: a flag for the same event wins.
    for kv in &a.transition_timeouts {
        let (ev, s) = event_timeout(kv)?;
        b.transition_timeouts.insert(ev, secs(s));
    }

    let mut s = ServerConfig::default();
    if let Some(l) = a.listen {
        s.grpc_addr = l;
    }
    if let Some(l) = a.metrics_listen {
        s.http_addr = l;
    }
    s.tokens = match (a.token, a.token_file) {
        (Some(t), _) => Some(std::sync::Arc::new(
            server::auth::Tokens::admin(&t).map_err(|e| format!("--token: {e}"))?,
        )),
        (None, Some(p)) => Some(std::sync::Arc::new(server::auth::Tokens::load(&p)?)),
        (None, None) => None,
    };
    s.insecure = a.insecure_no_auth;
    s.tls_cert = a.tls_cert;
    s.tls_key = a.tls_key;
    s.o2control = match (a.o2control_listen, a.o2control_role) {
        (Some(addr), role) => {
            let mut o = O2ControlConfig::new(addr, role.unwrap_or(Role::Viewer));
            if let Some(at) = a.o2control_run_numbers {
                o.run_numbers = at;
            }
            o.client_ca = a.o2control_client_ca;
            o.role_given = role.is_some();
            Some(o)
        }
        (None, Some(_)) => return Err("o2control-role needs o2control-listen".into()),
        (None, None) if a.o2control_run_numbers.is_some() => {
            return Err("o2control-run-numbers needs o2control-listen".into());
        }
        (None, None) if a.o2control_client_ca.is_some() => {
            return Err("o2control-client-ca needs o2control-listen".into());
        }
        (None, None) => None,
    };
    s.check().map_err(|e| e.to_string())?;

    let lease = a
        .lease
        .choice()
        .config("envbridge-daemon", "envbridge-daemon")?;
    let log_format = a.log_format.unwrap_or_default();
    Ok(Settings {
        bridge: b,
        server: s,
        lease,
        log_format,
        renamed,
    })
}

pub fn run(args: DaemonArgs) -> ExitCode {
    let settings = match resolve(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    envbridge::launch::logging::init(settings.log_format);
    settings.renamed.log();
    envbridge::launch::runtime::block_on(None, async {
        serve(settings).await.map(|()| ExitCode::SUCCESS)
    })
}

async fn serve(s: Settings) -> Result<(), String> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| format!("kubernetes client config: {e}"))?;
    let metrics = Metrics::new();
    let client = envbridge::launch::client::counted(
        config,
        metrics.apiserver_requests.clone(),
        metrics.apiserver_throttled.clone(),
    )
    .map_err(|e| format!("kubernetes client: {e}"))?;
    let stop = CancellationToken::new();
    let store = match &s.bridge.config_map {
        Some((ns, name)) => {
            let shared = SharedStore::new(ns, name);
            tokio::spawn(config_map_store::watch(
                client.clone(),
                ns.clone(),
                name.clone(),
                shared.clone(),
                stop.clone(),
            ));
            StoreSource::ConfigMap(shared)
        }
        None => StoreSource::of(&s.bridge),
    };
    let renderer = envbridge::bridge::render::renderer_with(&s.bridge, store.clone());
    let bridge = Bridge::with_store(client.clone(), s.bridge, metrics.clone(), renderer, store);
    let election = s.lease.is_some();
    if let Some(lease) = s.lease {
        // Under election a replica is a standby until the lease says otherwise.
        bridge
            .leader_flag()
            .store(false, std::sync::atomic::Ordering::Release);
        tokio::spawn(envbridge::bridge::leader::run(
            client,
            lease,
            bridge.leader_flag(),
            metrics,
            stop.clone(),
        ));
    }
    let watches = {
        let b = bridge.clone();
        let stop = stop.clone();
        tokio::spawn(async move { b.run_watches(stop).await })
    };
    // Serve once the roster is a true view and the first leadership decision is made (a
    // standby still serves; this only avoids refusing the first writes while the lease is free).
    if !bridge.wait_synced(Duration::from_secs(30)).await {
        tracing::warn!("watches not synced after 30 s; serving anyway");
    }
    if election {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !bridge.is_leader() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let (_bound, server) = server::serve(bridge.clone(), s.server, stop.clone())
        .await
        .map_err(|e| e.to_string())?;
    envbridge::signal::shutdown_signal().await;
    tracing::info!("shutting down");
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        let _ = server.await;
        let _ = watches.await;
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use envbridge::state::Event;

    fn write(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        (dir, p)
    }

    #[test]
    fn yaml_and_toml_files_then_flags_win() {
        let (_d, yaml) = write(
            "d.yaml",
            "namespace-prefix: env-\ndeploy-timeout: 7\ntransition-timeouts: {CONFIGURE: 9}\ncontrol-ports: 50000-50099\n",
        );
        let s = resolve(DaemonArgs {
            config: Some(yaml.clone()),
            lease: DaemonLease {
                no_leader_election: true,
                ..Default::default()
            },
            insecure_no_auth: true,
            ..Default::default()
        })
        .expect("yaml");
        assert_eq!(
            s.bridge.namespaces,
            NamespaceMode::PerEnvironment {
                prefix: "env-".into()
            }
        );
        assert_eq!(s.bridge.deploy_timeout, Duration::from_secs(7));
        assert_eq!(
            s.bridge.transition_timeout(Event::Configure),
            Duration::from_secs(9)
        );
        assert_eq!(s.bridge.control_ports, 50000..=50099);
        let flags = DaemonArgs {
            config: Some(yaml),
            deploy_timeout: Some(3),
            transition_timeouts: vec!["START=4".into()],
            lease: DaemonLease {
                no_leader_election: true,
                ..Default::default()
            },
            insecure_no_auth: true,
            ..Default::default()
        };
        let s = resolve(flags).expect("flags");
        assert_eq!(s.bridge.deploy_timeout, Duration::from_secs(3));
        assert_eq!(
            s.bridge.transition_timeout(Event::Start),
            Duration::from_secs(4)
        );

        let (_d, toml) = write(
            "d.toml",
            "namespace = \"runs\"\nkill-timeout = 5\n[transition-timeouts]\nSTOP = 11\n",
        );
        let s = resolve(DaemonArgs {
            config: Some(toml),
            lease: DaemonLease {
                no_leader_election: true,
                ..Default::default()
            },
            insecure_no_auth: true,
            ..Default::default()
        })
        .expect("toml");
        assert_eq!(
            s.bridge.namespaces,
            NamespaceMode::Fixed {
                namespace: "runs".into()
            }
        );
        assert_eq!(s.bridge.kill_timeout, Duration::from_secs(5));
        assert_eq!(
            s.bridge.transition_timeout(Event::Stop),
            Duration::from_secs(11)
        );
    }

    #[test]
    fn bad_settings_are_refused_with_the_reason() {
        let (_d, bad) = write("d.yaml", "listn: 1.2.3.4:1\n");
        let e = resolve(DaemonArgs {
            config: Some(bad),
            ..Default::default()
        })
        .err()
        .expect("unknown key");
        assert!(e.contains("listn"), "{e}");
        let e = resolve(DaemonArgs::default()).err().expect("no auth");
        assert!(e.contains("--insecure-no-auth on loopback only"), "{e}");
        let open = DaemonArgs {
            listen: Some("0.0.0.0:50061".parse().expect("addr")),
            insecure_no_auth: true,
            ..Default::default()
        };
        let e = resolve(open).err().expect("insecure");
        assert!(e.contains("without both a bearer token and TLS"), "{e}");
        let e = resolve(DaemonArgs {
            transition_timeouts: vec!["LAUNCH=3".into()],
            ..Default::default()
        })
        .err()
        .expect("event");
        assert!(e.contains("LAUNCH"), "{e}");
        assert!(port_range("9-3").is_err());
        let e = resolve(DaemonArgs {
            insecure_no_auth: true,
            jit_generator_deadline: Some(5),
            ..Default::default()
        })
        .err()
        .expect("a deadline without a generator");
        assert!(e.contains("need a jit-generator"), "{e}");
    }

    #[test]
    fn the_o2control_listener_needs_client_certificates_beyond_loopback() {
        let on = |addr: &str, role: Option<Role>| DaemonArgs {
            insecure_no_auth: true,
            o2control_listen: Some(addr.parse().expect("addr")),
            o2control_role: role,
            ..Default::default()
        };
        let s = resolve(on("127.0.0.1:47999", None)).expect("loopback");
        let o2 = s.server.o2control.expect("configured");
        assert_eq!((o2.addr.port(), o2.role), (47999, Role::Viewer));
        let s = resolve(on("[::1]:47999", Some(Role::Operator))).expect("loopback");
        assert_eq!(s.server.o2control.expect("configured").role, Role::Operator);
        let e = resolve(on("0.0.0.0:47999", None))
            .err()
            .expect("beyond loopback");
        assert!(
            e.contains("requires TLS with client certificates")
                && e.contains("--o2control-client-ca"),
            "{e}"
        );
        let e = resolve(DaemonArgs {
            insecure_no_auth: true,
            o2control_client_ca: Some("ca.pem".into()),
            ..Default::default()
        })
        .err()
        .expect("a client CA without a listener");
        assert!(e.contains("needs o2control-listen"), "{e}");
        let e = resolve(DaemonArgs {
            insecure_no_auth: true,
            o2control_role: Some(Role::Operator),
            ..Default::default()
        })
        .err()
        .expect("a role without a listener");
        assert!(e.contains("needs o2control-listen"), "{e}");
        assert!(
            resolve(DaemonArgs {
                insecure_no_auth: true,
                ..Default::default()
            })
            .expect("resolve")
            .server
            .o2control
            .is_none()
        );
    }

    #[test]
    fn jit_settings_reach_the_renders() {
        let s = resolve(DaemonArgs {
            insecure_no_auth: true,
            jit_dir: Some("/repo/jit".into()),
            jit_generator: Some("/site/generate".into()),
            jit_generator_deadline: Some(4),
            jit_generator_max_bytes: Some(1000),
            ..Default::default()
        })
        .expect("resolve");
        assert_eq!(s.bridge.jit.dir, Some(PathBuf::from("/repo/jit")));
        let g = s.bridge.jit.generator.expect("a generator");
        assert_eq!(g.program, PathBuf::from("/site/generate"));
        assert_eq!(g.deadline, Duration::from_secs(4));
        assert_eq!(g.max_bytes, 1000);
        let s = resolve(DaemonArgs {
            insecure_no_auth: true,
            ..Default::default()
        })
        .expect("resolve");
        assert!(s.bridge.jit.dir.is_none() && s.bridge.jit.generator.is_none());
    }

    #[test]
    fn the_shipped_deployment_config_parses() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/manifests/deploy/base/daemon-deployment.yaml"
        ))
        .expect("manifest");
        let block: String = text
            .split("daemon.yaml: |\n")
            .nth(1)
            .expect("config block")
            .lines()
            .take_while(|l| l.starts_with("    "))
            .map(|l| format!("{}\n", &l[4..]))
            .collect();
        let f: DaemonArgs = serde_saphyr::from_str(&block).expect("parses");
        assert_eq!(f.namespace_prefix.as_deref(), Some("envbridge-env-"));
        assert!(f.transition_timeouts.contains(&"CONFIGURE=120".to_string()));
    }
}

//! `envbridge operator` settings: flags, each also settable by an environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use super::pod::PodSettings;
use crate::launch::lease::OperatorLease;
use crate::launch::legacy_env::Renamed;

#[derive(clap::Args, Debug, Clone)]
pub struct OperatorArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "ENVBRIDGE_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,
    /// Reconcile only the environments labelled `envbridge.dev/shard=SHARD` (and their
    /// objects); without it, only those with no shard label. Each shard elects its own
    /// leader (Lease `envbridge-operator-SHARD` unless --lease-name is given).
    #[arg(long, env = "ENVBRIDGE_OPERATOR_SHARD", value_name = "SHARD", value_parser = crate::crd::shard::parse)]
    pub shard: Option<String>,
    /// Tasks reconciled at once (pods created, control calls in flight); 0 = unbounded.
    #[arg(long, env = "ENVBRIDGE_TASK_CONCURRENCY", default_value_t = 256)]
    pub task_concurrency: u16,
    /// Environments reconciled at once; 0 = unbounded.
    #[arg(long, env = "ENVBRIDGE_ENV_CONCURRENCY", default_value_t = 8)]
    pub env_concurrency: u16,
    /// Apiserver requests in flight at once, at most, each until its answer is read whole
    /// (one HTTP/1.1 connection each); watches and followed logs take no place.
    #[arg(long, env = "ENVBRIDGE_APISERVER_IN_FLIGHT", default_value_t = crate::launch::in_flight::IN_FLIGHT)]
    pub apiserver_in_flight: usize,
    /// Task object writes in flight per environment reconcile.
    #[arg(long, env = "ENVBRIDGE_APPLY_CONCURRENCY", default_value_t = 64)]
    pub apply_concurrency: usize,
    /// Port of each task's headless discovery Service (`headless_discovery_port`).
    #[arg(
        long,
        env = "ENVBRIDGE_HEADLESS_DISCOVERY_PORT",
        default_value_t = 47000
    )]
    pub headless_discovery_port: u16,
    /// `HOME` of a task process = this + `/` + its user.
    #[arg(long, env = "ENVBRIDGE_HOME_BASE", default_value = "/home")]
    pub home_base: String,
    /// `USER` of task processes whose reference names none.
    #[arg(long, env = "ENVBRIDGE_DEFAULT_USER", default_value = "flp")]
    pub default_user: String,
    /// FairMQ OCC plugin directory (`-S <dir>/lib/`).
    #[arg(
        long,
        env = "ENVBRIDGE_FAIRMQ_PLUGIN_DIR",
        default_value = "$(CONTROL_OCCPLUGIN_ROOT)"
    )]
    pub fairmq_plugin_dir: String,
    /// Per-call control deadline, seconds, for tasks without `timeoutSeconds`.
    #[arg(long, env = "ENVBRIDGE_CONTROL_TIMEOUT", default_value_t = 30)]
    pub control_timeout_seconds: u32,
    /// How long a Running pod's control port may stay unreachable before the task is ERROR, seconds.
    #[arg(long, env = "ENVBRIDGE_CONNECT_TIMEOUT", default_value_t = 30)]
    pub connect_timeout_seconds: u32,
    /// Do not follow task processes between transitions: a task that fails while RUNNING is
    /// then seen at the next transition only (for measuring what live state costs).
    #[arg(long, env = "ENVBRIDGE_NO_LIVE_STATE")]
    pub no_live_state: bool,
    /// How long a task's pod may take to be Running before the task fails with the pod's
    /// own Warning events (FailedScheduling, image pull errors, ...), seconds.
    #[arg(long, env = "ENVBRIDGE_STARTUP_TIMEOUT", default_value_t = 120)]
    pub startup_timeout_seconds: u32,
    /// How long a deleted task's process gets to go out in order (STOP, RESET, EXIT; FairMQ:
    /// STOP, RESET TASK, RESET DEVICE, END) before its pod is deleted anyway, seconds.
    #[arg(long, env = "ENVBRIDGE_SHUTDOWN_TIMEOUT", default_value_t = 15)]
    pub shutdown_timeout_seconds: u32,
    /// How long a deleted pod may stay Terminating (its node's kubelet does not confirm)
    /// before the operator removes it by force, seconds.
    #[arg(long, env = "ENVBRIDGE_POD_DELETION_TIMEOUT", default_value_t = 60)]
    pub pod_deletion_timeout_seconds: u32,
    /// Keep pods whose process ended (failed or done) for debugging, instead of deleting them.
    #[arg(long, env = "ENVBRIDGE_KEEP_PODS")]
    pub keep_pods: bool,
    /// While an Environment's tasks are still answering, its status (counts, ready) is
    /// written at most once per this many milliseconds (or a quarter of a millisecond per
    /// task, when that is more); an outcome (a new state, a transition's end) is written at
    /// once.
    #[arg(long, env = "ENVBRIDGE_STATUS_DEBOUNCE_MS", default_value_t = 250)]
    pub status_debounce_ms: u64,
    /// Where `/metrics`, `/healthz` and `/readyz` listen (loopback by default; in a cluster
    /// give the pod IP or 0.0.0.0; port 0 picks a free one).
    #[arg(
        long,
        env = "ENVBRIDGE_OPERATOR_METRICS_LISTEN",
        default_value = "127.0.0.1:9465"
    )]
    pub metrics_listen: SocketAddr,
    #[command(flatten)]
    pub lease: OperatorLease,
    /// Log as JSON lines.
    #[arg(long, env = "ENVBRIDGE_LOG_JSON")]
    pub log_json: bool,
}

impl Default for OperatorArgs {
    fn default() -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            args: OperatorArgs,
        }
        // No flags given: every field takes its declared default.
        Wrap::parse_from(["operator"]).args
    }
}

impl OperatorArgs {
    /// Fills what flags and `ENVBRIDGE_OPERATOR_*` left unset from the unprefixed variable
    /// names of earlier versions (shared with the daemon), noting each in `renamed`.
    pub fn with_renamed(mut self, renamed: &mut Renamed) -> Self {
        self.namespace = renamed.read(
            self.namespace,
            "ENVBRIDGE_NAMESPACE",
            "ENVBRIDGE_OPERATOR_NAMESPACE",
        );
        let c = self.lease.choice().renamed(OperatorLease::PREFIX, renamed);
        self.lease = OperatorLease::from_choice(c);
        self
    }

    pub fn pod_settings(&self) -> PodSettings {
        PodSettings {
            home_base: self.home_base.clone(),
            default_user: self.default_user.clone(),
            fairmq_plugin_dir: self.fairmq_plugin_dir.clone(),
        }
    }

    /// The Lease replicas of this operator (its shard) elect a leader with by default.
    pub fn default_lease_name(&self) -> String {
        match &self.shard {
            Some(s) => format!("envbridge-operator-{s}"),
            None => "envbridge-operator".to_string(),
        }
    }

    pub fn control_deadline(&self, task_timeout: Option<u32>) -> Duration {
        Duration::from_secs(u64::from(
            task_timeout.unwrap_or(self.control_timeout_seconds).max(1),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_listen_is_loopback_unless_given() {
        let d = OperatorArgs::default().metrics_listen;
        assert_eq!(d, "127.0.0.1:9465".parse().unwrap());
        assert!(d.ip().is_loopback());
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            args: OperatorArgs,
        }
        let w = Wrap::parse_from(["operator", "--metrics-listen", "0.0.0.0:9465"]);
        assert!(w.args.metrics_listen.ip().is_unspecified());
    }
}

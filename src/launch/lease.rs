//! Leader election over a Lease, the same for the daemon and the operator: only the holder
//! writes. The flags are one definition; each process reads them under its own variable
//! prefix, so that one shared environment never makes the two contend for one Lease.

use std::time::Duration;

use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::legacy_env::Renamed;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// Seconds a lease lasts without renewal; `grace` must be smaller and non-zero.
    pub duration: u64,
    pub grace: u64,
    /// The field manager of the Lease writes.
    pub field_manager: String,
}

impl LeaseConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.duration == 0 || self.grace == 0 || self.grace >= self.duration {
            return Err(format!(
                "lease duration ({}) must be greater than the grace period ({}), both non-zero",
                self.duration, self.grace
            ));
        }
        Ok(())
    }
}

/// The lease flags as given (flags, then the process's prefixed variables).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseChoice {
    pub no_leader_election: bool,
    pub lease_name: Option<String>,
    pub lease_namespace: Option<String>,
    pub identity: Option<String>,
    /// Seconds the Lease lasts without renewal (None: [`DEFAULT_LEASE_SECONDS`]).
    pub lease_duration: Option<u64>,
}

/// How long a Lease lasts without renewal by default: a standby takes over at most this long
/// after the leader dies.
pub const DEFAULT_LEASE_SECONDS: u64 = 15;

impl LeaseChoice {
    /// Fills what the flags and `prefix`ed variables left unset from the unprefixed names
    /// they replace (noted in `renamed`, to be logged).
    pub fn renamed(mut self, prefix: &str, renamed: &mut Renamed) -> Self {
        let new = |k: &str| format!("{prefix}{k}");
        self.no_leader_election = renamed.flag(
            self.no_leader_election,
            "ENVBRIDGE_NO_LEADER_ELECTION",
            &new("NO_LEADER_ELECTION"),
        );
        self.lease_name = renamed.read(self.lease_name, "ENVBRIDGE_LEASE_NAME", &new("LEASE_NAME"));
        self.lease_namespace = renamed.read(
            self.lease_namespace,
            "ENVBRIDGE_LEASE_NAMESPACE",
            &new("LEASE_NAMESPACE"),
        );
        self.identity = renamed.read(self.identity, "ENVBRIDGE_IDENTITY", &new("IDENTITY"));
        self
    }

    /// The Lease to hold, None without election.
    pub fn config(
        self,
        default_name: &str,
        field_manager: &str,
    ) -> Result<Option<LeaseConfig>, String> {
        if self.no_leader_election {
            return Ok(None);
        }
        let cfg = LeaseConfig {
            namespace: self
                .lease_namespace
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .unwrap_or_else(|| "default".into()),
            name: self.lease_name.unwrap_or_else(|| default_name.to_string()),
            identity: self
                .identity
                .or_else(|| std::env::var("POD_NAME").ok())
                .unwrap_or_else(default_identity),
            duration: self.lease_duration.unwrap_or(DEFAULT_LEASE_SECONDS),
            // Renew a third of the way before the end: two renewals may fail before it lapses.
            grace: (self.lease_duration.unwrap_or(DEFAULT_LEASE_SECONDS) / 3).max(1),
            field_manager: field_manager.to_string(),
        };
        cfg.check()?;
        Ok(Some(cfg))
    }
}

/// The lease flags of one process, each with its variable under `$prefix`.
macro_rules! lease_args {
    ($name:ident, $prefix:literal) => {
        #[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
        pub struct $name {
            /// Run without leader election (a single replica).
            #[arg(long, env = concat!($prefix, "NO_LEADER_ELECTION"))]
            pub no_leader_election: bool,
            /// Name of the Lease.
            #[arg(long, env = concat!($prefix, "LEASE_NAME"))]
            pub lease_name: Option<String>,
            /// Namespace of the Lease (default: POD_NAMESPACE, else `default`).
            #[arg(long, env = concat!($prefix, "LEASE_NAMESPACE"))]
            pub lease_namespace: Option<String>,
            /// This replica's identity in the Lease (default: POD_NAME, else host name + pid).
            #[arg(long, env = concat!($prefix, "IDENTITY"))]
            pub identity: Option<String>,
            /// Seconds the Lease lasts without renewal: a standby takes over at most this
            /// long after the leader dies (default 15, at least 2).
            #[arg(long, env = concat!($prefix, "LEASE_DURATION"), value_parser = clap::value_parser!(u64).range(2..=3600))]
            pub lease_duration: Option<u64>,
        }

        impl $name {
            pub const PREFIX: &str = $prefix;

            /// The group as `c` resolved it (e.g. after [`LeaseChoice::renamed`]).
            pub fn from_choice(c: LeaseChoice) -> Self {
                $name {
                    no_leader_election: c.no_leader_election,
                    lease_name: c.lease_name,
                    lease_namespace: c.lease_namespace,
                    identity: c.identity,
                    lease_duration: c.lease_duration,
                }
            }

            pub fn choice(&self) -> LeaseChoice {
                LeaseChoice {
                    no_leader_election: self.no_leader_election,
                    lease_name: self.lease_name.clone(),
                    lease_namespace: self.lease_namespace.clone(),
                    identity: self.identity.clone(),
                    lease_duration: self.lease_duration,
                }
            }
        }
    };
}

lease_args!(DaemonLease, "ENVBRIDGE_DAEMON_");
lease_args!(OperatorLease, "ENVBRIDGE_OPERATOR_");

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

/// Keeps `leading` equal to "this replica holds the lease" until `stop`, retrying when the
/// lease manager fails; the lease is released on the way out.
pub async fn hold(
    client: kube::Client,
    cfg: LeaseConfig,
    leading: watch::Sender<bool>,
    stop: CancellationToken,
) {
    leading.send_replace(false);
    while !stop.is_cancelled() {
        let manager = LeaseManagerBuilder::new(client.clone(), &cfg.name)
            .with_namespace(&cfg.namespace)
            .with_identity(&cfg.identity)
            .with_duration(cfg.duration)
            .with_grace(cfg.grace)
            .with_field_manager(&cfg.field_manager)
            .build()
            .await;
        let manager = match manager {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, lease = cfg.name, "lease manager could not start, retrying");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => continue,
                }
            }
        };
        let (mut rx, task) = manager.watch().await;
        loop {
            let now = *rx.borrow_and_update();
            if leading.send_replace(now) != now {
                tracing::info!(
                    identity = cfg.identity,
                    lease = cfg.name,
                    leading = now,
                    "leadership"
                );
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                changed = rx.changed() => if changed.is_err() { break },
            }
        }
        leading.send_replace(false);
        drop(rx); // releases the lease
        match task.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "lease manager stopped"),
            Err(e) => tracing::warn!(error = %e, "lease task failed"),
        }
        if !stop.is_cancelled() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    leading.send_replace(false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_process_reads_its_own_prefix() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Both {
            #[command(flatten)]
            d: DaemonLease,
        }
        let cmd = <Both as clap::CommandFactory>::command();
        let envs: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
            .collect();
        assert!(
            envs.iter().all(|e| e.starts_with("ENVBRIDGE_DAEMON_")),
            "{envs:?}"
        );
        let parsed = Both::parse_from(["x", "--lease-name", "l1", "--identity", "me"]);
        let cfg = parsed
            .d
            .choice()
            .renamed(DaemonLease::PREFIX, &mut Renamed::default())
            .config("envbridge-daemon", "fm")
            .unwrap()
            .unwrap();
        assert_eq!((cfg.name.as_str(), cfg.identity.as_str()), ("l1", "me"));
        assert_eq!((cfg.duration, cfg.grace), (DEFAULT_LEASE_SECONDS, 5));
        let short = Both::parse_from(["x", "--lease-duration", "6"])
            .d
            .choice()
            .config("n", "fm")
            .unwrap()
            .unwrap();
        assert_eq!((short.duration, short.grace), (6, 2));
        assert!(Both::try_parse_from(["x", "--lease-duration", "1"]).is_err());
        assert_eq!(OperatorLease::PREFIX, "ENVBRIDGE_OPERATOR_");
        let off = LeaseChoice {
            no_leader_election: true,
            ..LeaseChoice::default()
        };
        assert_eq!(off.config("n", "fm").unwrap(), None);
    }
}

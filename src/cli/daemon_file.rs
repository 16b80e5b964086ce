//! The daemon's config file (YAML or TOML): read into [`DaemonArgs`] itself, then given way to
//! by what flags and environment variables set ([`DaemonArgs::over_file`]).
//!
//! The file's keys are the flags' long names in kebab-case, except `integrations`
//! (`--integration`), `caller-variables` (`--allow-variable`) and `leader-election`
//! (`--no-leader-election`, inverted). Where a key's shape differs from its flag's (a map for a
//! repeated `PLUGIN=URL` or `EVENT=SECONDS`, a `FIRST-LAST` or `NAMESPACE/NAME` string), an
//! adapter below reads it with the flag's own parser.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::{Deserialize, Deserializer, Error as _};

use super::daemon::DaemonArgs;
use super::daemon_values::{namespaced_name, o2control_role as role, plugin_endpoint, port_range};

/// The settings a config file gives; an unknown key is refused, naming it.
pub fn load_file(path: &Path) -> Result<DaemonArgs, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let toml = path.extension().is_some_and(|e| e == "toml");
    if toml {
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    } else {
        serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// How a value that flags or environment variables gave combines with the file's.
trait OrFile {
    fn or_file(self, file: Self) -> Self;
}

impl<T> OrFile for Option<T> {
    fn or_file(self, file: Self) -> Self {
        self.or(file)
    }
}

/// Lists add up, the file's entries first: for a keyed entry (`PLUGIN=URL`, `EVENT=SECONDS`)
/// the flag's comes later and wins.
impl<T> OrFile for Vec<T> {
    fn or_file(mut self, mut file: Self) -> Self {
        file.append(&mut self);
        file
    }
}

impl DaemonArgs {
    /// These settings (flags, then environment variables, then the older variable names)
    /// over the config file's: the one merge step, every file key listed once.
    pub fn over_file(mut self, file: DaemonArgs) -> DaemonArgs {
        macro_rules! or_file {
            ($($field:ident),* $(,)?) => {
                $( self.$field = self.$field.or_file(file.$field); )*
            };
        }
        or_file!(
            listen,
            metrics_listen,
            token_file,
            tls_cert,
            tls_key,
            o2control_listen,
            o2control_role,
            o2control_run_numbers,
            o2control_client_ca,
            namespace,
            namespace_prefix,
            watch_namespace,
            shard,
            tasks_dir,
            workflows_dir,
            config_store,
            config_map,
            integrations,
            templates,
            allow_variables,
            max_hosts,
            max_tasks,
            render_deadline,
            jit_dir,
            jit_generator,
            jit_generator_deadline,
            jit_generator_max_bytes,
            control_ports,
            tcp_ports,
            deploy_timeout,
            destroy_timeout,
            kill_timeout,
            namespace_gone_timeout,
            namespace_active_timeout,
            transition_timeouts,
            default_transition_timeout,
            orphan_grace,
            log_format,
        );
        // The lease group's keys (see DaemonArgs::file_lease_name); `leader-election: false`
        // is `--no-leader-election`.
        self.lease.no_leader_election |= file.file_leader_election == Some(false);
        self.lease.lease_name = self.lease.lease_name.or_file(file.file_lease_name);
        self.lease.lease_namespace = self
            .lease
            .lease_namespace
            .or_file(file.file_lease_namespace);
        // Site profiles are layered in their order: a list given by flags replaces the file's.
        if self.defaults.is_empty() {
            self.defaults = file.defaults;
        }
        self
    }
}

/// `KEY: "TEXT"` read by the flag's parser; an error names the key (the format adds where).
fn by_flag_parser<'de, D, T>(
    d: D,
    key: &str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
{
    Option::<String>::deserialize(d)?
        .map(|s| parse(&s).map_err(|e| D::Error::custom(format!("{key}: {e}"))))
        .transpose()
}

/// `control-ports: FIRST-LAST`.
pub fn control_ports<'de, D: Deserializer<'de>>(d: D) -> Result<Option<(u16, u16)>, D::Error> {
    by_flag_parser(d, "control-ports", port_range)
}

/// `tcp-ports: FIRST-LAST`.
pub fn tcp_ports<'de, D: Deserializer<'de>>(d: D) -> Result<Option<(u16, u16)>, D::Error> {
    by_flag_parser(d, "tcp-ports", port_range)
}

/// `o2control-role: viewer|operator`.
pub fn o2control_role<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<envbridge::server::auth::Role>, D::Error> {
    by_flag_parser(d, "o2control-role", role)
}

/// `shard: NAME`, checked as `--shard` is.
pub fn shard<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    by_flag_parser(d, "shard", envbridge::crd::shard::parse)
}

/// `o2control-run-numbers: NAMESPACE/NAME` or an `http://` URL.
pub fn o2control_run_numbers<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<envbridge::bridge::run_numbers::Source>, D::Error> {
    by_flag_parser(d, "o2control-run-numbers", str::parse)
}

/// `config-map: NAMESPACE/NAME`.
pub fn config_map<'de, D: Deserializer<'de>>(d: D) -> Result<Option<(String, String)>, D::Error> {
    by_flag_parser(d, "config-map", namespaced_name)
}

/// `integrations: {PLUGIN: URL, ...}`, each entry checked as `--integration PLUGIN=URL` is.
pub fn integrations<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
    BTreeMap::<String, String>::deserialize(d)?
        .into_iter()
        .map(|(plugin, url)| {
            plugin_endpoint(&format!("{plugin}={url}"))
                .map_err(|e| D::Error::custom(format!("integrations: {e}")))
        })
        .collect()
}

/// `transition-timeouts: {EVENT: SECONDS, ...}` as the flag's `EVENT=SECONDS` entries, which
/// resolve() reads with one parser whatever their source.
pub fn transition_timeouts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(BTreeMap::<String, u64>::deserialize(d)?
        .into_iter()
        .map(|(event, secs)| format!("{event}={secs}"))
        .collect())
}

#[cfg(test)]
#[path = "daemon_file_tests.rs"]
mod tests;

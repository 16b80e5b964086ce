//! The task SIMULATOR: a process that implements the task control service with the real state
//! machines (direct or FairMQ), with configurable delays and injected failures. Used by the
//! demo, the tests and the benchmarks in place of real DAQ processes; it runs no workload.

pub mod as_task;
pub mod cli;
pub mod config;
pub mod machine;
pub mod server;

pub use cli::{TaskSimArgs, run};
pub use config::{SimConfig, SimMode};
pub use server::{SimError, Simulator, bind, serve};

/// The `unix_ms` of the last change a simulator made by itself (its injected move to ERROR,
/// `--fail-in`) in its log `text`: the last one, as a later pod of the same name appends to
/// the same file. Read by the demo and the tests to time how fast the failure shows.
pub fn last_self_error_ms(text: &str) -> Option<u64> {
    text.lines()
        .rev()
        .filter(|l| l.contains("task simulator moves itself"))
        .find_map(|l| {
            let v = l.split("unix_ms=").nth(1)?;
            v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_last_self_inflicted_change_is_read_from_the_log() {
        let log = "\
2026-12-01T23:35:25Z  WARN envbridge::control::sim::server: task simulator moves itself from RUNNING to ERROR after 2s (injected, --fail-in) unix_ms=1000
2026-12-01T23:35:26Z  INFO envbridge::control::sim::server: other unix_ms=5
2026-12-01T23:35:27Z  WARN envbridge::control::sim::server: task simulator moves itself from RUNNING to ERROR after 2s (injected, --fail-in) unix_ms=2000
";
        assert_eq!(super::last_self_error_ms(log), Some(2000));
        assert_eq!(super::last_self_error_ms("nothing here"), None);
    }
}

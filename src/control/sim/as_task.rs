//! The simulator started under an anchor task's command path (`/opt/o2/bin/StfBuilder` in
//! the envbridge image is a link to envbridge): the rendered command line runs unmodified
//! and a simulator answers in the class's control mode, on the pod's address and control
//! port, as the real process would. The anchor's own arguments are logged, not obeyed.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

use super::cli::{EXIT_USAGE, TaskSimArgs};

/// Basenames of the anchor's command paths the image links to envbridge.
pub const ANCHOR_COMMANDS: &[&str] = &[
    "o2-readout-exe",
    "StfBuilder",
    "StfSender",
    "o2-dpl-raw-proxy",
    "o2-qc",
    "o2-dpl-run",
    "o2-task",
];

/// Whether `argv0` names one of [`ANCHOR_COMMANDS`].
pub fn is_anchor_command(argv0: &std::ffi::OsStr) -> bool {
    std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| ANCHOR_COMMANDS.contains(&n))
}

#[derive(Parser, Debug)]
struct AsTask {
    #[command(flatten)]
    sim: TaskSimArgs,
}

/// What a task's environment asks for: the simulator's own arguments, or None for a task
/// with no control protocol (basic, hook), which runs to completion at once.
pub fn sim_argv(env: impl Fn(&str) -> Option<String>) -> Result<Option<Vec<String>>, String> {
    let mode = env("ENVBRIDGE_CONTROL_MODE").unwrap_or_else(|| "direct".into());
    let mode = match mode.as_str() {
        "direct" | "fairmq" => mode,
        "basic" | "hook" => return Ok(None),
        other => {
            return Err(format!(
                "ENVBRIDGE_CONTROL_MODE={other:?} is not a control mode"
            ));
        }
    };
    let ip = env("POD_IP")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = env("OCC_CONTROL_PORT")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| super::cli::DEFAULT_CONTROL_PORT.to_string());
    let listen = match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
        Ok(v4) => format!("{v4}:{port}"),
        Err(_) => return Err(format!("POD_IP={ip:?} is not an address")),
    };
    Ok(Some(vec![
        "task-sim".into(),
        "--mode".into(),
        mode,
        "--listen".into(),
        listen,
    ]))
}

/// Run as the anchor command `argv[0]`.
pub fn run(args: Vec<OsString>) -> ExitCode {
    let name = args.first().cloned().unwrap_or_default();
    let rest: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    eprintln!(
        "envbridge task simulator as {} (arguments not obeyed: {})",
        name.to_string_lossy(),
        rest.join(" ")
    );
    match sim_argv(|k| std::env::var(k).ok()) {
        Ok(Some(argv)) => match AsTask::try_parse_from(argv) {
            Ok(a) => super::cli::run(a.sim),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_USAGE)
            }
        },
        Ok(None) => {
            eprintln!("no control protocol: done");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_pod_address_port_and_mode_choose_the_simulator() {
        let argv = sim_argv(env(&[
            ("ENVBRIDGE_CONTROL_MODE", "fairmq"),
            ("POD_IP", "127.3.0.2"),
            ("OCC_CONTROL_PORT", "47101"),
        ]))
        .expect("ok")
        .expect("a simulator");
        assert_eq!(
            argv[1..],
            ["--mode", "fairmq", "--listen", "127.3.0.2:47101"]
        );
        assert!(AsTask::try_parse_from(argv).is_ok());
        assert_eq!(
            sim_argv(env(&[("ENVBRIDGE_CONTROL_MODE", "hook")])),
            Ok(None)
        );
        assert!(sim_argv(env(&[("ENVBRIDGE_CONTROL_MODE", "x")])).is_err());
        assert!(sim_argv(env(&[("POD_IP", "nope")])).is_err());
    }

    #[test]
    fn anchor_paths_are_recognised_by_basename() {
        assert!(is_anchor_command("/opt/o2/bin/StfBuilder".as_ref()));
        assert!(is_anchor_command("o2-readout-exe".as_ref()));
        assert!(!is_anchor_command("/usr/local/bin/envbridge".as_ref()));
    }
}

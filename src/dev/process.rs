//! Starting and stopping the component processes. Each component leads its own process
//! group so that `dev down` can signal it together with anything it forked.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::error::{DevError, IoContext, Result};
use super::state::Component;

/// A free TCP port on 127.0.0.1 (asked from the kernel, then released).
pub fn free_port() -> Result<u16> {
    free_port_on(Ipv4Addr::LOCALHOST)
}

/// A free TCP port on `ip` (asked from the kernel, then released).
pub fn free_port_on(ip: Ipv4Addr) -> Result<u16> {
    let at = SocketAddr::from((ip, 0));
    let l = std::net::TcpListener::bind(at).ctx("binding", at.to_string())?;
    let port = l
        .local_addr()
        .ctx("reading the address of", at.to_string())?
        .port();
    Ok(port)
}

/// True when something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_open(port: u16) -> bool {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Start `binary args` detached in its own process group, stdout and stderr appended to
/// `log`. Returns the pid (== pgid).
pub fn spawn(binary: &Path, args: &[String], log: &Path, cwd: &Path) -> Result<u32> {
    spawn_with_env(binary, args, log, cwd, &[])
}

/// [`spawn`] with extra environment variables for the child.
pub fn spawn_with_env(
    binary: &Path,
    args: &[String],
    log: &Path,
    cwd: &Path,
    env: &[(&str, &str)],
) -> Result<u32> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .ctx("opening the log", log)?;
    let err = out.try_clone().ctx("opening the log", log)?;
    let child = Command::new(binary)
        .args(args)
        .current_dir(cwd)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .ctx("starting", binary)?;
    Ok(child.id())
}

/// Reap exited children of ours in process group `pgid` (only the groups we created, so
/// other children of a test process keep their exit statuses).
fn reap(pgid: u32) {
    let Ok(pgid) = i32::try_from(pgid) else {
        return;
    };
    loop {
        let mut status = 0;
        // SAFETY: waitpid with WNOHANG on our own process group; ECHILD when not ours.
        let pid = unsafe { libc::waitpid(-pgid, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            break;
        }
    }
}

/// True when `pid` runs `binary` (guards against a recycled pid) and is not a zombie.
pub fn alive(pid: u32, binary: &Path) -> bool {
    reap(pid);
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else {
        return false;
    };
    // Field 3, after the parenthesised command name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    if matches!(state, Some("Z") | Some("X") | None) {
        return false;
    }
    match std::fs::read_link(proc_dir.join("exe")) {
        Ok(exe) => {
            let exe = exe.to_string_lossy();
            let exe = exe.trim_end_matches(" (deleted)");
            let want = std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_path_buf());
            Path::new(exe) == want
        }
        Err(_) => false,
    }
}

fn group_exists(pgid: u32) -> bool {
    let Ok(pgid) = i32::try_from(pgid) else {
        return false;
    };
    // SAFETY: signal 0 only checks for existence/permission.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

fn signal_group(pgid: u32, sig: i32) {
    if let Ok(pgid) = i32::try_from(pgid) {
        // SAFETY: sends a signal to the process group we created; errors (ESRCH) are fine.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

/// SIGTERM every group at once, wait up to `grace` for all to exit, then SIGKILL what is
/// left and wait until it is gone. Returns the groups that needed SIGKILL.
pub fn stop_groups(pgids: &[u32], grace: Duration) -> Vec<u32> {
    let live: Vec<u32> = pgids
        .iter()
        .copied()
        .filter(|p| {
            reap(*p);
            group_exists(*p)
        })
        .collect();
    for p in &live {
        signal_group(*p, libc::SIGTERM);
    }
    let remaining = |groups: &[u32]| -> Vec<u32> {
        groups
            .iter()
            .copied()
            .filter(|p| {
                reap(*p);
                group_exists(*p)
            })
            .collect()
    };
    let deadline = Instant::now() + grace;
    let mut left = remaining(&live);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left = remaining(&left);
    }
    for p in &left {
        signal_group(*p, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut dying = remaining(&left);
    while !dying.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        dying = remaining(&dying);
    }
    left
}

/// Last `lines` lines of a log file, for error messages.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The error for a component that failed to start: `what` went wrong, with its log's tail.
pub fn died(c: &Component, what: &str) -> DevError {
    DevError::Start {
        component: c.name.clone(),
        reason: format!("{what}; last log lines:\n{}", log_tail(&c.log, 20)),
        log: c.log.clone(),
    }
}

/// Waits, polling every 100 ms, until the just-started `c` is `ready` (its port open, its
/// socket there); an error with its log's tail as soon as it exits, or when `within` has
/// passed without it ("no {what} after ...").
pub async fn wait_started(
    c: &Component,
    what: &str,
    within: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + within;
    while !ready() {
        if !alive(c.pid, &c.binary) {
            return Err(died(c, "exited"));
        }
        if Instant::now() > deadline {
            return Err(died(c, &format!("no {what} after {within:?}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawned_group_is_seen_alive_then_stopped() {
        let dir = tempfile::tempdir().expect("tmp");
        let log = dir.path().join("sleep.log");
        let sh = Path::new("/bin/sh");
        // A shell that forks a child: stopping the group must take both.
        let args = vec![
            "-c".to_string(),
            "sleep 60 & echo started; wait".to_string(),
        ];
        let pid = spawn(sh, &args, &log, dir.path()).expect("spawn");
        assert!(alive(pid, sh), "not alive");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !log_tail(&log, 5).contains("started") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(log_tail(&log, 5).contains("started"), "output not logged");
        assert!(!alive(pid, Path::new("/bin/true")), "wrong binary accepted");
        stop_groups(&[pid], Duration::from_secs(5));
        assert!(!group_exists(pid), "group survived");
        assert!(!alive(pid, sh));
    }

    /// A started process: `sh -c script`, logging to its own file in `dir`.
    fn started(dir: &Path, script: &str) -> Component {
        let sh = Path::new("/bin/sh");
        let log = dir.join("c.log");
        let pid = spawn(sh, &["-c".into(), script.into()], &log, dir).expect("spawn");
        Component {
            name: "c".into(),
            pid,
            binary: std::fs::canonicalize(sh).expect("sh"),
            log,
        }
    }

    #[tokio::test]
    async fn waiting_for_a_start_ends_ready_exited_or_late_with_the_log() {
        let dir = tempfile::tempdir().expect("tmp");
        let mark = dir.path().join("ready");
        let c = started(
            dir.path(),
            &format!("sleep 0.3; touch {}; sleep 60", mark.display()),
        );
        wait_started(&c, "mark", Duration::from_secs(10), || mark.exists())
            .await
            .expect("ready");
        stop_groups(&[c.pid], Duration::from_secs(5));

        let c = started(dir.path(), "echo bad flag; exit 3");
        let e = wait_started(&c, "mark", Duration::from_secs(10), || false)
            .await
            .expect_err("it exited")
            .to_string();
        assert!(e.contains("exited") && e.contains("bad flag"), "{e}");

        let c = started(dir.path(), "echo waiting; sleep 60");
        let e = wait_started(&c, "mark", Duration::from_millis(300), || false)
            .await
            .expect_err("never ready")
            .to_string();
        assert!(e.contains("no mark after 300ms"), "{e}");
        stop_groups(&[c.pid], Duration::from_secs(5));
    }

    #[test]
    fn free_port_is_free_on_loopback() {
        let p = free_port().expect("port");
        assert!(p > 0);
        assert!(!port_open(p));
    }
}

//! `envbridge operator` as the operator benchmark runs it: a child process (under a profiler
//! when BENCH_OPERATOR_WRAPPER is set), ready before it is measured, its memory, and the
//! apiserver request counts it logs on SIGUSR1 and on its way out.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{Res, free_loopback, http_get, peak_rss_kib, rss_kib};

pub struct OperatorProc {
    child: tokio::process::Child,
    pub pid: u32,
    log: PathBuf,
    /// Its RSS once ready, its watches listed, before any environment: what tasks add is
    /// measured against this.
    pub baseline_kib: u64,
}

/// The operator's own request counts (from its log), at the marks the benchmark set.
#[derive(Debug, Default, Clone)]
pub struct Requests {
    /// To STANDBY (the first SIGUSR1).
    pub standby: u64,
    pub standby_by_verb: String,
    /// The transitions' (between the first and the second SIGUSR1).
    pub transitions: u64,
    /// Everything, the teardown included (the third).
    pub all: u64,
    pub all_by_verb: String,
}

impl std::ops::AddAssign<&Requests> for Requests {
    fn add_assign(&mut self, o: &Requests) {
        self.standby += o.standby;
        self.transitions += o.transitions;
        self.all += o.all;
        for (mine, theirs) in [
            (&mut self.standby_by_verb, &o.standby_by_verb),
            (&mut self.all_by_verb, &o.all_by_verb),
        ] {
            if !mine.is_empty() {
                mine.push(';');
            }
            mine.push_str(theirs);
        }
    }
}

impl OperatorProc {
    /// Starts an operator of `ns` (of `shard`'s objects only when given), logging to `log`,
    /// and waits until it is ready and has settled.
    pub async fn start(
        kubeconfig: &Path,
        ns: &str,
        shard: Option<&str>,
        discovery_port: u16,
        log: &Path,
    ) -> Res<Self> {
        let log_file = std::fs::File::create(log)?;
        // BENCH_OPERATOR_WRAPPER (a profiler's command line, e.g. `heaptrack -o /tmp/op`)
        // runs the operator under it; its RSS figures are then the wrapper's.
        let wrapper: Vec<String> = std::env::var("BENCH_OPERATOR_WRAPPER")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let mut command = match wrapper.split_first() {
            Some((prog, rest)) => {
                let mut c = tokio::process::Command::new(prog);
                c.args(rest).arg(env!("CARGO_BIN_EXE_envbridge"));
                c
            }
            None => tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge")),
        };
        let metrics = free_loopback()?;
        command.args([
            "operator",
            "--metrics-listen",
            &metrics,
            "--no-leader-election",
            "--namespace",
            ns,
        ]);
        if let Some(s) = shard {
            command.args(["--shard", s]);
        }
        // Its own process group: a wrapper's signals would not reach the operator under it,
        // so they go to the group's envbridge (see `signal`).
        let child = command
            .process_group(0)
            .args(["--headless-discovery-port", &discovery_port.to_string()])
            // kwok marks 10,000 pods Running in about 190 s on this machine (the floor's
            // figure): more than the 120 s a site's kubelets get by default.
            .args(["--startup-timeout-seconds", "600"])
            // And deletes them as slowly at that size: the default 60 s (after which a pod
            // whose node does not confirm is removed by force, meant for dead nodes) forced
            // every one.
            .args(["--pod-deletion-timeout-seconds", "600"])
            .env("KUBECONFIG", kubeconfig)
            // The filter it runs with when deployed (no RUST_LOG: info, kube and HTTP at warn).
            .env_remove("RUST_LOG")
            .stderr(log_file.try_clone()?)
            .stdout(log_file)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().ok_or("operator exited at once")?;
        // Read once it is ready and has settled (a reading 3 s after its start, some lists
        // not done, moved by 16 MiB between runs).
        let t_ready = Instant::now();
        while http_get(&metrics, "/readyz")
            .await
            .split_whitespace()
            .nth(1)
            != Some("200")
        {
            if t_ready.elapsed() > Duration::from_secs(120) {
                return Err("the operator was not ready within 120 s".into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(Self {
            child,
            pid,
            log: log.to_path_buf(),
            baseline_kib: peak_rss_kib(pid).unwrap_or(0),
        })
    }

    /// Asks it to log the requests it has sent so far (SIGUSR1).
    pub fn log_requests(&self) {
        self.signal("USR1");
    }

    /// Sends `sig` to the operator itself: the child, or the envbridge process in its
    /// process group when the child is a wrapper (a profiler).
    fn signal(&self, sig: &str) {
        let exe = std::fs::canonicalize(env!("CARGO_BIN_EXE_envbridge")).ok();
        let target = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                in_group(*pid, self.pid)
                    && std::fs::read_link(format!("/proc/{pid}/exe")).ok() == exe
            })
            .unwrap_or(self.pid);
        let _ = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &target.to_string()])
            .status();
    }

    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid).unwrap_or(0)
    }

    pub fn peak_kib(&self) -> u64 {
        peak_rss_kib(self.pid).unwrap_or(0)
    }

    /// Stops it (SIGTERM: it logs its count on the way out) and reads its request counts at
    /// the three SIGUSR1 marks (STANDBY, after the transitions, after the teardown).
    pub async fn stop(mut self) -> Res<Requests> {
        self.signal("TERM");
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
        let text = strip_ansi(&std::fs::read_to_string(&self.log)?);
        let counts: Vec<&str> = text
            .match_indices("requests so far")
            .filter_map(|(i, _)| text[i..].lines().next())
            .collect();
        let at = |i: usize| counts.get(i).copied().unwrap_or("");
        let standby = field(at(0), "apiserver_requests=").unwrap_or(0);
        Ok(Requests {
            standby,
            standby_by_verb: word(at(0), "by_verb=").unwrap_or_default(),
            transitions: field(at(1), "apiserver_requests=")
                .map_or(0, |n| n.saturating_sub(standby)),
            all: field(at(2), "apiserver_requests=").unwrap_or(0),
            all_by_verb: word(at(2), "by_verb=").unwrap_or_default(),
        })
    }
}

/// Whether process `pid` is in the process group `group`.
fn in_group(pid: u32, group: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // After the command's closing parenthesis: state, ppid, pgrp.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<u32>().ok())
        == Some(group)
}

/// The number after the last `key` in `text`.
fn field(text: &str, key: &str) -> Option<u64> {
    let at = text.rfind(key)? + key.len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The word after the first `key` in `text`.
fn word(text: &str, key: &str) -> Option<String> {
    let at = text.find(key)? + key.len();
    text[at..].split_whitespace().next().map(str::to_string)
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut esc = false;
    for c in s.chars() {
        match (esc, c) {
            (false, '\u{1b}') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

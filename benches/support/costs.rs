//! What one step of a benchmark cost the machine, to tell a slow step's cause from the
//! machine's spread: CPU seconds by process (the plane's, the operator's, the simulators',
//! the benchmark's own), the cores' idle time, and the apiserver's request time by verb and
//! resource and its watch events (its `/metrics`), and which watchers it cut off as
//! unresponsive (its log). Taken before and after the step; the difference is printed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use envbridge::dev::cut_watchers::LogMark;
use kube::Client;

/// What a snapshot reads: the apiserver's metrics through `admin`, and its log.
#[derive(Clone)]
pub struct Probe {
    pub admin: Client,
    pub apiserver_log: std::path::PathBuf,
}

impl Probe {
    pub fn of(admin: &Client, plane: &envbridge::dev::ClusterInfo) -> Probe {
        Probe {
            admin: admin.clone(),
            apiserver_log: plane.apiserver_log(),
        }
    }
}

/// One reading of the machine and the apiserver.
#[derive(Clone, Debug)]
pub struct Snapshot {
    at: Instant,
    /// pid -> (its group, utime + stime in clock ticks).
    procs: BTreeMap<u32, (&'static str, u64)>,
    /// All cores: (busy, idle) clock ticks.
    machine: (u64, u64),
    /// "VERB resource[/subresource]" -> (seconds, requests), watches left out.
    requests: BTreeMap<String, (f64, f64)>,
    /// Watch events sent, by kind.
    watch_events: BTreeMap<String, f64>,
    /// Watchers the apiserver cut off as unresponsive, by resource.
    cut_watchers: BTreeMap<String, f64>,
    /// Where the apiserver's log ended.
    log: LogMark,
}

/// The difference of two snapshots, in seconds.
#[derive(Clone, Debug, Default)]
pub struct Cost {
    pub wall_s: f64,
    pub busy_s: f64,
    pub idle_s: f64,
    /// CPU seconds by group, largest first.
    pub cpu: Vec<(&'static str, f64)>,
    /// Request seconds and count by verb and resource, largest first.
    pub by_request: Vec<(String, f64, f64)>,
    /// Watch events sent by kind, most first.
    pub events_by_kind: Vec<(String, f64)>,
    /// Watchers cut off as unresponsive by resource, most first: each resumes from its last
    /// event and is sent everything since again (kwok then plays those events again).
    pub cut_watchers: Vec<(String, f64)>,
    /// The same by watcher (resource, key, labels, fields), from the apiserver's log.
    pub cut_by_watcher: Vec<(String, usize)>,
}

impl Snapshot {
    /// Reads the processes and, through `admin`, the apiserver's metrics (none if it does not
    /// answer: the CPU part still says something).
    pub async fn take(probe: &Probe) -> Snapshot {
        let log = LogMark::now(probe.apiserver_log.clone());
        let metrics = apiserver_metrics(&probe.admin).await.unwrap_or_default();
        let (requests, watch_events, cut_watchers) = parse_metrics(&metrics);
        Snapshot {
            at: Instant::now(),
            procs: processes(),
            machine: machine_ticks(),
            requests,
            watch_events,
            cut_watchers,
            log,
        }
    }

    /// What happened between `self` and `later`.
    pub fn cost_until(&self, later: &Snapshot) -> Cost {
        let hz = ticks_per_second();
        let cpu = cpu_by_group(&self.procs, &later.procs, hz);
        let mut cpu: Vec<_> = cpu.into_iter().filter(|(_, s)| *s >= 0.05).collect();
        cpu.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut by_request: Vec<(String, f64, f64)> = later
            .requests
            .iter()
            .map(|(k, (s, n))| {
                let (s0, n0) = self.requests.get(k).copied().unwrap_or_default();
                (k.clone(), s - s0, n - n0)
            })
            .filter(|(_, _, n)| *n > 0.0)
            .collect();
        by_request.sort_by(|a, b| b.1.total_cmp(&a.1));
        let grown = |before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>| {
            let mut v: Vec<(String, f64)> = after
                .iter()
                .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, n)| *n > 0.0)
                .collect();
            v.sort_by(|a, b| b.1.total_cmp(&a.1));
            v
        };
        let events_by_kind = grown(&self.watch_events, &later.watch_events);
        let cut_watchers = grown(&self.cut_watchers, &later.cut_watchers);
        Cost {
            wall_s: later.at.duration_since(self.at).as_secs_f64(),
            busy_s: later.machine.0.saturating_sub(self.machine.0) as f64 / hz,
            idle_s: later.machine.1.saturating_sub(self.machine.1) as f64 / hz,
            cpu,
            by_request,
            events_by_kind,
            cut_watchers,
            cut_by_watcher: self.log.cut_since(),
        }
    }
}

impl Cost {
    /// One line: wall, the cores' busy and idle seconds, CPU by process, the apiserver's
    /// request time and its eight largest parts, watch events sent.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{:.1} s wall; CPU busy {:.1} s, idle {:.1} s:",
            self.wall_s, self.busy_s, self.idle_s
        );
        for (g, c) in &self.cpu {
            let _ = write!(s, " {g} {c:.1}");
        }
        let _ = write!(
            s,
            "; apiserver request time {:.0} s in {:.0} requests (",
            self.request_s(),
            self.by_request.iter().map(|r| r.2).sum::<f64>()
        );
        let parts = joined(self.by_request.iter().take(8), ", ", |(k, t, n)| {
            format!("{k} {t:.0} s/{n:.0}")
        });
        let kinds = joined(self.events_by_kind.iter().take(4), ", ", |(k, n)| {
            format!("{k} {n:.0}")
        });
        let _ = write!(
            s,
            "{parts}); {:.0} watch events ({kinds})",
            self.watch_events()
        );
        if !self.cut_watchers.is_empty() {
            let cut = joined(self.cut_watchers.iter(), ", ", |(k, n)| {
                format!("{k} {n:.0}")
            });
            let _ = write!(s, "; watchers cut off as unresponsive: {cut}");
        }
        if !self.cut_by_watcher.is_empty() {
            let who = joined(self.cut_by_watcher.iter(), "; ", |(w, n)| {
                format!("{w} x{n}")
            });
            let _ = write!(s, " ({who})");
        }
        s
    }

    /// The apiserver's request seconds in this step.
    pub fn request_s(&self) -> f64 {
        self.by_request.iter().map(|r| r.1).sum()
    }

    /// Watch events the apiserver sent in this step.
    pub fn watch_events(&self) -> f64 {
        self.events_by_kind.iter().map(|e| e.1).sum()
    }

    /// CPU seconds of `group` in this step.
    pub fn cpu_of(&self, group: &str) -> f64 {
        self.cpu
            .iter()
            .find(|(g, _)| *g == group)
            .map_or(0.0, |(_, c)| *c)
    }
}

/// The group a process is counted in, from its command name and arguments.
fn group_of(pid: u32, comm: &str, args: &[String]) -> &'static str {
    if pid == std::process::id() {
        return "bench";
    }
    match comm {
        "kube-apiserver" => "apiserver",
        "etcd" => "etcd",
        "kube-scheduler" => "scheduler",
        c if c.starts_with("kube-controller") => "controller-manager",
        c if c.starts_with("kwok") => "kwok",
        // `envbridge operator ...`, `envbridge dev sim-runner ...`, `envbridge dev
        // watch-relay ...` (kwok's).
        "envbridge" => match args.get(1..3) {
            Some([a, _]) if a == "operator" => "operator",
            Some([_, b]) if b == "sim-runner" => "simulators",
            Some([_, b]) if b == "watch-relay" => "kwok-relay",
            _ => "envbridge",
        },
        _ => "other",
    }
}

/// CPU seconds by group between two readings of the processes: a process started between
/// them counts whole, one gone is lost.
fn cpu_by_group(
    before: &BTreeMap<u32, (&'static str, u64)>,
    after: &BTreeMap<u32, (&'static str, u64)>,
    hz: f64,
) -> BTreeMap<&'static str, f64> {
    let mut cpu: BTreeMap<&'static str, f64> = BTreeMap::new();
    for (pid, (group, ticks)) in after {
        let t0 = before.get(pid).map_or(0, |(_, t)| *t);
        *cpu.entry(group).or_default() += ticks.saturating_sub(t0) as f64 / hz;
    }
    cpu
}

/// Every process's group and CPU ticks.
fn processes() -> BTreeMap<u32, (&'static str, u64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let (Some(ticks), Ok(comm)) = (
            cpu_ticks(pid),
            std::fs::read_to_string(format!("/proc/{pid}/comm")),
        ) else {
            continue;
        };
        let args: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        out.insert(pid, (group_of(pid, comm.trim(), &args), ticks));
    }
    out
}

/// utime + stime of a process, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// All cores' (busy, idle) ticks from `/proc/stat` (idle counts iowait).
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0);
    };
    let f: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
    let busy = f.iter().take(8).sum::<u64>() - idle;
    (busy, idle)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`).
pub fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

async fn apiserver_metrics(admin: &Client) -> Option<String> {
    let req = http::Request::get("/metrics").body(Vec::new()).ok()?;
    admin.request_text(req).await.ok()
}

/// `items`, each as `f` writes it, joined by `sep`.
fn joined<T>(items: impl Iterator<Item = T>, sep: &str, f: impl Fn(T) -> String) -> String {
    items.map(f).collect::<Vec<_>>().join(sep)
}

/// What a reading of the apiserver's metrics gives: request seconds and counts by "VERB
/// resource[/subresource]", watch events sent by kind, watchers cut off by resource.
type Parsed = (
    BTreeMap<String, (f64, f64)>,
    BTreeMap<String, f64>,
    BTreeMap<String, f64>,
);

/// Request seconds and counts by "VERB resource[/subresource]" (watches and connects left
/// out: their duration is the stream's), watch events sent by kind, and watchers cut off as
/// unresponsive by resource.
fn parse_metrics(text: &str) -> Parsed {
    let mut requests: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut events = BTreeMap::new();
    let mut cut = BTreeMap::new();
    for line in text.lines() {
        let Some((name, labels, value)) = sample(line) else {
            continue;
        };
        let label = |k: &str| labels.iter().find(|(n, _)| *n == k).map_or("", |(_, v)| *v);
        match name {
            "apiserver_request_duration_seconds_sum"
            | "apiserver_request_duration_seconds_count" => {
                let verb = label("verb");
                if verb == "WATCH" || verb == "CONNECT" {
                    continue;
                }
                let mut key = format!("{verb} {}", label("resource"));
                if !label("subresource").is_empty() {
                    let _ = write!(key, "/{}", label("subresource"));
                }
                let e = requests.entry(key).or_default();
                if name.ends_with("_sum") {
                    e.0 += value;
                } else {
                    e.1 += value;
                }
            }
            "apiserver_watch_events_total" => {
                // `resource` since Kubernetes 1.33, `kind` before.
                let kind = [label("resource"), label("kind")]
                    .into_iter()
                    .find(|k| !k.is_empty());
                *events.entry(kind.unwrap_or("?").to_string()).or_default() += value;
            }
            "apiserver_terminated_watchers_total" => {
                *cut.entry(label("resource").to_string()).or_default() += value;
            }
            _ => {}
        }
    }
    (requests, events, cut)
}

/// A sample's labels: (name, value).
type Labels<'a> = Vec<(&'a str, &'a str)>;

/// A Prometheus text sample: its name, labels and value (comments and bad lines: none).
fn sample(line: &str) -> Option<(&str, Labels<'_>, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (head, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let Some((name, rest)) = head.split_once('{') else {
        return Some((head, Vec::new(), value));
    };
    let labels = rest
        .strip_suffix('}')?
        .split("\",")
        .filter_map(|kv| {
            let (k, v) = kv.split_once("=\"")?;
            Some((k, v.trim_end_matches('"')))
        })
        .collect();
    Some((name, labels, value))
}

/// The group that works through a backlog after a step has ended (the controller-manager's
/// garbage collection and node lifecycle; the local plane runs no scheduler): a step started
/// before it is done pays for the step before it.
const BACKLOG: &str = "controller-manager";

/// How the plane settled before a step: the wait, the last window's cores busy in all and by
/// group.
pub struct Settled {
    pub waited_s: f64,
    pub quiet: bool,
    pub busy: f64,
    pub cores: Vec<(&'static str, f64)>,
}

impl Settled {
    pub fn line(&self) -> String {
        let cores: Vec<String> = self
            .cores
            .iter()
            .map(|(g, c)| format!("{g} {c:.2}"))
            .collect();
        format!(
            "{} after {:.1} s (cores busy in the last {WINDOW_S} s: {:.2}; {})",
            if self.quiet { "quiet" } else { "still busy" },
            self.waited_s,
            self.busy,
            cores.join(", ")
        )
    }
}

const WINDOW_S: f64 = 2.0;

/// Waits until, over a 2 s window, the machine uses under `busy_cores` and the backlog group
/// either under `backlog_cores` or, at a larger plane's steady level, under
/// `STEADY_MAX` and flat (three windows within `FLAT` of each other); or until `max` has
/// passed (then goes on, saying so). The plane's steady work (heartbeats, leases; at 1,250
/// nodes the controller-manager's alone is about 0.3 cores) stays: the gate is for what a
/// step left behind.
pub async fn settle(backlog_cores: f64, busy_cores: f64, max: std::time::Duration) -> Settled {
    const STEADY_MAX: f64 = 0.5;
    const FLAT: f64 = 0.05;
    let mut last: Vec<f64> = Vec::new();
    let start = Instant::now();
    let hz = ticks_per_second();
    let mut before = processes();
    let mut machine = machine_ticks();
    loop {
        tokio::time::sleep(std::time::Duration::from_secs_f64(WINDOW_S)).await;
        let now = processes();
        let machine_now = machine_ticks();
        let busy = machine_now.0.saturating_sub(machine.0) as f64 / hz / WINDOW_S;
        let mut by = cpu_by_group(&before, &now, hz);
        by.values_mut().for_each(|c| *c /= WINDOW_S);
        let backlog = by.get(BACKLOG).copied().unwrap_or(0.0);
        last.push(backlog);
        let recent = &last[last.len().saturating_sub(3)..];
        let (lo, hi) = recent
            .iter()
            .fold((f64::MAX, 0.0_f64), |(lo, hi), b| (lo.min(*b), hi.max(*b)));
        let steady = recent.len() == 3 && hi < STEADY_MAX && hi - lo < FLAT;
        let quiet = busy < busy_cores && (backlog < backlog_cores || steady);
        if quiet || start.elapsed() >= max {
            let mut cores: Vec<_> = by.into_iter().filter(|(_, c)| *c >= 0.01).collect();
            cores.sort_by(|a, b| b.1.total_cmp(&a.1));
            return Settled {
                waited_s: start.elapsed().as_secs_f64(),
                quiet,
                busy,
                cores,
            };
        }
        before = now;
        machine = machine_now;
    }
}

//! Memory of real nodes while a benchmark runs: each node's kubelet and containerd, the sum
//! over its containerd shims (`<cgroup>/shims`) and over its pods' processes
//! (`<cgroup>/kubepods`: the task processes `/opt/o2/bin/...`, the sandboxes' `envbridge
//! pause`, and the rest: the `tee` of a template's logFile), read from `/proc/PID/status`
//! (VmRSS, and RssAnon: what a process holds alone, without shared file pages).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use envbridge::dev::realnode::RealNodeState;
use envbridge::dev::realnode::teardown::processes;
use tokio_util::sync::CancellationToken;

/// Resident memory, KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Kib {
    pub rss: u64,
    pub anon: u64,
}

impl Kib {
    fn of(pid: u32) -> Kib {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |key: &str| {
            status
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Kib {
            rss: field("VmRSS:"),
            anon: field("RssAnon:"),
        }
    }

    fn add(&mut self, o: Kib) {
        self.rss += o.rss;
        self.anon += o.anon;
    }

    pub fn mib(&self) -> String {
        format!("{:.1} (anon {:.1})", self.rss_mib(), self.anon_mib())
    }

    fn max(self, o: Kib) -> Kib {
        Kib {
            rss: self.rss.max(o.rss),
            anon: self.anon.max(o.anon),
        }
    }

    pub fn rss_mib(&self) -> f64 {
        self.rss as f64 / 1024.0
    }

    pub fn anon_mib(&self) -> f64 {
        self.anon as f64 / 1024.0
    }
}

/// utime + stime of a process, in clock ticks (0 when gone).
fn cpu_ticks(pid: u32) -> u64 {
    super::costs::cpu_ticks(pid).unwrap_or(0)
}

/// One sample of one node; counts are processes, CPU in clock ticks since each started.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mem {
    pub kubelet: Kib,
    pub kubelet_cpu: u64,
    pub containerd: Kib,
    pub containerd_cpu: u64,
    pub shims: Kib,
    pub shim_count: usize,
    pub tasks: Kib,
    pub task_count: usize,
    pub sandboxes: Kib,
    pub sandbox_count: usize,
    pub others: Kib,
    pub other_count: usize,
}

impl Mem {
    /// Field by field maximum.
    fn max(self, o: Mem) -> Mem {
        Mem {
            kubelet: self.kubelet.max(o.kubelet),
            kubelet_cpu: self.kubelet_cpu.max(o.kubelet_cpu),
            containerd: self.containerd.max(o.containerd),
            containerd_cpu: self.containerd_cpu.max(o.containerd_cpu),
            shims: self.shims.max(o.shims),
            shim_count: self.shim_count.max(o.shim_count),
            tasks: self.tasks.max(o.tasks),
            task_count: self.task_count.max(o.task_count),
            sandboxes: self.sandboxes.max(o.sandboxes),
            sandbox_count: self.sandbox_count.max(o.sandbox_count),
            others: self.others.max(o.others),
            other_count: self.other_count.max(o.other_count),
        }
    }
}

/// Where a node's processes are.
#[derive(Clone, Debug)]
pub struct NodeProcs {
    pub host: String,
    kubelet: u32,
    containerd: u32,
    shims: String,
    pods: String,
}

impl NodeProcs {
    pub fn of(n: &RealNodeState) -> NodeProcs {
        let layout = n.layout();
        NodeProcs {
            host: n.host.clone(),
            kubelet: n.kubelet.pid,
            containerd: n.containerd.pid,
            shims: layout.shim_cgroup(),
            pods: format!("{}/kubepods", layout.cgroup),
        }
    }

    /// The executable of one of the node's task processes (`/proc/PID/exe`), if one runs.
    pub fn task_exe(&self) -> Option<std::path::PathBuf> {
        processes(&self.pods).into_iter().find_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            cmdline
                .starts_with(b"/opt/o2/bin/")
                .then(|| format!("/proc/{pid}/exe").into())
        })
    }

    pub fn sample(&self) -> Mem {
        let mut m = Mem {
            kubelet: Kib::of(self.kubelet),
            kubelet_cpu: cpu_ticks(self.kubelet),
            containerd: Kib::of(self.containerd),
            containerd_cpu: cpu_ticks(self.containerd),
            ..Mem::default()
        };
        for pid in processes(&self.shims) {
            m.shims.add(Kib::of(pid as u32));
            m.shim_count += 1;
        }
        for pid in processes(&self.pods) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let (kib, count) = if argv[0].starts_with(b"/opt/o2/bin/") {
                (&mut m.tasks, &mut m.task_count)
            } else if argv.get(1) == Some(&&b"pause"[..]) {
                (&mut m.sandboxes, &mut m.sandbox_count)
            } else {
                (&mut m.others, &mut m.other_count)
            };
            kib.add(Kib::of(pid as u32));
            *count += 1;
        }
        m
    }
}

impl Mem {
    /// Every pod process: tasks, sandboxes and the rest.
    pub fn containers(&self) -> Kib {
        let mut k = self.tasks;
        k.add(self.sandboxes);
        k.add(self.others);
        k
    }

    /// Prints the pods' processes and the shims of this sample.
    pub fn print_pods(&self, host: &str) {
        println!(
            "{host}: {} task processes {}, {} sandbox (pause) {}, {} other (log tee) {}; {} shims {}",
            self.task_count,
            self.tasks.mib(),
            self.sandbox_count,
            self.sandboxes.mib(),
            self.other_count,
            self.others.mib(),
            self.shim_count,
            self.shims.mib()
        );
    }
}

/// Per node: the first sample, the field-wise peak and the last.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    pub first: Mem,
    pub peak: Mem,
    pub last: Mem,
}

/// A daemon's memory and CPU ticks out of a sample.
type Daemon = fn(&Mem) -> (Kib, u64);

impl Seen {
    /// Prints the kubelet's and containerd's memory (before, peak, end) and the CPU time
    /// they used meanwhile (`ticks` a second).
    pub fn print_daemons(&self, host: &str, ticks: f64) {
        let (f, p, l) = (self.first, self.peak, self.last);
        let daemons: [(&str, Daemon); 2] = [
            ("kubelet", |m| (m.kubelet, m.kubelet_cpu)),
            ("containerd", |m| (m.containerd, m.containerd_cpu)),
        ];
        for (what, of) in daemons {
            let [a, b, c] = [f, p, l].map(|m| of(&m).0);
            let cpu = of(&l).1.saturating_sub(of(&f).1) as f64 / ticks;
            println!(
                "{host} {what:<10} before {}, peak {}, end {}; CPU meanwhile {cpu:.1} s",
                a.mib(),
                b.mib(),
                c.mib()
            );
        }
    }
}

/// Samples every node every `every` until [`Sampler::finish`].
pub struct Sampler {
    nodes: Vec<NodeProcs>,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub fn start(nodes: Vec<NodeProcs>, every: Duration) -> Sampler {
        let first: Vec<Seen> = nodes
            .iter()
            .map(|n| {
                let m = n.sample();
                Seen {
                    first: m,
                    peak: m,
                    last: m,
                }
            })
            .collect();
        let seen = Arc::new(Mutex::new(first));
        let stop = CancellationToken::new();
        let (s, t, ns) = (seen.clone(), stop.clone(), nodes.clone());
        let handle = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = t.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let now: Vec<Mem> = ns.iter().map(NodeProcs::sample).collect();
                if let Ok(mut seen) = s.lock() {
                    for (s, m) in seen.iter_mut().zip(now) {
                        s.peak = s.peak.max(m);
                        s.last = m;
                    }
                }
            }
        });
        Sampler {
            nodes,
            seen,
            stop,
            handle,
        }
    }

    pub fn nodes(&self) -> &[NodeProcs] {
        &self.nodes
    }

    /// A sample now, per node (also counted in the peaks).
    pub fn now(&self) -> Vec<Mem> {
        let now: Vec<Mem> = self.nodes.iter().map(NodeProcs::sample).collect();
        if let Ok(mut seen) = self.seen.lock() {
            for (s, m) in seen.iter_mut().zip(&now) {
                s.peak = s.peak.max(*m);
            }
        }
        now
    }

    /// Takes a last sample and returns what each node showed.
    pub async fn finish(mut self) -> Vec<(String, Seen)> {
        self.stop.cancel();
        let _ = (&mut self.handle).await;
        let last = self.now();
        let mut seen = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        for (s, m) in seen.iter_mut().zip(last) {
            s.last = m;
        }
        self.nodes
            .iter()
            .map(|n| n.host.clone())
            .zip(seen)
            .collect()
    }
}

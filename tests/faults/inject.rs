//! Doing a fault, and undoing it after its hold: from outside every process, as an operator's
//! bad day would (signals, a proxy's switch file, a node's Ready condition), except a task's
//! refusal, which is the simulator's own runtime fault switch.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use envbridge::dev;

use super::schedule::{Fault, Kind, Step};
use super::site::Site;

/// One task of an environment under test, as the cluster placed it.
#[derive(Debug, Clone)]
pub struct TaskInfo {
    pub name: String,
    pub namespace: String,
    pub pod: String,
    pub node: String,
    pub fairmq: bool,
    pub addr: SocketAddr,
}

impl TaskInfo {
    fn file(&self, site: &Site, ext: &str) -> PathBuf {
        site.fault_dir
            .join(format!("{}_{}.{ext}", self.namespace, self.pod))
    }

    /// The simulator's log (every call it received).
    pub fn log(&self, site: &Site) -> PathBuf {
        site.sim_logs
            .join(format!("{}_{}.log", self.namespace, self.pod))
    }
}

/// What a fault did.
#[derive(Debug, Clone)]
pub struct Injected {
    pub at: Instant,
    /// Tasks it touched (none for a control-plane fault).
    pub tasks: Vec<String>,
    pub what: String,
}

/// The pid of `task`'s simulator process (its command line names its fault file).
fn sim_pid(site: &Site, task: &TaskInfo) -> Option<i32> {
    let needle = task.file(site, "faults").display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        (cmd.contains("task-sim") && cmd.contains(&needle)).then_some(pid)
    })
}

fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) with a pid we found and a valid signal number; no memory is shared.
    unsafe { libc::kill(pid, sig) == 0 }
}

fn write(path: &PathBuf, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// The event a refusing task refuses at `step` (create: the first it is asked next).
fn refused_event(step: Step) -> &'static str {
    match step {
        Step::Create => "CONFIGURE",
        Step::Destroy => "EXIT",
        s => s.event().expect("a transition step"),
    }
}

async fn component(site: &Site, name: &'static str, hold: Duration) -> String {
    let _one = site.plane_faults.lock().await;
    let dir = site.plane_dir().to_path_buf();
    let d = dir.clone();
    let pid = tokio::task::spawn_blocking(move || dev::kill_component(&d, name))
        .await
        .expect("kill task")
        .unwrap_or_else(|e| panic!("SIGKILL {name}: {e}"));
    tokio::time::sleep(hold).await;
    dev::restart_component(&dir, name)
        .await
        .unwrap_or_else(|e| panic!("restarting {name}: {e}"));
    format!("{name} (pid {pid}) SIGKILLed, restarted after {hold:?}")
}

/// Sets `node`'s readiness, retried while the apiserver is away (another fault).
async fn node_ready(site: &Site, node: &str, ready: bool) {
    let until = Instant::now() + Duration::from_secs(60);
    while let Err(e) = dev::set_node_ready(&site.client, node, ready).await {
        if Instant::now() > until {
            panic!("node {node} ready={ready}: {e}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// SIGKILLs a part of the control plane or envbridge and starts it again after `hold`.
async fn control_plane(site: &Site, kind: Kind, hold: Duration) -> String {
    match kind {
        Kind::OperatorKill => {
            site.operator.kill();
            tokio::time::sleep(hold).await;
            site.operator.start();
            format!("operator SIGKILLed, restarted after {hold:?}")
        }
        Kind::DaemonLeaderKill => {
            let l = site.leader().await.unwrap_or(0);
            let d = &site.daemons[l];
            d.downtime.down();
            d.proc.kill();
            tokio::time::sleep(hold).await;
            d.proc.start();
            site.wait_reads(l, Duration::from_secs(90)).await;
            d.downtime.up();
            format!("daemon-{l} (leader) SIGKILLed, restarted after {hold:?}")
        }
        Kind::ApiserverKill => component(site, "kube-apiserver", hold).await,
        Kind::EtcdKill => component(site, "etcd", hold).await,
        k => unreachable!("{k:?} is a task fault"),
    }
}

/// Does `fault` on the environment whose tasks are `tasks`; returns once it is undone (or,
/// for a refusal and a killed task, at once: those stay).
pub async fn run(site: &Site, fault: &Fault, tasks: &[TaskInfo]) -> Injected {
    let at = Instant::now();
    let hold = Duration::from_millis(fault.hold_ms);
    if !fault.kind.hits_tasks() {
        return Injected {
            at,
            tasks: vec![],
            what: control_plane(site, fault.kind, hold).await,
        };
    }
    let Some(task) = tasks.get((fault.pick % tasks.len().max(1) as u64) as usize) else {
        return Injected {
            at,
            tasks: vec![],
            what: "no task to fault".into(),
        };
    };
    let one = vec![task.name.clone()];
    let (touched, what) = match fault.kind {
        Kind::OperatorKill | Kind::DaemonLeaderKill | Kind::ApiserverKill | Kind::EtcdKill => {
            unreachable!("control-plane faults are done above")
        }
        Kind::TaskKill => match sim_pid(site, task) {
            Some(pid) if signal(pid, libc::SIGKILL) => {
                (one, format!("{} (pid {pid}) SIGKILLed", task.name))
            }
            _ => (
                vec![],
                format!("{}: no simulator process to kill", task.name),
            ),
        },
        Kind::TaskFreeze => match sim_pid(site, task) {
            Some(pid) if signal(pid, libc::SIGSTOP) => {
                tokio::time::sleep(hold).await;
                signal(pid, libc::SIGCONT);
                (
                    one,
                    format!("{} (pid {pid}) SIGSTOPped for {hold:?}", task.name),
                )
            }
            _ => (
                vec![],
                format!("{}: no simulator process to freeze", task.name),
            ),
        },
        Kind::TaskRefuse => {
            let event = refused_event(fault.step);
            // A FairMQ device's step may instead stay stuck half-way (the client rolls back).
            let how = if task.fairmq && fault.pick.is_multiple_of(2) {
                "stuck-on"
            } else {
                "fail-on"
            };
            write(&task.file(site, "faults"), &format!("{how}={event}\n"));
            (one, format!("{} refuses {event} ({how})", task.name))
        }
        Kind::ProxyStall | Kind::ProxyCut => {
            let mode = if fault.kind == Kind::ProxyStall {
                "stall"
            } else {
                "cut"
            };
            let file = task.file(site, "proxy");
            write(&file, mode);
            tokio::time::sleep(hold).await;
            write(&file, "pass");
            (
                one,
                format!("{}'s control connection {mode} for {hold:?}", task.name),
            )
        }
        Kind::NodeNotReady => {
            let node = task.node.clone();
            let on: Vec<String> = tasks
                .iter()
                .filter(|t| t.node == node)
                .map(|t| t.name.clone())
                .collect();
            node_ready(site, &node, false).await;
            tokio::time::sleep(hold).await;
            node_ready(site, &node, true).await;
            (on, format!("node {node} NotReady for {hold:?}"))
        }
    };
    Injected {
        at,
        tasks: touched,
        what,
    }
}

/// Removes every refusal switch of `tasks` (a round's end).
pub fn clear(site: &Site, tasks: &[TaskInfo]) {
    for t in tasks {
        let _ = std::fs::remove_file(t.file(site, "faults"));
        let _ = std::fs::remove_file(t.file(site, "proxy"));
    }
}

//! The site under test: a private control plane of its own (25 kwok nodes), and envbridge as
//! separate processes a fault can SIGKILL: the task simulators' runner (with its fault
//! switches and control-connection proxies), one operator, two daemon replicas electing a
//! leader. Everything stops when the value is dropped, also on panic.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envbridge::dev;
use envbridge::server::pb;
use envbridge::server::pb::env_bridge_client::EnvBridgeClient;
use kube::Client;
use tonic::transport::Channel;

/// Simulated nodes of the site: flp001 .. flp025.
pub const NODES: u32 = 25;
/// The operator's per-call control deadline; a freeze or a stall outlasts it.
pub const CONTROL_TIMEOUT_S: u64 = 4;
/// The Lease of the daemons and of the operator: a standby takes over within this.
pub const LEASE_S: u64 = 4;
/// Control and TCP ports the daemons allocate (disjoint from every other test's).
const CONTROL_PORTS: &str = "43000-43499";
const TCP_PORTS: &str = "43500-43999";
/// Namespaces of the environments: `faults-<id>`.
pub const NS_PREFIX: &str = "faults-";

/// One process of envbridge, restartable with the same arguments; its output appends to
/// `<work>/<name>.log`.
pub struct Proc {
    pub name: String,
    args: Vec<String>,
    kubeconfig: PathBuf,
    log: PathBuf,
    child: Mutex<Option<Child>>,
}

impl Proc {
    fn new(name: &str, args: Vec<String>, kubeconfig: &Path, work: &Path) -> Proc {
        Proc {
            name: name.to_string(),
            args,
            kubeconfig: kubeconfig.to_path_buf(),
            log: work.join(format!("{name}.log")),
            child: Mutex::new(None),
        }
    }

    pub fn start(&self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("{}: {e}", self.log.display()));
        let err = log.try_clone().expect("log file handle");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_envbridge"));
        // Ends with the test process, even when that is SIGKILLed (a cancelled run).
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info,envbridge::control::sim=info")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.name));
        *self.child.lock().unwrap() = Some(child);
    }

    /// SIGKILL, reaped: a crash, not a stop.
    pub fn kill(&self) {
        if let Some(mut c) = self.child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether it ended by itself (a bug: nothing here should exit on its own).
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        self.child
            .lock()
            .unwrap()
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kill windows of one daemon replica: reads may fail only inside one.
#[derive(Default)]
pub struct Downtime {
    windows: Mutex<Vec<(Instant, Option<Instant>)>>,
}

impl Downtime {
    pub fn down(&self) {
        self.windows.lock().unwrap().push((Instant::now(), None));
    }
    pub fn up(&self) {
        if let Some(w) = self.windows.lock().unwrap().last_mut() {
            w.1.get_or_insert_with(Instant::now);
        }
    }
    /// Whether `t` lies in a window (or within `slack` after its end).
    pub fn covers(&self, t: Instant, slack: Duration) -> bool {
        self.windows
            .lock()
            .unwrap()
            .iter()
            .any(|(a, b)| t + slack >= *a && b.is_none_or(|b| t <= b + slack))
    }
}

pub struct Daemon {
    pub proc: Proc,
    pub port: u16,
    pub downtime: Arc<Downtime>,
}

pub struct Site {
    pub client: Client,
    pub work: PathBuf,
    pub fault_dir: PathBuf,
    pub sim_logs: PathBuf,
    pub sims: Proc,
    pub operator: Proc,
    pub daemons: Vec<Daemon>,
    /// One control-plane process down at a time: the restart of the apiserver needs etcd.
    pub plane_faults: tokio::sync::Mutex<()>,
    plane_dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Drop for Site {
    fn drop(&mut self) {
        for d in &self.daemons {
            d.proc.kill();
        }
        self.operator.kill();
        self.sims.kill();
        if let Err(e) = dev::down_in(&self.plane_dir) {
            eprintln!("faults: the private plane's down failed: {e}");
        }
    }
}

fn free_port() -> u16 {
    dev::process::free_port().expect("a free loopback port")
}

impl Site {
    pub async fn start() -> Site {
        let tmp = tempfile::Builder::new()
            .prefix("envbridge-faults-")
            .tempdir()
            .expect("a temporary directory");
        let plane_dir = tmp.path().join("dev");
        let work = tmp.path().join("work");
        let fault_dir = work.join("faults");
        let sim_logs = work.join("simulators");
        for d in [&work, &fault_dir, &sim_logs] {
            std::fs::create_dir_all(d).expect("work directories");
        }
        let info = dev::ensure_up_in(&plane_dir, NODES, &[])
            .await
            .unwrap_or_else(|e| panic!("the faults' private control plane cannot start: {e}"));
        let client = dev::client_for(&info.kubeconfig)
            .await
            .expect("a client of the private plane");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
        envbridge::install::crds(&client).await.expect("CRDs");
        envbridge::install::task_templates(&client, &root.join("task-templates"))
            .await
            .expect("TaskTemplates");
        let kc = info.kubeconfig.clone();
        let s = |v: &str| v.to_string();
        let path = |p: &Path| p.display().to_string();
        let sims = Proc::new(
            "sim-runner",
            vec![
                s("dev"),
                s("sim-runner"),
                format!("--kubeconfig={}", path(&kc)),
                format!("--log-dir={}", path(&sim_logs)),
                format!("--fault-dir={}", path(&fault_dir)),
                s("--complete-tasks"),
            ],
            &kc,
            &work,
        );
        let operator = Proc::new(
            "operator",
            vec![
                s("operator"),
                s("--metrics-listen=127.0.0.1:0"),
                format!("--control-timeout-seconds={CONTROL_TIMEOUT_S}"),
                s("--connect-timeout-seconds=8"),
                s("--shutdown-timeout-seconds=4"),
                s("--pod-deletion-timeout-seconds=10"),
                s("--lease-namespace=default"),
                format!("--lease-duration={LEASE_S}"),
            ],
            &kc,
            &work,
        );
        let flows = root.join("control-workflows");
        let daemons = (0..2)
            .map(|i| {
                let port = free_port();
                let args = vec![
                    s("daemon"),
                    format!("--listen=127.0.0.1:{port}"),
                    s("--metrics-listen=127.0.0.1:0"),
                    s("--insecure-no-auth"),
                    format!("--namespace-prefix={NS_PREFIX}"),
                    format!("--tasks-dir={}", path(&flows.join("tasks"))),
                    format!("--workflows-dir={}", path(&flows.join("workflows"))),
                    format!("--defaults={}", path(&root.join("site/local.yaml"))),
                    format!("--control-ports={CONTROL_PORTS}"),
                    format!("--tcp-ports={TCP_PORTS}"),
                    s("--default-transition-timeout=60"),
                    s("--lease-namespace=default"),
                    format!("--lease-duration={LEASE_S}"),
                    format!("--identity=daemon-{i}"),
                ];
                Daemon {
                    proc: Proc::new(&format!("daemon-{i}"), args, &kc, &work),
                    port,
                    downtime: Arc::default(),
                }
            })
            .collect::<Vec<_>>();
        sims.start();
        operator.start();
        let site = Site {
            client,
            work,
            fault_dir,
            sim_logs,
            sims,
            operator,
            daemons,
            plane_faults: tokio::sync::Mutex::new(()),
            plane_dir,
            _tmp: tmp,
        };
        for d in &site.daemons {
            d.proc.start();
        }
        for i in 0..site.daemons.len() {
            site.wait_reads(i, Duration::from_secs(60)).await;
        }
        site
    }

    pub fn plane_dir(&self) -> &Path {
        &self.plane_dir
    }

    /// Copies the process and simulator logs where they outlive the run, for a failure.
    pub fn keep_logs(&self) -> PathBuf {
        let dest =
            std::env::temp_dir().join(format!("envbridge-faults-logs-{}", std::process::id()));
        let _ = Command::new("cp")
            .arg("-r")
            .arg(&self.work)
            .arg(&dest)
            .status();
        dest
    }

    pub async fn api(&self, replica: usize) -> Option<EnvBridgeClient<Channel>> {
        let port = self.daemons[replica].port;
        let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .ok()?
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(90))
            .connect()
            .await
            .ok()?;
        Some(EnvBridgeClient::new(ch))
    }

    /// Waits until replica `i` answers a read.
    pub async fn wait_reads(&self, i: usize, timeout: Duration) {
        let start = Instant::now();
        loop {
            if let Some(mut c) = self.api(i).await
                && c.list_environments(pb::ListEnvironmentsRequest {})
                    .await
                    .is_ok()
            {
                return;
            }
            if start.elapsed() > timeout {
                panic!("daemon-{i} does not answer after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The replica whose lease is current, from the Lease object.
    pub async fn leader(&self) -> Option<usize> {
        let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(self.client.clone(), "default");
        let lease = api.get_opt("envbridge-daemon").await.ok()??;
        let holder = lease.spec?.holder_identity?;
        holder.strip_prefix("daemon-")?.parse().ok()
    }
}

//! What `envbridge demo` runs, as child processes of a benchmark in one namespace: the task
//! simulators (`dev sim-runner`), the operator and the daemon (loopback, no auth, no leader
//! election), each logging to its own file; and a client of the daemon's API.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use envbridge::server::pb::env_bridge_client::EnvBridgeClient;
use tokio::process::Child;
use tonic::transport::Channel;

use super::{Res, spawn_envbridge_logging, stop_child};

/// Arguments added to the children's own.
#[derive(Default)]
pub struct Extra<'a> {
    pub sims: &'a [&'a str],
    pub operator: &'a [&'a str],
}

pub struct Stack {
    pub sims: Child,
    pub operator: Child,
    pub daemon: Child,
    /// The daemon's API address.
    pub listen: String,
    pub operator_log: PathBuf,
    pub daemon_log: PathBuf,
}

impl Stack {
    /// Starts the three in `ns`, logs in `dir` at `rust_log`; `extra.sims` are added to the
    /// sim-runner's arguments (e.g. `--fault-dir`), `extra.operator` to the operator's.
    pub fn start(
        kubeconfig: &Path,
        ns: &str,
        dir: &Path,
        rust_log: &str,
        extra: Extra,
    ) -> Res<Stack> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
        let kc = kubeconfig.display().to_string();
        let sim_logs = dir.join("simulators").display().to_string();
        let mut args = vec![
            "dev",
            "sim-runner",
            "--kubeconfig",
            &kc,
            "--namespace",
            ns,
            "--log-dir",
            &sim_logs,
        ];
        args.extend_from_slice(extra.sims);
        let sims =
            spawn_envbridge_logging(&args, kubeconfig, &dir.join("sim-runner.log"), rust_log)?;
        let operator_log = dir.join("operator.log");
        let mut args = vec![
            "operator",
            "--namespace",
            ns,
            "--no-leader-election",
            "--metrics-listen",
            "127.0.0.1:0",
            "--log-json",
        ];
        args.extend_from_slice(extra.operator);
        let operator = spawn_envbridge_logging(&args, kubeconfig, &operator_log, rust_log)?;
        let listen = format!("127.0.0.1:{}", free_port()?);
        let flows = root.join("control-workflows");
        let daemon_log = dir.join("daemon.log");
        let daemon = spawn_envbridge_logging(
            &[
                "daemon",
                "--listen",
                &listen,
                "--metrics-listen",
                "127.0.0.1:0",
                "--insecure-no-auth",
                "--no-leader-election",
                "--namespace",
                ns,
                "--watch-namespace",
                ns,
                "--tasks-dir",
                &flows.join("tasks").display().to_string(),
                "--workflows-dir",
                &flows.join("workflows").display().to_string(),
                "--defaults",
                &root.join("site/local.yaml").display().to_string(),
                "--log-format",
                "json",
            ],
            kubeconfig,
            &daemon_log,
            rust_log,
        )?;
        Ok(Stack {
            sims,
            operator,
            daemon,
            listen,
            operator_log,
            daemon_log,
        })
    }

    /// A client of the daemon's API, once it answers (within 60 s).
    pub async fn client(&self) -> Res<EnvBridgeClient<Channel>> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match EnvBridgeClient::connect(format!("http://{}", self.listen)).await {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() > deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Stops what is still running: the daemon, the operator, the simulators.
    pub async fn stop(mut self) {
        let grace = Duration::from_secs(10);
        stop_child(&mut self.daemon, grace).await;
        stop_child(&mut self.operator, grace).await;
        stop_child(&mut self.sims, grace).await;
    }
}

fn free_port() -> Res<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

//! The local control plane: builds and runs a real kube-apiserver, etcd,
//! kube-controller-manager and kwok on 127.0.0.1 (see docs/local-control-plane.md).
//!
//! Library entry points for tests, benchmarks and the demo: [`ensure_up`] (start or reuse,
//! serialised by a file lock), [`client`], [`down`]; for fault tests, a private plane in a
//! directory of its own ([`ensure_up_in`], [`down_in`]) whose apiserver can be stopped and
//! started again (`stop_apiserver`, `start_apiserver`). What only tests and benches use
//! (those two, `fixtures`) is behind the `test-support` feature, which `cargo test` and
//! `cargo bench` turn on (Cargo.toml's dev-dependency on this crate).

pub mod addressing;
pub mod binaries;
pub mod cut_watchers;
mod error;
pub mod image;
pub mod kubeconfig;
pub mod nodes;
mod paths;
pub mod pki;
mod plane;
pub mod process;
pub mod realnode;
pub mod stages;
mod state;

use std::process::ExitCode;

pub mod sim_proxy;
pub mod sim_runner;
pub mod watch_relay;

/// Test and bench scaffolding: not part of a plain build.
#[cfg(feature = "test-support")]
pub mod fixtures;

pub use error::{DevError, Result};
pub use plane::{
    ClusterInfo, UpSpec, client_for, current, down, down_in, ensure_up, ensure_up_in,
    ensure_up_in_with, ensure_up_with, real_nodes, real_nodes_in,
};
#[cfg(feature = "test-support")]
pub use plane::{
    kill_component, restart_component, set_node_ready, start_apiserver, stop_apiserver,
};

/// Default number of simulated nodes.
pub const DEFAULT_NODES: u32 = 4;

/// A kube client for the running control plane (error when none is recorded).
pub async fn client() -> Result<kube::Client> {
    let info = current()?.ok_or_else(|| {
        DevError::NotReady("no control plane is running: `envbridge dev up`".into())
    })?;
    client_for(&info.kubeconfig).await
}

#[derive(clap::Subcommand, Debug)]
pub enum DevCommand {
    /// Start (or reuse) the local control plane.
    Up {
        /// Simulated (kwok) nodes: flp001 ...
        #[arg(long, default_value_t = DEFAULT_NODES)]
        nodes: u32,
        /// Real nodes (a kubelet and a containerd each, running containers): real001 ...
        #[arg(long, default_value_t = 0)]
        real_nodes: u32,
        /// kwok processes sharing the simulated nodes when the plane starts [default: one; at
        /// most one a node]; a running plane keeps its own.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
        kwok_shards: Option<u32>,
        /// Serve Pod watches from etcd, not from kube-apiserver's watch cache, when the plane
        /// starts (no watcher cut off for falling behind: for benchmarks at size); a running
        /// plane keeps its own.
        #[arg(long)]
        no_pod_watch_cache: bool,
        /// kwok reaches the apiserver through a relay that holds what kwok has not read yet,
        /// when the plane starts (kwok's watch never cut off as slow: for benchmarks at
        /// size); a running plane keeps its own.
        #[arg(long)]
        kwok_relay: bool,
    },
    /// Build the images (localhost/envbridge:dev and its pause image) from this executable
    /// and import them into every real node's containerd.
    Image,
    /// Stop every process it started and remove its state.
    Down,
    /// Say what runs; exit 0 when up, 1 when down.
    Status,
    /// Run the built kubectl against the local control plane.
    Kubectl {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run one task simulator per simulated (kwok) pod, on the pod's IP and control port.
    SimRunner(sim_runner::SimRunnerArgs),
    /// Relay TCP between kwok and kube-apiserver, reading the apiserver's side at once and
    /// holding it for kwok (what `dev up --kwok-relay` runs).
    WatchRelay(watch_relay::WatchRelayArgs),
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

pub fn run(cmd: DevCommand) -> ExitCode {
    match cmd {
        DevCommand::SimRunner(args) => sim_runner::run(args),
        DevCommand::WatchRelay(args) => watch_relay::run(args),
        DevCommand::Up {
            nodes,
            real_nodes,
            kwok_shards,
            no_pod_watch_cache,
            kwok_relay,
        } => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => return fail(e),
            };
            let spec = UpSpec {
                nodes,
                real_nodes,
                exe: None,
                kwok_shards,
                no_pod_watch_cache,
                kwok_relay,
            };
            match rt.block_on(ensure_up_with(&spec)) {
                Ok(info) => {
                    eprintln!(
                        "envbridge: {} with {} simulated and {} real node(s){}{}; kubectl: envbridge dev kubectl get nodes -o wide",
                        info.server,
                        info.nodes,
                        info.real_hosts.len(),
                        if info.pod_watch_cache {
                            ""
                        } else {
                            ", Pod watches from etcd"
                        },
                        if info.kwok_relay {
                            ", kwok through a watch relay"
                        } else {
                            ""
                        }
                    );
                    println!("export KUBECONFIG={}", info.kubeconfig.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        DevCommand::Down => match down() {
            Ok(true) => {
                eprintln!("envbridge: control plane stopped, state removed");
                ExitCode::SUCCESS
            }
            Ok(false) => {
                eprintln!("envbridge: no control plane was running");
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        DevCommand::Status => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => return fail(e),
            };
            match rt.block_on(plane::status()) {
                Ok(st) => print_status(&st),
                Err(e) => fail(e),
            }
        }
        DevCommand::Kubectl { args } => kubectl(&args),
        DevCommand::Image => image_cmd(),
    }
}

fn print_status(st: &plane::Status) -> ExitCode {
    let Some(state) = &st.state else {
        println!(
            "control plane: down (no state in {})",
            paths::state_dir().display()
        );
        return ExitCode::FAILURE;
    };
    println!(
        "control plane: {} (state {})",
        if st.up() { "up" } else { "DEGRADED" },
        paths::state_dir().display()
    );
    println!("binaries: {} ({})", state.bin_dir.display(), state.versions);
    println!("kubeconfig: {}", state.kubeconfig.display());
    println!(
        "kube-apiserver: https://127.0.0.1:{} readyz={}",
        state.apiserver_port,
        if st.ready { "ok" } else { "failing" }
    );
    println!(
        "etcd: http://127.0.0.1:{} (peer {})",
        state.etcd_client_port, state.etcd_peer_port
    );
    for (c, alive) in st.alive.iter().chain(&st.real_alive) {
        println!(
            "{}: pid {} {} log {}",
            c.name,
            c.pid,
            if *alive { "running" } else { "NOT RUNNING" },
            c.log.display()
        );
    }
    match st.nodes_ready {
        Some((ready, total)) => println!("nodes: {total} ({ready} Ready)"),
        None => println!("nodes: unknown"),
    }
    if st.up() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn image_cmd() -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail(format!("locating this executable: {e}")),
    };
    match plane::import_images(&exe) {
        Ok((archive, nodes)) => {
            for (reference, digest) in &archive.manifests {
                println!("{reference} {digest}");
            }
            eprintln!(
                "envbridge: images in {} imported into {} real node(s)",
                archive.path.display(),
                nodes
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn kubectl(args: &[String]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let info = match current() {
        Ok(Some(info)) => info,
        Ok(None) => return fail("no control plane is running: `envbridge dev up` first"),
        Err(e) => return fail(e),
    };
    let err = std::process::Command::new(&info.kubectl)
        .arg(format!("--kubeconfig={}", info.kubeconfig.display()))
        .args(args)
        .exec();
    fail(format!("running {}: {err}", info.kubectl.display()))
}

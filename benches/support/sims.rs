//! In-process task simulators for a benchmark's pods.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dashmap::DashMap;
use envbridge::control::sim::{SimConfig, SimMode, Simulator, bind, serve};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

/// Task simulators for the operator's pods (what `envbridge dev sim-runner --in-process`
/// does), one per Running pod on `<podIP>:$OCC_CONTROL_PORT`, kept by pod name so that a
/// benchmark can inject failures.
pub struct Sims {
    pub stop: CancellationToken,
    pub by_pod: Arc<DashMap<String, Arc<Simulator>>>,
    handle: tokio::task::JoinHandle<()>,
}

impl Sims {
    /// `on_pod(name, running)` is told of every pod event.
    pub fn start(client: Client, ns: String, on_pod: impl Fn(&str, bool) + Send + 'static) -> Sims {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let by_pod: Arc<DashMap<String, Arc<Simulator>>> = Arc::default();
        let registry = by_pod.clone();
        let handle = tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client, &ns);
            let mut served = HashSet::new();
            let mut w = watcher(pods, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            loop {
                let next = tokio::select! {
                    _ = token.cancelled() => return,
                    n = w.next() => n,
                };
                let Some(Ok(pod)) = next else { continue };
                let st = pod.status.as_ref();
                let running = st.and_then(|s| s.phase.as_deref()) == Some("Running");
                on_pod(&pod.name_any(), running);
                let Some(ip) = st
                    .and_then(|s| s.pod_ip.as_deref())
                    .and_then(|ip| ip.parse::<IpAddr>().ok())
                else {
                    continue;
                };
                let c = &pod
                    .spec
                    .as_ref()
                    .map(|s| s.containers[0].clone())
                    .unwrap_or_default();
                let env = |k: &str| {
                    c.env
                        .iter()
                        .flatten()
                        .find(|e| e.name == k)
                        .and_then(|e| e.value.clone())
                };
                let Some(port) = env("OCC_CONTROL_PORT").and_then(|p| p.parse::<u16>().ok()) else {
                    continue;
                };
                let addr = SocketAddr::new(ip, port);
                if !running || !served.insert(addr) {
                    continue;
                }
                let mode = if env("ENVBRIDGE_CONTROL_MODE").as_deref() == Some("fairmq") {
                    SimMode::Fairmq
                } else {
                    SimMode::Direct
                };
                let config = SimConfig {
                    mode,
                    ..SimConfig::default()
                };
                let t = token.clone();
                let sim = Simulator::new(config);
                let name = pod.name_any();
                registry.insert(name.clone(), sim.clone());
                tokio::spawn(async move {
                    // Said, not swallowed: a simulator that cannot listen (at 10,000 tasks
                    // this process's 20,000 open files) fails its task, not the operator.
                    match bind(addr, false).await {
                        Ok(listener) => {
                            let _ = serve(listener, sim, async move { t.cancelled().await }).await;
                        }
                        Err(e) => eprintln!("bench simulator of pod {name}: {e}"),
                    }
                });
            }
        });
        Sims {
            stop,
            by_pod,
            handle,
        }
    }

    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.handle.await;
    }
}

/// `envbridge dev sim-runner --in-process` child processes serving the pods of `ns`, one per
/// task class: at 10,000 tasks one process cannot hold every simulator's listener and the
/// operator's connection to it (20,000 open files, this container's hard limit).
pub struct SimRunners {
    children: Vec<tokio::process::Child>,
}

impl SimRunners {
    /// Each runner logs (warnings and errors) to `<log_stem>-<class>.log`.
    pub fn start(
        kubeconfig: &std::path::Path,
        ns: &str,
        classes: &[&str],
        log_stem: &std::path::Path,
    ) -> std::io::Result<SimRunners> {
        let mut children = Vec::with_capacity(classes.len());
        for class in classes {
            let log = std::fs::File::create(format!("{}-{class}.log", log_stem.display()))?;
            let selector = format!(
                "{},{}={class}",
                envbridge::dev::sim_runner::DEFAULT_SELECTOR,
                envbridge::crd::labels::CLASS
            );
            let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
                .args(["dev", "sim-runner", "--in-process", "--namespace", ns])
                .args(["--selector", &selector])
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .env("RUST_LOG", "warn")
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()?;
            children.push(child);
        }
        Ok(SimRunners { children })
    }

    /// SIGTERM, then each runner's exit (killed after 30 s).
    pub async fn stop(mut self) {
        for c in &self.children {
            if let Some(pid) = c.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
        }
        for c in &mut self.children {
            if tokio::time::timeout(std::time::Duration::from_secs(30), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
    }
}

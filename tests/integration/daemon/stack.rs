//! The whole stack on the local control plane, as a site runs it: the shipped manifests, one
//! task simulator process per pod, the operator and the daemon (the live run-control and
//! dashboard tests).

use std::path::Path;
use std::sync::Arc;

use envbridge::server::auth::Tokens;

use super::fixture::{self, Child, Daemon, fixed_ns};
use crate::support::TestNamespace;

pub struct Stack {
    _sim: Child,
    pub logs: tempfile::TempDir,
    operator: fixture::Operator,
    pub daemon: Daemon,
    cfg: envbridge::bridge::BridgeConfig,
}

impl Stack {
    /// The shipped manifests' workflows, CRDs and TaskTemplates; one simulator process per
    /// pod of the environments `ids`; the operator; a daemon (identifying its callers by
    /// `tokens`, None: an unauthenticated admin) allocating ports from `ports` (100 of them).
    pub async fn start(
        ns: &TestNamespace,
        ids: &[&str],
        ports: u16,
        tokens: Option<Arc<Tokens>>,
    ) -> Stack {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
        envbridge::install::crds(&ns.client).await.expect("CRDs");
        envbridge::install::task_templates(&ns.client, &root.join("task-templates"))
            .await
            .expect("TaskTemplates");
        let logs = tempfile::tempdir().expect("log dir");
        // One process per simulator (not --in-process): the test kills one.
        let selector = format!(
            "app.kubernetes.io/managed-by=envbridge,envbridge.dev/environment in ({})",
            ids.join(",")
        );
        let sim = Child(
            std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
                .args(["dev", "sim-runner", "--selector", &selector])
                .arg("--kubeconfig")
                .arg(&ns.info.kubeconfig)
                .arg("--log-dir")
                .arg(logs.path())
                // The simulators log every argument they receive.
                .env("RUST_LOG", "info,envbridge::control::sim=debug")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("sim-runner"),
        );
        let operator = fixture::Operator::start(ns.client.clone(), &ns.name);
        let mut cfg = fixed_ns(&ns.name);
        cfg.tasks_dir = root.join("control-workflows/tasks");
        cfg.workflows_dir = root.join("control-workflows/workflows");
        cfg.defaults_files = vec![root.join("site/local.yaml")];
        cfg.control_ports = ports..=ports + 49;
        cfg.tcp_ports = ports + 50..=ports + 99;
        let renderer = envbridge::bridge::render::renderer(&cfg);
        let daemon =
            Daemon::start_with_tokens(ns.client.clone(), cfg.clone(), renderer, tokens).await;
        Stack {
            _sim: sim,
            logs,
            operator,
            daemon,
            cfg,
        }
    }

    /// Another daemon replica of the same configuration, its roster built from the cluster.
    pub async fn another_daemon(&self) -> Daemon {
        let renderer = envbridge::bridge::render::renderer(&self.cfg);
        let client = self.daemon.bridge.client.clone();
        Daemon::start_with_tokens(client, self.cfg.clone(), renderer, None).await
    }

    pub async fn stop(self) {
        self.operator.stop().await;
    }

    /// What the simulator of `task` logged (its pod's log file).
    pub fn sim_log(&self, ns: &str, task: &str) -> String {
        std::fs::read_to_string(self.logs.path().join(format!("{ns}_{task}.log")))
            .unwrap_or_default()
    }
}

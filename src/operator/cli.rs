//! `envbridge operator`, the process: logging, the apiserver client (its requests counted),
//! the metrics listener (up before leadership is sought, so that a standby answers its
//! probes), signals, then [`super::leader::run_with_metrics`].

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::info;

use super::metrics::Metrics;
use super::requests::RequestCount;
use super::{Error, OperatorArgs, http, leader};
use crate::launch::{self, logging::LogFormat};

/// `envbridge operator`: client from the environment (KUBECONFIG or in-cluster); SIGTERM or
/// Ctrl-C stops it, SIGUSR1 logs the requests sent so far.
pub fn run_cli(args: OperatorArgs) -> std::process::ExitCode {
    let format = if args.log_json {
        LogFormat::Json
    } else {
        LogFormat::Text
    };
    launch::logging::init(format);
    let mut renamed = launch::legacy_env::Renamed::default();
    let args = args.with_renamed(&mut renamed);
    renamed.log();
    launch::runtime::block_on(None, async move {
        let config = kube::Config::infer()
            .await
            .map_err(|e| Error::Config(e.to_string()))?;
        let count = Arc::new(RequestCount::default());
        let client = launch::client::observed(config, count.clone(), args.apiserver_in_flight)
            .map_err(Error::Client)?;
        let shutdown = CancellationToken::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            crate::signal::shutdown_signal().await;
            s.cancel();
        });
        let metrics = Arc::new(Metrics::new(count.clone()));
        let served = shutdown.child_token();
        let (_, listener) =
            http::listen(args.metrics_listen, metrics.clone(), served.clone()).await?;
        // SIGUSR1: log the requests sent so far (the benchmark reads them at STANDBY).
        let c = count.clone();
        if let Ok(mut usr1) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        {
            tokio::spawn(async move {
                while usr1.recv().await.is_some() {
                    info!(
                        apiserver_requests = c.total(),
                        by_verb = %c.summary(),
                        "requests so far"
                    );
                }
            });
        }
        let result = leader::run_with_metrics(client, args, shutdown, metrics).await;
        served.cancel();
        let _ = listener.await;
        // One fixed-format line (the benchmark reads it).
        info!(
            apiserver_requests = count.total(),
            reads = count.get.load(std::sync::atomic::Ordering::Relaxed),
            writes = count.write.load(std::sync::atomic::Ordering::Relaxed),
            by_verb = %count.summary(),
            "operator stopped"
        );
        result.map(|()| std::process::ExitCode::SUCCESS)
    })
}

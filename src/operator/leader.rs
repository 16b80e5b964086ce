//! Leader election around the controllers: only the holder of the Lease runs them; losing it
//! stops them and ends the process with an error (the Deployment restarts it). Leadership is
//! reported to the metrics (`envbridge_operator_leader`, `/readyz`).

use std::sync::Arc;

use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::metrics::Metrics;
use super::runtime::run_controllers;
use super::{Error, OperatorArgs, Result};
use crate::launch;

/// Runs the operator: with leader election (a Lease) unless disabled; returns when `shutdown`
/// fires, or with an error when leadership is lost (the process should exit and restart).
pub async fn run(client: Client, args: OperatorArgs, shutdown: CancellationToken) -> Result<()> {
    run_with_metrics(client, args, shutdown, Arc::default()).await
}

/// [`run`], its reconciles, leadership and controllers' state reported to `metrics` (what
/// `operator::http` serves).
pub async fn run_with_metrics(
    client: Client,
    args: OperatorArgs,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
) -> Result<()> {
    let result = lead(client, args, shutdown, &metrics).await;
    metrics.set_leading(false);
    result
}

async fn lead(
    client: Client,
    args: OperatorArgs,
    shutdown: CancellationToken,
    metrics: &Arc<Metrics>,
) -> Result<()> {
    let lease = args
        .lease
        .choice()
        .config(&args.default_lease_name(), super::FIELD_MANAGER)
        .map_err(Error::Lease)?;
    let Some(lease) = lease else {
        // A single replica leads by definition.
        metrics.set_leading(true);
        return run_controllers(client, args, shutdown, metrics.clone()).await;
    };
    let (tx, mut leader) = watch::channel(false);
    let release = CancellationToken::new();
    let held = tokio::spawn(launch::lease::hold(
        client.clone(),
        lease.clone(),
        tx,
        release.clone(),
    ));
    let stop_holding = || async {
        release.cancel();
        let _ = held.await;
    };
    info!(lease = %lease.name, namespace = %lease.namespace, identity = %lease.identity, "waiting for leadership");
    while !*leader.borrow_and_update() {
        tokio::select! {
            _ = shutdown.cancelled() => {
                stop_holding().await;
                return Ok(());
            }
            changed = leader.changed() => if changed.is_err() {
                return Err(Error::LeaseLost);
            }
        }
    }
    info!(identity = %lease.identity, "leader: starting controllers");
    metrics.set_leading(true);
    let child = shutdown.child_token();
    let mut ctl = tokio::spawn(run_controllers(
        client,
        args,
        child.clone(),
        metrics.clone(),
    ));
    let lost = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break false,
            r = &mut ctl => {
                stop_holding().await;
                return r.unwrap_or(Ok(()));
            }
            changed = leader.changed() => {
                if changed.is_err() || !*leader.borrow_and_update() {
                    break true;
                }
            }
        }
    };
    // Not ready from here on: the controllers are stopping.
    metrics.set_leading(false);
    child.cancel();
    let _ = ctl.await;
    stop_holding().await;
    if lost {
        warn!("leadership lost: controllers stopped");
        return Err(Error::LeaseLost);
    }
    Ok(())
}

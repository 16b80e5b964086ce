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
                // A panic in the controllers' task is an error (see `From<JoinError>`).
                return r?;
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
    let ended = ctl.await;
    stop_holding().await;
    if lost {
        warn!("leadership lost: controllers stopped");
        return Err(Error::LeaseLost);
    }
    ended?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `lead` does with the controllers' task's end.
    async fn controllers_ended(
        r: std::result::Result<Result<()>, tokio::task::JoinError>,
    ) -> Result<()> {
        r?
    }

    #[tokio::test]
    async fn a_panic_in_the_controllers_is_an_error_not_a_clean_stop() {
        let panicked = tokio::spawn(async { panic!("a reconcile went wrong") }).await;
        let e = controllers_ended(panicked).await.unwrap_err();
        assert!(matches!(e, Error::Controllers(_)), "{e:?}");
        assert!(e.to_string().contains("a reconcile went wrong"), "{e}");
        let stopped = tokio::spawn(async { Ok(()) }).await;
        assert!(controllers_ended(stopped).await.is_ok());
        let failed = tokio::spawn(async { Err(Error::LeaseLost) }).await;
        assert!(matches!(
            controllers_ended(failed).await,
            Err(Error::LeaseLost)
        ));
    }
}

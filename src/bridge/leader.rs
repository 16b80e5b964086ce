//! Leader election over a Lease: only the holder writes; a standby replica serves reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// Seconds a lease lasts without renewal; `grace` must be smaller and non-zero.
    pub duration: u64,
    pub grace: u64,
}

impl LeaseConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.duration == 0 || self.grace == 0 || self.grace >= self.duration {
            return Err(format!(
                "lease duration ({}) must be greater than the grace period ({}), both non-zero",
                self.duration, self.grace
            ));
        }
        Ok(())
    }
}

/// Keeps `flag` equal to "this replica holds the lease" until `stop`; retries on errors.
pub async fn run(
    client: kube::Client,
    cfg: LeaseConfig,
    flag: Arc<AtomicBool>,
    metrics: Metrics,
    stop: CancellationToken,
) {
    flag.store(false, Ordering::Release);
    metrics.leader.set(0);
    while !stop.is_cancelled() {
        let manager = LeaseManagerBuilder::new(client.clone(), &cfg.name)
            .with_namespace(&cfg.namespace)
            .with_identity(&cfg.identity)
            .with_duration(cfg.duration)
            .with_grace(cfg.grace)
            .build()
            .await;
        let manager = match manager {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "lease manager could not start, retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        };
        let (mut rx, task) = manager.watch().await;
        loop {
            let leading = *rx.borrow_and_update();
            flag.store(leading, Ordering::Release);
            metrics.leader.set(i64::from(leading));
            tracing::info!(identity = cfg.identity, leading, "leadership");
            tokio::select! {
                _ = stop.cancelled() => break,
                changed = rx.changed() => if changed.is_err() { break },
            }
        }
        flag.store(false, Ordering::Release);
        metrics.leader.set(0);
        drop(rx); // releases the lease
        match task.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "lease manager stopped"),
            Err(e) => tracing::warn!(error = %e, "lease task failed"),
        }
        if !stop.is_cancelled() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

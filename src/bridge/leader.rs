//! The daemon's view of leadership: the one election (`launch::lease::hold`) mirrored into the
//! flag every write checks and the `leader` gauge. A standby replica serves reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use crate::launch::lease::{self, LeaseConfig};

/// Keeps `flag` equal to "this replica holds the lease" until `stop`.
pub async fn run(
    client: kube::Client,
    cfg: LeaseConfig,
    flag: Arc<AtomicBool>,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let (tx, mut rx) = watch::channel(false);
    let held = tokio::spawn(lease::hold(client, cfg, tx, stop.clone()));
    loop {
        let leading = *rx.borrow_and_update();
        flag.store(leading, Ordering::Release);
        metrics.leader.set(i64::from(leading));
        if rx.changed().await.is_err() {
            break; // `hold` ended (stop)
        }
    }
    flag.store(false, Ordering::Release);
    metrics.leader.set(0);
    let _ = held.await;
}

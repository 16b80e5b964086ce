//! After an etcd restart: waiting until kube-apiserver serves EVERY resource again, not only
//! `/readyz`. Test scaffolding, behind `test-support`.
//!
//! The apiserver keeps one etcd client per group of resources, each reconnecting on its own
//! gRPC backoff (up to 120 s), so `/readyz` (its own client) can be ok while Deployments still
//! time out: measured here, after a 40 s outage, `/readyz` was ok 0.8 s after etcd's restart
//! and Deployments 23.7 s after. A LIST with `limit=1` of each listable resource (no
//! resourceVersion: a consistent read, which needs that resource's etcd client) answers only
//! when its client is back.

use std::time::{Duration, Instant};

use futures::future::join_all;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::discovery::{Discovery, verbs};
use kube::{Api, Client};

use crate::dev::error::{DevError, Result};

/// One LIST must answer within this (a resource whose etcd client is down hangs until the
/// apiserver's own 60 s request timeout).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

async fn answers(client: &Client, ar: &ApiResource) -> bool {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    let params = ListParams::default().limit(1);
    let list = api.list_metadata(&params);
    matches!(tokio::time::timeout(PROBE_TIMEOUT, list).await, Ok(Ok(_)))
}

/// Waits until a LIST of every listable resource the apiserver discovers answers; an error
/// naming those that still do not at `deadline`.
pub(super) async fn wait_serving_all(client: &Client, deadline: Instant) -> Result<()> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut left: Vec<ApiResource> = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .filter(|(_, caps)| caps.supports_operation(verbs::LIST))
        .map(|(ar, _)| ar)
        .collect();
    loop {
        let ok = join_all(left.iter().map(|ar| answers(client, ar))).await;
        let mut ok = ok.into_iter();
        left.retain(|_| !ok.next().unwrap_or(false));
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let names: Vec<String> = left.iter().map(|ar| ar.plural.clone()).collect();
            return Err(DevError::NotReady(format!(
                "after the etcd restart, LISTs of {} still fail",
                names.join(", ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

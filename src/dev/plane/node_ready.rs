//! Taking ONE simulated node out (NotReady) and back, for fault tests. Test scaffolding,
//! behind `test-support`.
//!
//! kwok keeps a node Ready only through its node stages, so the switch is the node label
//! [`NOT_READY_LABEL`]: node-initialize and node-heartbeat skip a node that has it, and
//! node-not-ready (Ready=False at once) and node-not-ready-heartbeat (keeps it False, with
//! fresh heartbeats) take it over; without the label node-initialize makes it Ready again
//! (src/dev/stages/). Patching the status directly would not hold: kwok's pending heartbeat
//! would report Ready again within 25 s.
//!
//! This is a node that reports NotReady (a kubelet whose runtime is down), not one that went
//! silent: the controller-manager taints it `node.kubernetes.io/not-ready` (NoSchedule at once,
//! NoExecute within its 5 s monitor period, rate-limited per zone) but does not mark its pods
//! NotReady, which it does only for a node it turns Unknown itself; kwok's pods stay Running.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::dev::addressing::KWOK_NODE_LABEL;
use crate::dev::error::{DevError, Result};
use crate::dev::stages::NOT_READY_LABEL;

/// How long kwok and the controller-manager get (the node stage acts at once, the
/// node-lifecycle-controller looks every 5 s).
const TIMEOUT: Duration = Duration::from_secs(60);

/// Taints the node-lifecycle-controller puts on a node whose Ready is False / Unknown.
const NOT_READY_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// The node's Ready status ("True", "False", "Unknown"; "" when it has none) and whether it
/// carries a taint of [`NOT_READY_TAINTS`].
fn observed(node: &Node) -> (String, bool) {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone())
        .unwrap_or_default();
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| NOT_READY_TAINTS.contains(&t.key.as_str()))
        });
    (ready, tainted)
}

/// Polls `node` until `done(ready status, tainted)`; an error naming `what` after [`TIMEOUT`].
async fn wait_until(
    api: &Api<Node>,
    node: &str,
    what: &str,
    done: impl Fn(&str, bool) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (status, tainted) = observed(&api.get(node).await?);
        if done(&status, tainted) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(DevError::NotReady(format!(
                "{node} not {what} after {TIMEOUT:?}: Ready={status:?}, not-ready taint \
                 {tainted} (see kwok.log, kube-controller-manager.log)"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn settled_ready(status: &str, tainted: bool) -> bool {
    status == "True" && !tainted
}

/// Makes the simulated (kwok) node `node` NotReady (`ready = false`: Ready=False) or Ready
/// again (`true`), and returns once both kwok and kube-controller-manager agree: the Ready
/// condition has the wanted status and the node-lifecycle-controller has put on (or taken
/// off) its `node.kubernetes.io/not-ready` taint. Other nodes are untouched. An error for a
/// node kwok does not manage (a real node: stop its kubelet instead).
///
/// Taking a node out first waits until it is Ready without that taint: the controller also
/// taints a node created without conditions and lifts it a few seconds after kwok's first
/// Ready, so a taint left from the node's start would otherwise pass for the answer.
pub async fn set_node_ready(client: &Client, node: &str, ready: bool) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let labels = api.get(node).await?.metadata.labels.unwrap_or_default();
    let (key, value) = KWOK_NODE_LABEL;
    if labels.get(key).map(String::as_str) != Some(value) {
        return Err(DevError::Invalid(format!(
            "{node} is not a kwok node (no label {key}={value})"
        )));
    }
    let label = if ready {
        serde_json::Value::Null
    } else {
        if !labels.contains_key(NOT_READY_LABEL) {
            wait_until(&api, node, "Ready before being taken out", settled_ready).await?;
        }
        serde_json::Value::from("true")
    };
    let patch = serde_json::json!({"metadata": {"labels": {NOT_READY_LABEL: label}}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    if ready {
        wait_until(&api, node, "Ready again", settled_ready).await
    } else {
        wait_until(&api, node, "NotReady", |status, tainted| {
            status != "True" && !status.is_empty() && tainted
        })
        .await
    }
}

//! API Priority and Fairness set up so that the REAL apiserver throttles one identity: a
//! PriorityLevelConfiguration with one seat that rejects (429 + Retry-After) what does not
//! fit, and a FlowSchema sending only that user's requests to it.

use std::time::Duration;

use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, PostParams};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::support;

fn object<T: DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

/// Puts `user` (given cluster-admin, so RBAC never refuses it) under its own priority level
/// `name` and waits until the apiserver classifies that user's requests there.
/// `nominalConcurrencyShares: 1` of a small server-wide limit is one seat; no lending, no
/// borrowing, no queue.
pub async fn throttle_user(admin: &Client, user_client: &Client, name: &str, user: &str) {
    let pp = PostParams::default();
    let level: PriorityLevelConfiguration = object(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": name},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 1,
            "lendablePercent": 0,
            "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"}
        }}
    }));
    let level = Api::<PriorityLevelConfiguration>::all(admin.clone())
        .create(&pp, &level)
        .await
        .expect("PriorityLevelConfiguration");
    let schema: FlowSchema = object(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": name},
            "matchingPrecedence": 100,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "User", "user": {"name": user}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                   "namespaces": ["*"], "clusterScope": true}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
            }]
        }
    }));
    Api::<FlowSchema>::all(admin.clone())
        .create(&pp, &schema)
        .await
        .expect("FlowSchema");
    let binding: ClusterRoleBinding = object(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }));
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &binding)
        .await
        .expect("ClusterRoleBinding");
    // APF names the priority level that served a request in a response header.
    let uid = level.metadata.uid.expect("uid");
    support::wait_for(
        "the user's requests to be classified at the new level",
        Duration::from_secs(60),
        || async {
            let req = http::Request::get("/api").body(Vec::new()).ok()?;
            let res = user_client.send(req.map(Into::into)).await.ok()?;
            let got = res.headers().get("X-Kubernetes-PF-PriorityLevel-UID")?;
            (got.to_str().ok()? == uid).then_some(())
        },
    )
    .await;
}

/// `apiserver_flowcontrol_rejected_requests_total` of priority level `name`, from the
/// apiserver's own /metrics.
pub async fn rejected(admin: &Client, name: &str) -> u64 {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = admin.request_text(req).await.expect("/metrics");
    let label = format!("priority_level=\"{name}\"");
    text.lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_rejected_requests_total{"))
        .filter(|l| l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

//! kwok's configuration: the Stage objects that drive simulated nodes and pods.
//!
//! The five lifecycle stages are kwok v0.8.0's own (kustomize/stage/{node,pod}/fast and
//! node/heartbeat); stages of ours inject outcomes on demand, selected by pod labels, and take
//! a node out (NotReady) by a node label.

/// Pod label that makes kwok fail a running pod (see stages/pod-sim-fail.yaml).
pub const SIM_FAIL_LABEL: &str = "envbridge.dev/sim-fail";
/// Pod annotations read by the failure stage.
pub const SIM_FAIL_AFTER: &str = "envbridge.dev/sim-fail-after";
pub const SIM_EXIT_CODE: &str = "envbridge.dev/sim-exit-code";
pub const SIM_REASON: &str = "envbridge.dev/sim-reason";
pub const SIM_MESSAGE: &str = "envbridge.dev/sim-message";
/// Container env that keeps a pod Pending with a FailedScheduling event (see
/// stages/pod-sim-pending.yaml).
pub const SIM_PENDING_ENV: &str = "ENVBRIDGE_SIM_PENDING";
/// Pod label that makes kwok complete a running pod with exit code 0.
pub const SIM_SUCCEED_LABEL: &str = "envbridge.dev/sim-succeed";
pub const SIM_SUCCEED_AFTER: &str = "envbridge.dev/sim-succeed-after";

/// Node label that makes kwok report the node Ready=False (see stages/node-not-ready.yaml);
/// removing it makes the node Ready again. `dev::set_node_ready` sets and removes it.
pub const NOT_READY_LABEL: &str = "envbridge.dev/not-ready";

/// (name, YAML) of every stage given to kwok.
pub const STAGES: &[(&str, &str)] = &[
    (
        "node-initialize",
        include_str!("stages/node-initialize.yaml"),
    ),
    ("node-heartbeat", include_str!("stages/node-heartbeat.yaml")),
    ("node-not-ready", include_str!("stages/node-not-ready.yaml")),
    (
        "node-not-ready-heartbeat",
        include_str!("stages/node-not-ready-heartbeat.yaml"),
    ),
    ("pod-ready", include_str!("stages/pod-ready.yaml")),
    ("pod-complete", include_str!("stages/pod-complete.yaml")),
    ("pod-delete", include_str!("stages/pod-delete.yaml")),
    ("pod-sim-fail", include_str!("stages/pod-sim-fail.yaml")),
    (
        "pod-sim-pending",
        include_str!("stages/pod-sim-pending.yaml"),
    ),
    (
        "pod-sim-succeed",
        include_str!("stages/pod-sim-succeed.yaml"),
    ),
];

/// Pods whose stage kwok plays at once (its default: 4). kwok's client has no rate limit, so
/// 4 workers each waiting on one apiserver round trip set its pace: at 10,000 pods and an
/// apiserver busy with a run's other writes, minutes for what the apiserver could do sooner.
pub const POD_STAGE_PARALLELISM: u32 = 16;

/// Nodes whose stage (their heartbeat, every 20-45 s) kwok plays at once (its default: 4).
/// For the same reason: at 1,250 nodes and a busy apiserver (a round trip of ~190 ms), 4
/// workers renewed ~21 heartbeats a second where 1,250 nodes need ~38; heartbeats fell
/// minutes behind, the controller-manager took nodes NotReady (grace 60 s) and marked their
/// pods so, kwok put them back: churn of Node, Pod and EndpointSlice writes in the middle of
/// whatever the plane was timing.
pub const NODE_STAGE_PARALLELISM: u32 = 16;

/// kwok's options. kwok applies its defaults only when no KwokConfiguration is given (a
/// partial one leaves the rest at zero: no parallelism at all), so every option that has a
/// default is given here, kwok v0.8.0's own values except the pods' parallelism.
fn kwok_options() -> String {
    format!(
        "apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageAllNodes: false
  enableDebuggingHandlers: true
  enableContentionProfiling: false
  enableProfilingHandler: true
  podPlayStageParallelism: {POD_STAGE_PARALLELISM}
  nodePlayStageParallelism: {NODE_STAGE_PARALLELISM}
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
"
    )
}

/// The multi-document YAML passed to `kwok --config`: its options, then every stage.
pub fn kwok_config() -> String {
    std::iter::once(kwok_options())
        .chain(
            STAGES
                .iter()
                .map(|(_, yaml)| format!("{}\n", yaml.trim_end())),
        )
        .collect::<Vec<_>>()
        .join("---\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs() -> Vec<serde_json::Value> {
        kwok_config()
            .split("\n---\n")
            .map(|d| serde_saphyr::from_str::<serde_json::Value>(d).expect("valid YAML"))
            .collect()
    }

    #[test]
    fn config_holds_the_options_whole_then_every_stage_once() {
        let docs = docs();
        let opts = &docs[0];
        assert_eq!(opts["kind"], "KwokConfiguration");
        assert_eq!(
            opts["options"]["podPlayStageParallelism"],
            POD_STAGE_PARALLELISM
        );
        assert_eq!(
            opts["options"]["nodePlayStageParallelism"],
            NODE_STAGE_PARALLELISM
        );
        for nonzero in [
            "nodePlayStageParallelism",
            "nodeLeaseParallelism",
            "podsOnNodeSyncParallelism",
        ] {
            assert!(opts["options"][nonzero].as_u64() > Some(0), "{nonzero}");
        }
        let names: Vec<&str> = docs[1..]
            .iter()
            .map(|d| {
                assert_eq!(d["kind"], "Stage");
                assert_eq!(d["apiVersion"], "kwok.x-k8s.io/v1alpha1");
                d["metadata"]["name"].as_str().expect("name")
            })
            .collect();
        let expected: Vec<&str> = STAGES.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, expected);
        for want in [
            "node-initialize",
            "node-heartbeat",
            "pod-ready",
            "pod-complete",
            "pod-delete",
        ] {
            assert!(names.contains(&want), "missing {want}");
        }
    }

    #[test]
    fn failure_stage_is_selected_by_label_and_only_fails_running_pods() {
        let docs = docs();
        let fail = docs
            .iter()
            .find(|d| d["metadata"]["name"] == "pod-sim-fail")
            .expect("fail stage");
        let exprs = fail["spec"]["selector"]["matchExpressions"]
            .as_array()
            .expect("expressions");
        let keys: Vec<&str> = exprs.iter().filter_map(|e| e["key"].as_str()).collect();
        assert!(keys.iter().any(|k| k.contains(SIM_FAIL_LABEL)));
        assert!(keys.contains(&".status.phase"));
        let template = fail["spec"]["next"]["statusTemplate"]
            .as_str()
            .expect("template");
        assert!(template.contains("phase: Failed"));
        for a in [SIM_EXIT_CODE, SIM_REASON, SIM_MESSAGE] {
            assert!(template.contains(a), "template ignores {a}");
        }
        assert!(
            fail["spec"]["delay"]["durationFrom"]["expressionFrom"]
                .as_str()
                .expect("delay")
                .contains(SIM_FAIL_AFTER)
        );
    }

    /// Every node stage takes the not-ready label into account, so that exactly one of them
    /// matches a node: a node no stage matches keeps its pending (delayed) job, and a pending
    /// heartbeat would make a NotReady node Ready again.
    #[test]
    fn node_stages_split_on_the_not_ready_label() {
        let docs = docs();
        let key = format!(".metadata.labels[\"{NOT_READY_LABEL}\"]");
        for (name, op) in [
            ("node-initialize", "DoesNotExist"),
            ("node-heartbeat", "DoesNotExist"),
            ("node-not-ready", "Exists"),
            ("node-not-ready-heartbeat", "Exists"),
        ] {
            let stage = docs
                .iter()
                .find(|d| d["metadata"]["name"] == name)
                .expect(name);
            let exprs = stage["spec"]["selector"]["matchExpressions"]
                .as_array()
                .expect("expressions");
            assert!(
                exprs.iter().any(|e| e["key"] == key && e["operator"] == op),
                "{name} lacks {key} {op}"
            );
        }
        for name in ["node-not-ready", "node-not-ready-heartbeat"] {
            let stage = docs
                .iter()
                .find(|d| d["metadata"]["name"] == name)
                .expect(name);
            let template = stage["spec"]["next"]["statusTemplate"]
                .as_str()
                .expect("template");
            assert!(template.contains(r#"status: "False""#), "{name}");
        }
    }

    #[test]
    fn pod_ready_assigns_ips_from_the_node() {
        let ready = STAGES
            .iter()
            .find(|(n, _)| *n == "pod-ready")
            .map(|(_, y)| *y)
            .expect("pod-ready");
        assert!(ready.contains("PodIPsWith .spec.nodeName"));
        assert!(ready.contains("NodeIPsWith .spec.nodeName"));
    }
}

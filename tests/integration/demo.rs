//! `envbridge demo --real-nodes 2`, as a user runs it: the daemon and the operator deployed in
//! the cluster from manifests/deploy/local on the plane's real nodes, the tasks in real
//! containers, the whole cycle and both injected failures; its summary is the last line.

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_on_real_nodes_runs_in_the_cluster_and_exits_0() {
    crate::support::real_cluster().await;
    let out = tokio::time::timeout(
        Duration::from_secs(600),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge"))
            .args(["demo", "--real-nodes", "2"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output(),
    )
    .await
    .expect("the demo ended within 10 minutes")
    .expect("the demo ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo exited {:?}:\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let summary: serde_json::Value = serde_json::from_str(last).expect("a JSON last line");
    assert_eq!(summary["real_nodes"], 2, "{summary}");
    assert_eq!(summary["in_cluster"], true, "{summary}");
    assert_eq!(summary["nodes"], 2, "{summary}");
    assert_eq!(summary["tasks"], 6, "{summary}");
    for step in ["CONFIGURE", "START", "STOP", "RESET"] {
        assert!(summary["transitions"][step].as_u64().is_some(), "{summary}");
    }
    let failed = summary["failed_task"].as_str().unwrap_or_default();
    assert!(failed.contains("real002"), "{summary}");
    assert!(summary["midrun_failure_reported_ms"].as_u64().is_some());
    assert!(stdout.contains("deploying the daemon and the operator in the cluster"));
    assert!(stdout.contains("in-cluster daemon and operator removed"));
}

//! What a watch event costs the operator to decode, with and without its managedFields
//! (`operator::lean`): a Pod event and a Task event shaped as the benchmark's (a spec of 20
//! environment variables; managedFields of two managers, one for the spec and metadata, one
//! for the status, as the operator and kwok write them). Printed figures, no cluster.
//!
//! Run: `cargo bench --bench decode`. BENCH_EVENTS adjusts the count (default 20,000; 10 to 1,000,000).

use std::time::{Duration, Instant};

use envbridge::crd::{Task, TaskSpec, TaskStatus};
use envbridge::operator::lean::Lean;
use envbridge::operator::stored_pod::StoredPod;
use envbridge::plan::{ControlMode, EnvVar, TaskRef};
use envbridge::state::State;
use kube::core::WatchEvent;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// The managedFields entry that owns every field of `v` (what the apiserver records for a
/// manager that set them all): each key as `f:<key>`, list items by their index.
fn owned(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (format!("f:{k}"), owned(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Object(
            a.iter()
                .enumerate()
                .map(|(i, x)| (format!("k:{{\"name\":\"{i}\"}}"), owned(x)))
                .collect::<Map<_, _>>(),
        ),
        _ => json!({}),
    }
}

fn managed(obj: &mut Value, spec_manager: &str, status_manager: &str) {
    let entry = |manager: &str, sub: Option<&str>, fields: Value| {
        let mut e = json!({"manager": manager, "operation": "Update", "apiVersion": obj["apiVersion"],
            "time": "2026-12-06T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields});
        if let Some(s) = sub {
            e["subresource"] = json!(s);
        }
        e
    };
    let spec = json!({"f:metadata": owned(&obj["metadata"]), "f:spec": owned(&obj["spec"])});
    let status = json!({"f:status": owned(&obj["status"])});
    obj["metadata"]["managedFields"] = json!([
        entry(spec_manager, None, spec),
        entry(status_manager, Some("status"), status)
    ]);
}

fn pod() -> Value {
    let env: Vec<Value> = (0..20)
        .map(|i| json!({"name": format!("VAR_{i}"), "value": format!("value-{i}-of-the-task")}))
        .collect();
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bo-flp001-readout-1", "namespace": "bench", "uid": "0b5c6b1e-4f7e-4d1a-9a51-7a0d3c1f2e11",
          "resourceVersion": "123456", "creationTimestamp": "2026-12-06T10:00:00Z",
          "labels": {"envbridge.dev/environment": "bo", "app.kubernetes.io/managed-by": "envbridge"},
          "annotations": {"envbridge.dev/task-class": "readout"}},
        "spec": {"nodeName": "flp001.cluster.local", "hostNetwork": true, "restartPolicy": "Never",
          "containers": [{"name": "task", "image": "localhost/envbridge-sim:dev", "env": env,
            "args": ["--id", "readout-1", "--control-port", "47100", "--severity", "info"],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
          "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "hostIP": "10.0.0.1",
          "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-06T10:00:00Z"},
                         {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-06T10:00:00Z"}],
          "containerStatuses": [{"name": "task", "ready": true, "restartCount": 0, "image": "localhost/envbridge-sim:dev",
            "imageID": "", "state": {"running": {"startedAt": "2026-12-06T10:00:00Z"}}}]}});
    managed(&mut pod, "envbridge-operator", "kwok");
    pod
}

fn task() -> Value {
    let tref = TaskRef {
        name: "readout-1".into(),
        id: "2f8QxVb1".into(),
        path: "readout-dataflow.readout".into(),
        class: "readout".into(),
        node: "flp001".into(),
        template: "readout".into(),
        control_mode: ControlMode::Direct,
        control_port: 47100,
        critical: true,
        env: (0..20)
            .map(|i| EnvVar {
                name: format!("VAR_{i}").into(),
                value: format!("value-{i}-of-the-task").into(),
            })
            .collect(),
        args: ["--id", "readout-1", "--severity", "info"]
            .map(Into::into)
            .to_vec(),
        channels: [("readout.address", "ipc:///tmp/readout-1")]
            .map(|(k, v)| (k.into(), v.into()))
            .into(),
        ..Default::default()
    };
    let mut t = Task::new(
        "bo-flp001-readout-1",
        TaskSpec {
            environment: "bo".into(),
            task: tref,
            transition: None,
        },
    );
    t.status = Some(TaskStatus {
        state: Some(State::Running),
        pod_phase: Some("Running".into()),
        pod_ip: Some("10.0.0.1".into()),
        node_name: Some("flp001.cluster.local".into()),
        ..Default::default()
    });
    let mut t = serde_json::to_value(&t).expect("a Task encodes");
    t["metadata"] = json!({"name": "bo-flp001-readout-1", "namespace": "bench",
        "uid": "0b5c6b1e-4f7e-4d1a-9a51-7a0d3c1f2e12", "resourceVersion": "123457", "generation": 3,
        "finalizers": ["envbridge.dev/task"],
        "labels": {"envbridge.dev/environment": "bo", "app.kubernetes.io/managed-by": "envbridge"}});
    managed(&mut t, "envbridge-operator", "envbridge-operator");
    t
}

/// The time to decode `text` as a watch event of K, `n` times, per event.
fn each<K: DeserializeOwned>(text: &str, n: u32) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        let ev: WatchEvent<K> = serde_json::from_str(text).expect("decodes");
        std::hint::black_box(ev);
    }
    t.elapsed() / n
}

fn compare<K: DeserializeOwned>(what: &str, obj: Value, n: u32) -> (Duration, Duration) {
    let text = json!({"type": "MODIFIED", "object": obj}).to_string();
    each::<K>(&text, n / 10); // warm
    let full = each::<K>(&text, n);
    let lean = each::<Lean<K>>(&text, n);
    println!(
        "{what}: event {} bytes; decoded {:.1} µs, without managedFields {:.1} µs, ratio {:.2}",
        text.len(),
        full.as_secs_f64() * 1e6,
        lean.as_secs_f64() * 1e6,
        lean.as_secs_f64() / full.as_secs_f64()
    );
    (full, lean)
}

fn main() {
    // At least 10 (the warm-up is a tenth), at most a million (a few minutes at most).
    let n: u32 = match std::env::var("BENCH_EVENTS") {
        Err(_) => 20_000,
        Ok(v) => match v.parse() {
            Ok(n @ 10..=1_000_000) => n,
            _ => {
                eprintln!("BENCH_EVENTS={v}: expected a count from 10 to 1000000");
                std::process::exit(2);
            }
        },
    };
    let (pf, pl) = compare::<StoredPod>("pod", pod(), n);
    let (tf, tl) = compare::<Task>("task", task(), n);
    println!(
        "{{\"bench\":\"decode\",\"events\":{n},\"pod_us\":{:.1},\"pod_lean_us\":{:.1},\"task_us\":{:.1},\"task_lean_us\":{:.1}}}",
        pf.as_secs_f64() * 1e6,
        pl.as_secs_f64() * 1e6,
        tf.as_secs_f64() * 1e6,
        tl.as_secs_f64() * 1e6
    );
}

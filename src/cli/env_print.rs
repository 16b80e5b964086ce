//! How `envbridge env` shows the daemon's replies: aligned tables for people, JSON with
//! stable camelCase keys for scripts.

use std::collections::BTreeMap;

use envbridge::server::pb;

pub(super) fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

pub(super) fn counts(c: &std::collections::HashMap<String, u32>) -> String {
    let sorted: BTreeMap<_, _> = c.iter().collect();
    sorted
        .iter()
        .map(|(s, n)| format!("{s}:{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn print_table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
}

pub(super) fn print_failures(failures: &[pb::Failure], warnings: &[pb::Failure]) {
    for f in failures {
        println!(
            "  FAILED {} on {} ({}): {}",
            f.task, f.node, f.path, f.message
        );
    }
    for f in warnings {
        println!(
            "  warning (non-critical) {} on {} ({}): {}",
            f.task, f.node, f.path, f.message
        );
    }
}

pub(super) fn failure_json(f: &pb::Failure) -> serde_json::Value {
    serde_json::json!({"task": f.task, "node": f.node, "path": f.path, "critical": f.critical, "message": f.message})
}

pub(super) fn task_json(t: &pb::Task) -> serde_json::Value {
    serde_json::json!({
        "name": t.name, "node": t.node, "class": t.class, "path": t.path, "critical": t.critical,
        "state": t.state, "podPhase": t.pod_phase, "podIP": t.pod_ip, "message": t.message,
        "transitionId": t.transition_id, "changedUnixMs": t.changed_unix_ms,
    })
}

pub(super) fn env_json(e: &pb::Environment) -> serde_json::Value {
    let tr = |t: &Option<pb::TransitionInfo>| {
        t.as_ref().map(|t| serde_json::json!({"id": t.id, "event": t.event, "phase": t.phase, "message": t.message}))
    };
    serde_json::json!({
        "id": e.id, "namespace": e.namespace, "name": e.name, "workflow": e.workflow,
        "nodes": e.nodes, "tasksExpected": e.tasks_expected, "desiredState": e.desired_state,
        "state": e.state, "requested": tr(&e.requested), "observed": tr(&e.observed),
        "counts": e.counts.iter().collect::<BTreeMap<_, _>>(),
        "tasks": e.tasks.iter().map(task_json).collect::<Vec<_>>(),
        "failing": e.failing.iter().map(failure_json).collect::<Vec<_>>(),
        "deleting": e.deleting,
    })
}

pub(super) fn create_json(r: &pb::CreateEnvironmentReply) -> serde_json::Value {
    serde_json::json!({
        "id": r.id, "namespace": r.namespace, "name": r.name, "nodes": r.nodes, "tasks": r.tasks,
        "created": r.created, "outcome": r.outcome, "message": r.message,
        "failures": r.failures.iter().map(failure_json).collect::<Vec<_>>(),
        "warnings": r.warnings.iter().map(failure_json).collect::<Vec<_>>(),
    })
}

pub(super) fn transition_json(r: &pb::TransitionReply) -> serde_json::Value {
    serde_json::json!({
        "transitionId": r.transition_id, "event": r.event, "targetState": r.target_state, "ok": r.ok,
        "outcome": r.outcome, "message": r.message, "tasks": r.tasks, "elapsedMs": r.elapsed_ms,
        "failures": r.failures.iter().map(failure_json).collect::<Vec<_>>(),
        "warnings": r.warnings.iter().map(failure_json).collect::<Vec<_>>(),
    })
}

pub(super) fn event_json(ev: &pb::RosterEvent) -> serde_json::Value {
    serde_json::json!({
        "kind": ev.kind, "namespace": ev.namespace, "environment": ev.env_name, "taskName": ev.task_name,
        "task": ev.task.as_ref().map(task_json), "env": ev.environment.as_ref().map(env_json),
    })
}

pub(super) fn event_line(ev: &pb::RosterEvent) -> String {
    match (&ev.task, &ev.environment) {
        (Some(t), _) => format!(
            "{:<13} {}/{} task {} {} {} {}",
            ev.kind,
            ev.namespace,
            ev.env_name,
            t.name,
            t.state,
            or_dash(&t.pod_phase),
            t.message
        ),
        (None, Some(e)) => {
            format!(
                "{:<13} {}/{} desired {} state {} {}",
                ev.kind,
                ev.namespace,
                ev.env_name,
                e.desired_state,
                or_dash(&e.state),
                counts(&e.counts)
            )
        }
        _ => format!(
            "{:<13} {}/{} {}",
            ev.kind, ev.namespace, ev.env_name, ev.task_name
        ),
    }
}

use std::time::{Duration, SystemTime};

use super::*;
use crate::state::Event;

fn env_key() -> EnvKey {
    EnvKey::new("ns1", "env-a")
}

fn env(tasks: u32) -> EnvRecord {
    EnvRecord {
        key: env_key(),
        id: "a".into(),
        workflow: "readout-dataflow".into(),
        nodes: 1,
        tasks,
        desired: State::Standby,
        state: None,
        requested: None,
        observed: None,
        failing: vec![],
        deleting: false,
        run_number: None,
        created_at: SystemTime::UNIX_EPOCH,
        changed_at: SystemTime::UNIX_EPOCH,
    }
}

fn task(r: &Roster, name: &str, node: &str, state: State) -> TaskRecord {
    TaskRecord {
        name: name.into(),
        env: env_key(),
        node: r.intern(node),
        class: r.intern("readout"),
        path: format!("readout-dataflow.host-{node}.{name}").into(),
        critical: true,
        state,
        pod_phase: Some(r.intern("Running")),
        pod_ip: Some(r.intern("127.1.0.1")),
        message: None,
        transition: None,
        ports: vec![47100, 47101].into(),
        control_port: 47100,
        deleting: false,
        changed_at: SystemTime::UNIX_EPOCH,
    }
}

fn acted(mut t: TaskRecord, r: &Roster, id: &str, state: State) -> TaskRecord {
    t.transition = Some((r.intern(id), Phase::Succeeded));
    t.state = state;
    t
}

#[test]
fn apply_delete_and_noop_updates() {
    let r = Roster::new();
    let mut rx = r.subscribe();
    assert!(r.apply_env(env(2)));
    assert!(!r.apply_env(env(2)), "same content is not a change");
    assert!(r.apply_task(task(&r, "t1", "flp001", State::Standby)));
    assert!(!r.apply_task(task(&r, "t1", "flp001", State::Standby)));
    assert!(r.apply_task(task(&r, "t1", "flp001", State::Configured)));
    assert_eq!(
        r.sizes(),
        Sizes {
            environments: 1,
            tasks: 1
        }
    );
    assert_eq!(r.task(&env_key(), "t1").unwrap().state, State::Configured);
    assert!(r.delete_task(&env_key(), "t1"));
    assert!(!r.delete_task(&env_key(), "t1"));
    assert!(r.delete_env(&env_key()));
    assert_eq!(r.sizes(), Sizes::default());
    let mut kinds = vec![];
    while let Ok(c) = rx.try_recv() {
        kinds.push(match c {
            Change::EnvApplied(_) => "env+",
            Change::EnvDeleted(_) => "env-",
            Change::TaskApplied(_) => "task+",
            Change::TaskDeleted { .. } => "task-",
            Change::Reset(_) => "reset",
        });
    }
    assert_eq!(kinds, ["env+", "task+", "task+", "task-", "env-"]);
}

#[test]
fn reset_drops_what_was_not_relisted() {
    let r = Roster::new();
    r.apply_env(env(3));
    for n in ["t1", "t2", "t3"] {
        r.apply_task(task(&r, n, "flp001", State::Standby));
    }
    let other = EnvKey::new("ns2", "env-b");
    let mut t4 = task(&r, "t4", "flp002", State::Standby);
    t4.env = other.clone();
    r.apply_task(t4);
    let before = r.task(&env_key(), "t1").unwrap().changed_at;

    // Relist: t1 unchanged, t2 changed, t3 and env-b's t4 gone, t5 new.
    r.reset_tasks(vec![
        task(&r, "t1", "flp001", State::Standby),
        task(&r, "t2", "flp001", State::Configured),
        task(&r, "t5", "flp003", State::Standby),
    ]);
    let names: Vec<_> = r
        .tasks_of(&env_key())
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["t1", "t2", "t5"]);
    assert!(r.tasks_of(&other).is_empty());
    assert_eq!(r.sizes().tasks, 3);
    assert_eq!(
        r.task(&env_key(), "t1").unwrap().changed_at,
        before,
        "unchanged keeps its time"
    );
    assert_eq!(r.task(&env_key(), "t2").unwrap().state, State::Configured);

    r.reset_envs(vec![]);
    assert!(r.env(&env_key()).is_none());
}

#[test]
fn ports_in_use_skip_the_excluded_environment() {
    let r = Roster::new();
    r.apply_task(task(&r, "t1", "flp001", State::Standby));
    let mut t2 = task(&r, "t2", "flp002", State::Standby);
    t2.env = EnvKey::new("ns2", "b");
    t2.ports = vec![48000].into();
    r.apply_task(t2);
    let all = r.ports_in_use(None);
    assert_eq!(
        all["flp001"].iter().copied().collect::<Vec<_>>(),
        [47100, 47101]
    );
    assert_eq!(all["flp002"].iter().copied().collect::<Vec<_>>(), [48000]);
    let without = r.ports_in_use(Some(&env_key()));
    assert!(!without.contains_key("flp001"));
}

#[test]
fn stale_states_do_not_finish_a_wait() {
    let r = Roster::new();
    r.apply_env(env(2));
    // Both tasks already CONFIGURED, but from an earlier transition "t0".
    for n in ["t1", "t2"] {
        r.apply_task(acted(
            task(&r, n, "flp001", State::Standby),
            &r,
            "t0",
            State::Configured,
        ));
    }
    let since = SystemTime::now();
    let p = r
        .evaluate(&env_key(), "t1-id", State::Configured, since)
        .unwrap_err();
    assert_eq!((p.expected, p.seen, p.done), (2, 2, 0));

    r.apply_task(acted(
        task(&r, "t1", "flp001", State::Standby),
        &r,
        "t1-id",
        State::Configured,
    ));
    let p = r
        .evaluate(&env_key(), "t1-id", State::Configured, since)
        .unwrap_err();
    assert_eq!(p.done, 1);
    r.apply_task(acted(
        task(&r, "t2", "flp001", State::Standby),
        &r,
        "t1-id",
        State::Configured,
    ));
    assert_eq!(
        r.evaluate(&env_key(), "t1-id", State::Configured, since),
        Ok(Outcome::Reached {
            tasks: 2,
            warnings: vec![]
        })
    );
}

#[test]
fn missing_tasks_keep_a_wait_pending() {
    let r = Roster::new();
    r.apply_env(env(3));
    r.apply_task(acted(
        task(&r, "t1", "flp001", State::Standby),
        &r,
        "x",
        State::Configured,
    ));
    let p = r
        .evaluate(&env_key(), "x", State::Configured, SystemTime::now())
        .unwrap_err();
    assert_eq!((p.expected, p.seen, p.done), (3, 1, 1));
}

#[test]
fn critical_error_fails_at_once_and_names_the_task() {
    let r = Roster::new();
    r.apply_env(env(3));
    let since = SystemTime::now() - Duration::from_secs(1);
    r.apply_task(acted(
        task(&r, "t1", "flp001", State::Standby),
        &r,
        "x",
        State::Configured,
    ));
    let mut bad = acted(
        task(&r, "t2", "flp002", State::Standby),
        &r,
        "x",
        State::Error,
    );
    bad.message = Some("INIT DEVICE refused: missing channel".into());
    r.apply_task(bad);
    let mut soft = acted(
        task(&r, "t3", "flp003", State::Standby),
        &r,
        "x",
        State::Error,
    );
    soft.critical = false;
    soft.message = Some("qc down".into());
    r.apply_task(soft);
    match r.evaluate(&env_key(), "x", State::Configured, since) {
        Ok(Outcome::Failed {
            failures,
            warnings,
            message,
        }) => {
            assert_eq!(failures.len(), 1);
            assert_eq!(failures[0].task, "t2");
            assert_eq!(failures[0].message, "INIT DEVICE refused: missing channel");
            assert!(message.contains("t2"), "{message}");
            assert_eq!(warnings.len(), 1);
            assert_eq!(warnings[0].task, "t3");
        }
        other => panic!("expected failure, got {other:?}"),
    }
}

#[test]
fn a_mass_failure_is_counted_in_one_short_message() {
    let r = Roster::new();
    r.apply_env(env(2000));
    for i in 0..2000 {
        let t = task(&r, &format!("t{i:04}"), "flp001", State::Standby);
        r.apply_task(acted(t, &r, "x", State::Error));
    }
    match r.evaluate(&env_key(), "x", State::Configured, SystemTime::now()) {
        Ok(Outcome::Failed {
            failures, message, ..
        }) => {
            assert_eq!(failures.len(), 2000, "the outcome keeps every failure");
            assert!(message.starts_with("2000 critical task(s) failed: t0000, t0001"));
            assert!(message.ends_with("t0009 and 1990 more"), "{message}");
        }
        other => panic!("expected failure, got {other:?}"),
    }
}

#[test]
fn non_critical_failure_is_reported_but_does_not_fail() {
    let r = Roster::new();
    r.apply_env(env(2));
    r.apply_task(acted(
        task(&r, "t1", "flp001", State::Standby),
        &r,
        "x",
        State::Configured,
    ));
    let mut soft = acted(
        task(&r, "t2", "flp002", State::Standby),
        &r,
        "x",
        State::Error,
    );
    soft.critical = false;
    r.apply_task(soft);
    match r.evaluate(&env_key(), "x", State::Configured, SystemTime::now()) {
        Ok(Outcome::Reached { tasks, warnings }) => {
            assert_eq!(tasks, 2);
            assert_eq!(warnings[0].task, "t2");
        }
        other => panic!("expected success, got {other:?}"),
    }
}

#[test]
fn an_old_error_is_stale_for_a_new_transition() {
    let r = Roster::new();
    r.apply_env(env(1));
    r.apply_task(acted(
        task(&r, "t1", "flp001", State::Standby),
        &r,
        "old",
        State::Error,
    ));
    let since = SystemTime::now() + Duration::from_secs(1);
    // RECOVER requested after the error: the error must not end the wait.
    assert!(
        r.evaluate(&env_key(), "new", State::Standby, since)
            .is_err()
    );
}

#[test]
fn environment_failed_phase_ends_the_wait() {
    let r = Roster::new();
    let mut e = env(1);
    e.observed = Some(Observed {
        id: "x".into(),
        event: Event::Configure,
        phase: Phase::Failed,
        message: Some("no node flp009".into()),
    });
    e.failing = vec![FailingTask {
        name: "t1".into(),
        node: "flp009".into(),
        path: "p".into(),
        critical: true,
        message: "no Node for machine_id flp009".into(),
    }];
    r.apply_env(e);
    match r.evaluate(&env_key(), "x", State::Configured, SystemTime::now()) {
        Ok(Outcome::Failed {
            message, failures, ..
        }) => {
            assert_eq!(message, "no node flp009");
            assert_eq!(failures[0].task, "t1");
        }
        other => panic!("{other:?}"),
    }
    // ...but only for that transition id.
    assert!(
        r.evaluate(&env_key(), "y", State::Configured, SystemTime::now())
            .is_err()
    );
}

#[tokio::test]
async fn waiter_wakes_on_change_and_times_out_with_progress() {
    let r = std::sync::Arc::new(Roster::new());
    r.apply_env(env(1));
    r.apply_task(task(&r, "t1", "flp001", State::Standby));
    let since = SystemTime::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let r2 = r.clone();
    let waiter = tokio::spawn(async move {
        r2.wait_transition(&env_key(), "x", State::Configured, since, deadline)
            .await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    r.apply_task(acted(
        task(&r, "t1", "flp001", State::Standby),
        &r,
        "x",
        State::Configured,
    ));
    let out = waiter.await.unwrap();
    assert_eq!(
        out,
        Ok(Outcome::Reached {
            tasks: 1,
            warnings: vec![]
        })
    );

    let short = tokio::time::Instant::now() + Duration::from_millis(30);
    let p = r
        .wait_transition(&env_key(), "never", State::Running, since, short)
        .await
        .unwrap_err();
    assert_eq!((p.expected, p.seen, p.done), (1, 1, 0));
}

#[test]
fn memory_per_task_stays_under_two_kilobytes() {
    let r = Roster::new();
    let envs = 4;
    let per_env = 500;
    for e in 0..envs {
        let key = EnvKey::new("envbridge", &format!("env-{e}"));
        for i in 0..per_env {
            let node = format!("flp{:03}.cluster.local", i % 250);
            let name = format!("env-{e}-flp{:03}-readout-{i:04}-abcdef12", i % 250);
            let mut t = task(&r, &name, &node, State::Standby);
            t.env = key.clone();
            t.path = format!(
                "readout-dataflow.host-flp{:03}.data-distribution.stfb-{i}",
                i % 250
            )
            .into();
            t.pod_ip = Some(r.intern(&format!("127.1.{}.{}", i / 250, i % 250)));
            t.transition = Some((
                r.intern("3f1c0e7a-8d5b-4a43-9b1e-000000000001"),
                Phase::Succeeded,
            ));
            r.apply_task(t);
        }
    }
    let tasks = envs * per_env;
    let bytes = r.task_heap_bytes();
    let per_task = bytes / tasks;
    println!("roster: {tasks} tasks, {bytes} bytes, {per_task} bytes per task");
    assert_eq!(r.sizes().tasks, tasks);
    assert!(per_task <= 2048, "{per_task} bytes per task");
}

#[test]
fn deploy_wait_needs_every_task_in_state() {
    let r = Roster::new();
    r.apply_env(env(2));
    r.apply_task(task(&r, "t1", "flp001", State::Standby));
    assert!(
        r.evaluate_state(&env_key(), State::Standby).is_err(),
        "one task missing"
    );
    r.apply_task(task(&r, "t2", "flp001", State::Deploying));
    assert_eq!(
        r.evaluate_state(&env_key(), State::Standby)
            .unwrap_err()
            .done,
        1
    );
    let mut bad = task(&r, "t2", "flp001", State::Error);
    bad.message = Some("ErrImagePull".into());
    r.apply_task(bad);
    match r.evaluate_state(&env_key(), State::Standby) {
        Ok(Outcome::Failed { failures, .. }) => assert_eq!(failures[0].message, "ErrImagePull"),
        other => panic!("{other:?}"),
    }
    r.apply_task(task(&r, "t2", "flp001", State::Standby));
    assert!(matches!(
        r.evaluate_state(&env_key(), State::Standby),
        Ok(Outcome::Reached { tasks: 2, .. })
    ));
}

#[test]
fn deploy_wait_fails_on_what_the_environment_reports_failing_besides_its_tasks() {
    let r = Roster::new();
    let mut e = env(1);
    e.failing = vec![FailingTask {
        name: "call w.lhc.deploy".into(),
        node: r.intern(""),
        path: "w.lhc.deploy".into(),
        critical: true,
        message: "lhc.UpdateFillInfo() at deployment: refused".into(),
    }];
    r.apply_env(e.clone());
    match r.evaluate_state(&env_key(), State::Standby) {
        Ok(Outcome::Failed { failures, .. }) => {
            assert_eq!(failures[0].task, "call w.lhc.deploy");
            assert!(failures[0].message.contains("refused"));
        }
        other => panic!("{other:?}"),
    }
    // A failing entry that is one of its tasks is judged by the task's own record.
    e.failing[0].name = "t1".into();
    r.apply_env(e);
    r.apply_task(task(&r, "t1", "flp001", State::Standby));
    assert!(matches!(
        r.evaluate_state(&env_key(), State::Standby),
        Ok(Outcome::Reached { tasks: 1, .. })
    ));
}

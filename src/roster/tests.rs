use std::time::{Duration, SystemTime};

use super::*;
use crate::state::Event;

fn env_key() -> EnvKey {
    EnvKey::new("ns1", "env-a")
}

fn env(tasks: u32) -> EnvRecord {
    EnvRecord {
        tasks,
        ..EnvRecord::bare(env_key())
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
        pid: 0,
        deleting: false,
        changed_at: SystemTime::UNIX_EPOCH,
    }
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

/// An environment record whose status reports transition `id` in `phase`.
fn observed(mut e: EnvRecord, id: &str, phase: Phase, message: &str) -> EnvRecord {
    e.observed = Some(Observed {
        id: id.into(),
        event: Event::Configure,
        phase,
        message: (!message.is_empty()).then(|| message.into()),
    });
    e
}

fn failing(task: &str, critical: bool, message: &str) -> Failure {
    Failure {
        task: task.into(),
        node: "flp001".into(),
        path: format!("p.{task}").into(),
        critical,
        message: message.into(),
    }
}

#[test]
fn only_the_status_of_this_transition_ends_its_wait() {
    let r = Roster::new();
    // Every task CONFIGURED, but the status reports an earlier transition.
    let mut e = observed(env(2), "t0", Phase::Succeeded, "");
    e.counts = BTreeMap::from([(State::Configured, 2)]);
    r.apply_env(e.clone());
    let p = r.evaluate(&env_key(), "t1", State::Configured).unwrap_err();
    assert_eq!((p.expected, p.in_target), (2, 2));
    r.apply_env(observed(
        e.clone(),
        "t1",
        Phase::Running,
        "1/2 critical tasks done",
    ));
    let p = r.evaluate(&env_key(), "t1", State::Configured).unwrap_err();
    assert_eq!(p.message.as_deref(), Some("1/2 critical tasks done"));
    r.apply_env(observed(e, "t1", Phase::Succeeded, ""));
    assert_eq!(
        r.evaluate(&env_key(), "t1", State::Configured),
        Ok(Outcome::Reached {
            tasks: 2,
            warnings: vec![]
        })
    );
}

/// The Environment status can arrive before the Task records (separate watches): a wait
/// ends only once every task record shows the target, ERROR, or the transition acted on.
#[test]
fn a_wait_ends_only_once_the_task_records_have_caught_up() {
    let r = Roster::new();
    let mut e = observed(env(2), "t1", Phase::Succeeded, "");
    e.counts = BTreeMap::from([(State::Configured, 2)]);
    r.apply_env(e);
    r.apply_task(task(&r, "t1", "flp001", State::Configured));
    r.apply_task(task(&r, "t2", "flp001", State::Standby));
    let mut hook = task(&r, "h", "flp001", State::Standby);
    hook.control_port = 0;
    r.apply_task(hook);
    assert!(r.evaluate(&env_key(), "t1", State::Configured).is_err());
    // A record that acted on this transition counts whatever its state says.
    let mut t2 = task(&r, "t2", "flp001", State::Standby);
    t2.transition = Some((r.intern("t1"), Phase::Failed));
    r.apply_task(t2);
    assert!(matches!(
        r.evaluate(&env_key(), "t1", State::Configured),
        Ok(Outcome::Reached { tasks: 2, .. })
    ));
    // The same for a deployment's state, without a transition.
    let mut s = env(2);
    s.state = Some(State::Standby);
    r.apply_env(s);
    assert!(r.evaluate_state(&env_key(), State::Standby).is_err());
    r.apply_task(task(&r, "t1", "flp001", State::Standby));
    assert!(r.evaluate_state(&env_key(), State::Standby).is_ok());
}

#[test]
fn a_failed_transition_names_its_critical_tasks_and_warns_of_the_rest() {
    let r = Roster::new();
    let mut e = observed(env(3), "x", Phase::Failed, "task t2 (node flp001): refused");
    e.failing = vec![
        failing("t2", true, "INIT DEVICE refused: missing channel"),
        failing("t3", false, "qc down"),
    ];
    e.failing_critical = 1;
    r.apply_env(e);
    match r.evaluate(&env_key(), "x", State::Configured) {
        Ok(Outcome::Failed {
            failures,
            warnings,
            message,
        }) => {
            assert_eq!(message, "1 critical task(s) failed: t2");
            assert_eq!(failures.len(), 1);
            assert_eq!(
                &*failures[0].message,
                "INIT DEVICE refused: missing channel"
            );
            assert_eq!(warnings.len(), 1);
            assert_eq!(&*warnings[0].task, "t3");
        }
        other => panic!("expected failure, got {other:?}"),
    }
}

#[test]
fn a_mass_failure_is_counted_in_one_short_message() {
    let r = Roster::new();
    // The status lists 100 of 2,000 critical failures and counts them all.
    let mut e = observed(env(2000), "x", Phase::Failed, "");
    e.failing = (0..100)
        .map(|i| failing(&format!("t{i:04}"), true, "refused"))
        .collect();
    e.failing_critical = 2000;
    r.apply_env(e);
    match r.evaluate(&env_key(), "x", State::Configured) {
        Ok(Outcome::Failed {
            failures, message, ..
        }) => {
            assert_eq!(failures.len(), 100, "what the status lists");
            assert!(message.starts_with("2000 critical task(s) failed: t0000, t0001"));
            assert!(message.ends_with("t0009 and 1990 more"), "{message}");
        }
        other => panic!("expected failure, got {other:?}"),
    }
}

#[test]
fn non_critical_failures_are_reported_with_a_success() {
    let r = Roster::new();
    let mut e = observed(env(2), "x", Phase::Succeeded, "");
    e.failing = vec![failing("t2", false, "qc down")];
    r.apply_env(e);
    match r.evaluate(&env_key(), "x", State::Configured) {
        Ok(Outcome::Reached { tasks, warnings }) => {
            assert_eq!(tasks, 2);
            assert_eq!(&*warnings[0].task, "t2");
        }
        other => panic!("expected success, got {other:?}"),
    }
}

#[test]
fn a_failure_no_task_is_blamed_for_is_told_in_the_operators_words() {
    let r = Roster::new();
    r.apply_env(observed(env(1), "x", Phase::Failed, "no node flp009"));
    match r.evaluate(&env_key(), "x", State::Configured) {
        Ok(Outcome::Failed {
            message, failures, ..
        }) => {
            assert_eq!(message, "no node flp009");
            assert!(failures.is_empty());
        }
        other => panic!("{other:?}"),
    }
    // ...but only for that transition id.
    assert!(r.evaluate(&env_key(), "y", State::Configured).is_err());
}

#[tokio::test]
async fn waiter_wakes_on_change_and_times_out_with_progress() {
    let r = std::sync::Arc::new(Roster::new());
    let mut e = env(1);
    e.counts = BTreeMap::from([(State::Standby, 1)]);
    r.apply_env(e.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let r2 = r.clone();
    let waiter = tokio::spawn(async move {
        r2.wait_transition(&env_key(), "x", State::Configured, deadline)
            .await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    r.apply_env(observed(e, "x", Phase::Succeeded, ""));
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
        .wait_transition(&env_key(), "never", State::Running, short)
        .await
        .unwrap_err();
    assert_eq!((p.expected, p.in_target), (1, 0));
}

#[test]
fn a_deploy_wait_reads_the_environments_state() {
    let r = Roster::new();
    let mut e = env(2);
    r.apply_env(e.clone());
    assert!(
        r.evaluate_state(&env_key(), State::Standby).is_err(),
        "no status yet"
    );
    e.state = Some(State::Mixed);
    e.counts = BTreeMap::from([(State::Deploying, 1), (State::Standby, 1)]);
    r.apply_env(e.clone());
    assert_eq!(
        r.evaluate_state(&env_key(), State::Standby)
            .unwrap_err()
            .in_target,
        1
    );
    e.state = Some(State::Error);
    e.failing = vec![failing("t2", true, "ErrImagePull")];
    r.apply_env(e.clone());
    match r.evaluate_state(&env_key(), State::Standby) {
        Ok(Outcome::Failed { failures, .. }) => {
            assert_eq!(&*failures[0].message, "ErrImagePull")
        }
        other => panic!("{other:?}"),
    }
    e.state = Some(State::Standby);
    e.failing.clear();
    r.apply_env(e);
    assert!(matches!(
        r.evaluate_state(&env_key(), State::Standby),
        Ok(Outcome::Reached { tasks: 2, .. })
    ));
}

#[test]
fn a_deploy_wait_fails_on_a_failed_deployment_call() {
    let r = Roster::new();
    let mut e = env(1);
    e.state = Some(State::Error);
    e.failing = vec![Failure {
        task: "call w.lhc.deploy".into(),
        node: r.intern(""),
        path: "w.lhc.deploy".into(),
        critical: true,
        message: "lhc.UpdateFillInfo() at deployment: refused".into(),
    }];
    r.apply_env(e);
    match r.evaluate_state(&env_key(), State::Standby) {
        Ok(Outcome::Failed {
            failures, message, ..
        }) => {
            assert_eq!(&*failures[0].task, "call w.lhc.deploy");
            assert!(failures[0].message.contains("refused"));
            assert_eq!(message, "1 critical task(s) failed: call w.lhc.deploy");
        }
        other => panic!("{other:?}"),
    }
}

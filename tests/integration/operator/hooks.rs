//! Hook tasks gate transitions, and RECOVER brings back a task whose pod ended (local control
//! plane, kwok nodes; pods end through the `envbridge.dev/sim-succeed` / `sim-fail` stages,
//! selected by labelling the pod once the test has seen the transition wait for it).

use std::time::{Duration, Instant};

use envbridge::crd::{Environment, Task, TransitionPhase};
use envbridge::plan::{ControlMode, TaskRef};
use envbridge::state::{Event, State};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::{
    Fixture, Res, WAIT, deploy, destroy, finish, fixture, start, state_is, task_ref, transition,
    wait_env,
};

fn hook(env: &str, name: &str, trigger: &str, critical: bool) -> TaskRef {
    let mut t = task_ref(env, "flp001", "readout", 9, ControlMode::Hook);
    t.name = format!("{env}-{name}");
    t.id = t.name.clone();
    t.path = format!("rd.{name}");
    t.trigger = Some(trigger.into());
    t.critical = critical;
    t.channels.clear();
    t.timeout_seconds = Some(60);
    t
}

fn plain(env: &str, hosts: &[&str]) -> Vec<TaskRef> {
    hosts
        .iter()
        .map(|h| task_ref(env, h, "readout", 1, ControlMode::Basic))
        .collect()
}

async fn wait_until<T>(what: &str, mut probe: impl AsyncFnMut() -> Res<Option<T>>) -> Res<T> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = probe().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("never happened: {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the pod of `task` (not being deleted) and returns it.
async fn wait_pod(fx: &Fixture, task: &str) -> Res<Pod> {
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    wait_until(&format!("pod {task} exists"), async || {
        Ok(pods
            .get_opt(task)
            .await?
            .filter(|p| p.metadata.deletion_timestamp.is_none()))
    })
    .await
}

async fn wait_pod_gone(fx: &Fixture, task: &str) -> Res {
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    wait_until(&format!("pod {task} gone"), async || {
        Ok(pods.get_opt(task).await?.is_none().then_some(()))
    })
    .await
}

async fn wait_task(
    fx: &Fixture,
    name: &str,
    what: &str,
    cond: impl Fn(&Task) -> bool,
) -> Res<Task> {
    let api: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    wait_until(&format!("task {name}: {what}"), async || {
        Ok(api.get_opt(name).await?.filter(|t| cond(t)))
    })
    .await
}

fn task_state(t: &Task) -> Option<State> {
    t.status.as_ref().and_then(|s| s.state)
}

/// Ends a running pod through a kwok stage (`sim-succeed` or `sim-fail`).
async fn end_pod(fx: &Fixture, pod: &str, stage: &str, message: &str) -> Res {
    let patch = json!({"metadata": {
        "labels": {format!("envbridge.dev/{stage}"): "1"},
        "annotations": {"envbridge.dev/sim-message": message}}});
    Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn transition_of(e: &Environment, id: &str) -> Option<(TransitionPhase, String)> {
    e.status
        .as_ref()
        .and_then(|s| s.transition.as_ref())
        .filter(|t| t.id == id)
        .map(|t| (t.phase, t.message.clone()))
}

fn phase_is(id: &'static str, phase: TransitionPhase) -> impl Fn(&Environment) -> bool {
    move |e| transition_of(e, id).is_some_and(|(p, _)| p == phase)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_configure_hooks_gate_the_transition() -> Res {
    let fx = fixture("hooks").await?;
    let op = start(&fx, None).await?;
    let task_api: Api<Task> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);

    // Critical hook: succeeds, then (second CONFIGURE) fails.
    let h = hook("eh", "pre", "before_CONFIGURE", true);
    // Runs once the tasks reached CONFIGURED.
    let post = hook("eh", "post", "after_CONFIGURE", true);
    let mut tasks = plain("eh", &["flp001", "flp002"]);
    tasks.push(h.clone());
    tasks.push(post.clone());
    deploy(&fx, "eh", &tasks, false).await?;
    // Non-critical hook in a second environment.
    let w = hook("ew", "pre", "before_CONFIGURE", false);
    let mut wtasks = plain("ew", &["flp003"]);
    wtasks.push(w.clone());
    deploy(&fx, "ew", &wtasks, false).await?;

    // An idle hook has no pod and does not hold the environment's state back.
    let env = wait_env(&fx, "eh", "STANDBY 2/2", |e| {
        state_is(State::Standby)(e)
            && e.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("2/2")
    })
    .await?;
    assert!(env.status.unwrap().failing_tasks.is_empty());
    wait_task(&fx, &h.name, "STANDBY", |t| {
        task_state(t) == Some(State::Standby)
    })
    .await?;
    assert!(
        pods.get_opt(&h.name).await?.is_none(),
        "idle hook has a pod"
    );

    // CONFIGURE: the hook's pod runs first; the tasks wait for it.
    let mut op = op;
    transition(&fx, "eh", "cfg-1", Event::Configure).await?;
    let first = wait_pod(&fx, &h.name).await?;
    // An operator restart while the hook runs re-attaches its pod (same UID, no second run).
    op.stop().await?;
    op = start(&fx, None).await?;
    let ht = wait_task(&fx, &h.name, "RUNNING", |t| {
        task_state(t) == Some(State::Running)
    })
    .await?;
    assert_eq!(ht.spec.transition.unwrap().id, "cfg-1");
    // Give the operator time it could misuse, then check nothing moved past the hook.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        pods.get(&h.name).await?.uid(),
        first.uid(),
        "hook pod re-created"
    );
    assert!(
        pods.get_opt(&post.name).await?.is_none(),
        "after hook ran early"
    );
    let env = wait_env(
        &fx,
        "eh",
        "cfg-1 Running",
        phase_is("cfg-1", TransitionPhase::Running),
    )
    .await?;
    let (_, msg) = transition_of(&env, "cfg-1").unwrap();
    assert!(msg.contains(&format!("hook task {}", h.name)), "{msg}");
    for t in &tasks[..2] {
        let t = task_api.get(&t.name).await?;
        assert_eq!(task_state(&t), Some(State::Standby));
        assert!(
            t.spec.transition.as_ref().is_none_or(|tr| tr.id != "cfg-1"),
            "task {} received CONFIGURE before the hook ended",
            t.name_any()
        );
    }
    let t0 = Instant::now();
    end_pod(&fx, &h.name, "sim-succeed", "").await?;
    // Tasks CONFIGURED, then the after hook runs; the transition waits for it.
    wait_pod(&fx, &post.name).await?;
    println!(
        "after-hook pod created {:?} after the before-hook was told to end (operator restarting meanwhile)",
        t0.elapsed()
    );
    for t in &tasks[..2] {
        let t = task_api.get(&t.name).await?;
        assert_eq!(task_state(&t), Some(State::Configured), "{}", t.name_any());
    }
    let env = wait_env(&fx, "eh", "cfg-1 Running", |e| {
        transition_of(e, "cfg-1").is_some_and(|(p, m)| {
            p == TransitionPhase::Running && m.contains(&format!("hook task {}", post.name))
        })
    })
    .await?;
    assert_eq!(env.status.unwrap().state, Some(State::Configured));
    end_pod(&fx, &post.name, "sim-succeed", "").await?;
    let env = wait_env(
        &fx,
        "eh",
        "cfg-1 Succeeded",
        phase_is("cfg-1", TransitionPhase::Succeeded),
    )
    .await?;
    println!(
        "CONFIGURE completed {:?} after the before-hook pod was told to end (restart and after-hook included)",
        t0.elapsed()
    );
    assert_eq!(env.status.as_ref().unwrap().state, Some(State::Configured));
    assert_eq!(transition_of(&env, "cfg-1").unwrap().1, "");
    let ht = wait_task(&fx, &h.name, "STANDBY after its run", |t| {
        task_state(t) == Some(State::Standby)
    })
    .await?;
    let tr = ht.status.unwrap().transition.unwrap();
    assert_eq!(
        (tr.id.as_str(), tr.phase),
        ("cfg-1", TransitionPhase::Succeeded)
    );
    wait_pod_gone(&fx, &h.name).await?;

    // RESET does not trigger the hook: no pod, the environment goes back to STANDBY.
    transition(&fx, "eh", "reset-1", Event::Reset).await?;
    wait_env(&fx, "eh", "STANDBY after RESET", |e| {
        state_is(State::Standby)(e) && phase_is("reset-1", TransitionPhase::Succeeded)(e)
    })
    .await?;
    assert!(pods.get_opt(&h.name).await?.is_none(), "RESET ran the hook");

    // A failing critical hook fails CONFIGURE, naming the hook; the tasks never receive it.
    transition(&fx, "eh", "cfg-2", Event::Configure).await?;
    wait_pod(&fx, &h.name).await?;
    end_pod(&fx, &h.name, "sim-fail", "calibration missing").await?;
    let env = wait_env(
        &fx,
        "eh",
        "cfg-2 Failed",
        phase_is("cfg-2", TransitionPhase::Failed),
    )
    .await?;
    let (_, msg) = transition_of(&env, "cfg-2").unwrap();
    assert!(msg.contains(&format!("hook task {}", h.name)), "{msg}");
    assert!(msg.contains("calibration missing"), "{msg}");
    let st = env.status.unwrap();
    let f = st.failing_tasks.iter().find(|f| f.name == h.name);
    assert!(f.is_some_and(|f| f.critical), "{:?}", st.failing_tasks);
    assert_eq!(st.state, Some(State::Error));
    assert!(
        pods.get_opt(&post.name).await?.is_none(),
        "after hook ran after a failure"
    );
    for t in &tasks[..2] {
        let t = task_api.get(&t.name).await?;
        assert_eq!(task_state(&t), Some(State::Standby));
        assert!(
            t.spec
                .transition
                .as_ref()
                .is_some_and(|tr| tr.id == "reset-1")
        );
    }

    // A failing non-critical hook: CONFIGURE succeeds with a warning.
    transition(&fx, "ew", "cfg-w", Event::Configure).await?;
    wait_pod(&fx, &w.name).await?;
    end_pod(&fx, &w.name, "sim-fail", "dcs unreachable").await?;
    let env = wait_env(
        &fx,
        "ew",
        "cfg-w Succeeded",
        phase_is("cfg-w", TransitionPhase::Succeeded),
    )
    .await?;
    let (_, msg) = transition_of(&env, "cfg-w").unwrap();
    assert!(msg.starts_with("warning: hook task"), "{msg}");
    assert!(msg.contains("dcs unreachable"), "{msg}");
    let env = wait_env(&fx, "ew", "CONFIGURED", state_is(State::Configured)).await?;
    assert_eq!(env.status.unwrap().ready.as_deref(), Some("1/1"));
    let wt = task_api.get(&w.name).await?;
    assert_eq!(task_state(&wt), Some(State::Standby));
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&ListParams::default())
        .await?;
    assert!(
        events.items.iter().any(
            |e| e.reason.as_deref() == Some("ConfigureSucceededWithWarnings")
                && e.type_.as_deref() == Some("Warning")
        ),
        "no warning event"
    );

    // A hook still running at its timeoutSeconds fails (critical: the transition fails) and
    // its pod is stopped.
    let mut t = hook("et", "slow", "before_CONFIGURE", true);
    t.timeout_seconds = Some(2);
    let mut ttasks = plain("et", &["flp002"]);
    ttasks.push(t.clone());
    deploy(&fx, "et", &ttasks, false).await?;
    wait_env(&fx, "et", "STANDBY", state_is(State::Standby)).await?;
    transition(&fx, "et", "cfg-t", Event::Configure).await?;
    let t0 = Instant::now();
    let env = wait_env(
        &fx,
        "et",
        "cfg-t Failed",
        phase_is("cfg-t", TransitionPhase::Failed),
    )
    .await?;
    println!("hook timeout (2 s) reported after {:?}", t0.elapsed());
    let (_, msg) = transition_of(&env, "cfg-t").unwrap();
    assert!(
        msg.contains(&format!("hook task {}: timed out after 2s", t.name)),
        "{msg}"
    );
    wait_pod_gone(&fx, &t.name).await?;

    // `destroy` waits for the whole namespace to empty: the other environments go first.
    for other in ["ew", "et"] {
        Api::<Environment>::namespaced(fx.admin.clone(), &fx.ns)
            .delete(other, &Default::default())
            .await?;
    }
    destroy(&fx, "eh").await?;
    op.stop().await?;
    finish(fx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_recreates_a_pod_that_ended() -> Res {
    let fx = fixture("recover").await?;
    let op = start(&fx, None).await?;
    let tasks = plain("rc", &["flp001", "flp002"]);
    deploy(&fx, "rc", &tasks, false).await?;
    wait_env(&fx, "rc", "STANDBY", state_is(State::Standby)).await?;
    let name = tasks[0].name.clone();
    let old = wait_pod(&fx, &name).await?;
    end_pod(&fx, &name, "sim-fail", "segfault").await?;
    wait_env(&fx, "rc", "ERROR", state_is(State::Error)).await?;
    wait_task(&fx, &name, "ERROR", |t| task_state(t) == Some(State::Error)).await?;
    // The failed pod is kept (its logs) until a RECOVER replaces it.
    let kept = wait_pod(&fx, &name).await?;
    assert_eq!(kept.uid(), old.uid());

    transition(&fx, "rc", "rec-1", Event::Recover).await?;
    let pods: Api<Pod> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let pod = wait_until("a new pod after RECOVER", async || {
        Ok(pods
            .get_opt(&name)
            .await?
            .filter(|p| p.metadata.deletion_timestamp.is_none() && p.uid() != old.uid()))
    })
    .await?;
    assert_ne!(
        pod.uid(),
        old.uid(),
        "the ended pod came back instead of a new one"
    );
    let env = wait_env(&fx, "rc", "STANDBY after RECOVER", |e| {
        state_is(State::Standby)(e) && phase_is("rec-1", TransitionPhase::Succeeded)(e)
    })
    .await?;
    assert_eq!(env.status.unwrap().ready.as_deref(), Some("2/2"));
    let t = wait_task(&fx, &name, "STANDBY", |t| {
        task_state(t) == Some(State::Standby)
    })
    .await?;
    let ts = t.status.unwrap();
    assert_eq!(ts.pod_phase.as_deref(), Some("Running"));
    assert!(!ts.conditions.iter().any(|c| c.type_ == "ProcessEnded"));
    // Exactly one pod per task, the recovered one still there a moment later.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pods = Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
        .list(&ListParams::default())
        .await?;
    let mut names: Vec<String> = pods.items.iter().map(|p| p.name_any()).collect();
    names.sort();
    assert_eq!(names, vec![tasks[0].name.clone(), tasks[1].name.clone()]);
    assert_eq!(
        pods.items
            .iter()
            .find(|p| p.name_any() == name)
            .and_then(|p| p.uid()),
        pod.uid()
    );

    destroy(&fx, "rc").await?;
    op.stop().await?;
    finish(fx).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_awaited_after_the_event_runs_alongside_the_tasks() -> Res {
    let fx = fixture("hookpar").await?;
    let op = start(&fx, None).await?;
    let mut p = hook("ep", "pfr", "before_CONFIGURE", true);
    p.r#await = Some("after_CONFIGURE-1".into());
    let mut tasks = plain("ep", &["flp001", "flp002"]);
    tasks.push(p.clone());
    deploy(&fx, "ep", &tasks, false).await?;
    wait_env(&fx, "ep", "STANDBY", state_is(State::Standby)).await?;

    transition(&fx, "ep", "cfg-p", Event::Configure).await?;
    wait_pod(&fx, &p.name).await?;
    // The tasks receive CONFIGURE while the hook runs; the transition waits for the hook.
    for t in &tasks[..2] {
        wait_task(&fx, &t.name, "CONFIGURED", |t| {
            task_state(t) == Some(State::Configured)
        })
        .await?;
    }
    let env = wait_env(&fx, "ep", "tasks CONFIGURED", state_is(State::Configured)).await?;
    let (phase, msg) = transition_of(&env, "cfg-p").unwrap();
    assert_eq!(phase, TransitionPhase::Running, "{msg}");
    assert!(msg.contains(&format!("hook task {}", p.name)), "{msg}");
    end_pod(&fx, &p.name, "sim-succeed", "").await?;
    wait_env(
        &fx,
        "ep",
        "cfg-p Succeeded",
        phase_is("cfg-p", TransitionPhase::Succeeded),
    )
    .await?;

    destroy(&fx, "ep").await?;
    op.stop().await?;
    finish(fx).await
}

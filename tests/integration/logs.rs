//! `envbridge logs` against the real apiserver: how it finds an environment, its tasks and
//! their pods, and the clear, non-zero failures when there is nothing to read. Reading real
//! container logs needs a kubelet (kwok serves none here, docs/logs.md); the resume path is
//! tested below the API client (src/control/log_stream.rs).

use std::collections::BTreeMap;

use envbridge::crd::{Environment, EnvironmentSpec, Task, TaskSpec, labels};
use envbridge::plan::TaskRef;
use envbridge::state::State;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::support::{TestNamespace, random_suffix};

type Res<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Fixture {
    tns: TestNamespace,
    /// The Environment's name; its spec.id is `<name>-id`.
    env: String,
}

/// An Environment with two Tasks: `<env>-readout` whose Pod exists but is not scheduled (this
/// control plane runs no scheduler and the pod names no node), `<env>-stfb` without a Pod.
async fn fixture(test: &str) -> Res<Fixture> {
    let tns = TestNamespace::new(&format!("logs-{test}")).await;
    envbridge::install::crds(&tns.client).await?;
    let env = format!("e{}", random_suffix());
    let envs: Api<Environment> = tns.api();
    let e = Environment::new(
        &env,
        EnvironmentSpec {
            id: format!("{env}-id"),
            workflow: "readout-dataflow".into(),
            nodes: 1,
            tasks: 2,
            desired_state: State::Standby,
            ..Default::default()
        },
    );
    envs.create(&PostParams::default(), &e).await?;
    let tasks: Api<Task> = tns.api();
    for class in ["readout", "stfb"] {
        let name = format!("{env}-{class}");
        let mut t = Task::new(
            &name,
            TaskSpec {
                environment: env.clone(),
                task: TaskRef {
                    name: name.clone(),
                    class: class.into(),
                    node: "flp001".into(),
                    ..Default::default()
                },
                transition: None,
            },
        );
        t.metadata.labels = Some(BTreeMap::from([
            (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
            (labels::ENVIRONMENT.to_string(), env.clone()),
        ]));
        tasks.create(&PostParams::default(), &t).await?;
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{env}-readout")},
        "spec": {"containers": [{"name": "task", "image": "readout"}]},
    }))?;
    tns.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(Fixture { tns, env })
}

/// Runs `envbridge logs ARGS` with the plane's kubeconfig: (success, stdout, stderr).
async fn logs(fx: &Fixture, args: &[&str]) -> Res<(bool, String, String)> {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_envbridge"));
    cmd.arg("logs")
        .args(args)
        .arg(format!("--kubeconfig={}", fx.tns.info.kubeconfig.display()));
    let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Every object of the test namespace the command could touch, with its resourceVersion.
async fn snapshot(fx: &Fixture) -> Res<Vec<String>> {
    let lp = ListParams::default();
    let mut all = Vec::new();
    for e in fx.tns.api::<Environment>().list(&lp).await? {
        all.push(format!("env {} {:?}", e.name_any(), e.resource_version()));
    }
    for t in fx.tns.api::<Task>().list(&lp).await? {
        all.push(format!("task {} {:?}", t.name_any(), t.resource_version()));
    }
    for p in fx.tns.api::<Pod>().list(&lp).await? {
        all.push(format!("pod {} {:?}", p.name_any(), p.resource_version()));
    }
    Ok(all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_environment_fails_clearly_and_changes_nothing() -> Res {
    let fx = fixture("unknown").await?;
    let before = snapshot(&fx).await?;
    let missing = format!("no-such-env-{}", random_suffix());

    let (ok, out, err) = logs(&fx, &[&missing]).await?;
    assert!(!ok, "exit 0 for an unknown environment; stderr: {err}");
    assert_eq!(out, "");
    assert_eq!(
        err.trim(),
        format!("error: environment {missing:?} not found (any namespace, by name or id)")
    );

    // In one namespace, and as NAMESPACE/NAME, with --follow: the same clear refusal.
    let ns = fx.tns.name.clone();
    let (ok, _, err) = logs(&fx, &[&missing, "-n", &ns, "--follow"]).await?;
    assert!(!ok);
    assert!(
        err.contains(&format!("namespace {ns}, by name or id")),
        "{err}"
    );
    let qualified = format!("{ns}/{missing}");
    let (ok, _, err) = logs(&fx, &[&qualified, "--since=5m"]).await?;
    assert!(!ok);
    assert!(
        err.contains(&format!("{qualified:?} not found (namespace {ns})")),
        "{err}"
    );

    assert_eq!(snapshot(&fx).await?, before, "the command changed objects");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tasks_and_unstarted_pods_are_named() -> Res {
    let fx = fixture("tasks").await?;
    let before = snapshot(&fx).await?;
    let env = fx.env.clone();
    let ns = fx.tns.name.clone();
    let readout = format!("{env}-readout");
    let stfb = format!("{env}-stfb");

    // By name, by id and as NAMESPACE/NAME the environment is found; the task is not.
    for id in [env.clone(), format!("{env}-id"), format!("{ns}/{env}")] {
        let (ok, out, err) = logs(&fx, &[&id, "nosuch"]).await?;
        assert!(!ok, "{id}: exit 0; stderr: {err}");
        assert_eq!(out, "");
        assert_eq!(
            err.trim(),
            format!(
                "error: task \"nosuch\" not found in environment {ns}/{env} (its tasks: {readout}, {stfb})"
            ),
            "{id}"
        );
    }

    // One task whose pod is not scheduled; one without a pod.
    let (ok, _, err) = logs(&fx, &[&env, &readout, "-f"]).await?;
    assert!(!ok);
    assert_eq!(
        err.trim(),
        format!("error: task {readout}: pod {readout} is not scheduled yet")
    );
    let (ok, _, err) = logs(&fx, &[&env, &stfb]).await?;
    assert!(!ok);
    assert_eq!(
        err.trim(),
        format!("error: task {stfb}: no pod yet (pod {ns}/{stfb} does not exist)")
    );

    // Every task: each one's reason, then the overall failure.
    let (ok, out, err) = logs(&fx, &[&env, "--follow", "--since", "1h"]).await?;
    assert!(!ok);
    assert_eq!(out, "");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines,
        [
            format!("envbridge logs: task {readout}: pod {readout} is not scheduled yet"),
            format!("envbridge logs: task {stfb}: no pod yet (pod {ns}/{stfb} does not exist)"),
            "error: no task container has started yet".to_string(),
        ],
        "{err}"
    );

    // A bad --since is refused by the argument parser.
    let (ok, _, err) = logs(&fx, &[&env, "--since", "soon"]).await?;
    assert!(!ok);
    assert!(
        err.contains("expected a duration like 30s, 5m or 1h"),
        "{err}"
    );

    assert_eq!(snapshot(&fx).await?, before, "the command changed objects");
    Ok(())
}

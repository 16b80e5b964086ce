//! A transition's answer whose status write the apiserver refuses (as it does while etcd or
//! the apiserver itself is down) is written again once writes pass, never re-derived by
//! sending the task the same step twice (the fault run's seed 2118642602097680009: etcd
//! killed mid-CONFIGURE, the task CONFIGURED, the retried CONFIGURE refused "state mismatch",
//! the transition failed though no task was faulty).
//!
//! The refusal is real: a ValidatingAdmissionPolicy denying this namespace's Task status
//! writes that record a CONFIGURE, and a probe ConfigMap that tells when it is enforced.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envbridge::control::{ControlClient, TaskEndpoint};
use envbridge::crd::Task;
use envbridge::plan::ControlMode;
use envbridge::state::{Event, State};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use serde_json::json;

use super::{
    Res, Sims, WAIT, assert_succeeded, deploy, destroy, finish, fixture, start, state_is, task_ref,
    transition, wait_env, wait_transition,
};

fn admission(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        kind,
    ))
}

/// Installs the refusal and waits until it is enforced (the probe ConfigMap is denied).
async fn refuse_configure_status(admin: &Client, ns: &str, name: &str) -> Res {
    let pp = PatchParams::apply("envbridge-tests").force();
    let expression = format!(
        "request.namespace != '{ns}' || (request.resource.resource == 'configmaps' \
         ? object.metadata.name != 'probe' \
         : !(has(object.status) && has(object.status.transition) \
             && object.status.transition.event == 'CONFIGURE'))"
    );
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": [envbridge::crd::GROUP], "apiVersions": ["*"],
                 "operations": ["UPDATE"], "resources": ["tasks/status"]},
                {"apiGroups": [""], "apiVersions": ["v1"],
                 "operations": ["CREATE"], "resources": ["configmaps"]}
            ]},
            "validations": [{"expression": expression, "message": "refused by the test"}]
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]}
    });
    Api::<DynamicObject>::all_with(admin.clone(), &admission("ValidatingAdmissionPolicy"))
        .patch(name, &pp, &Patch::Apply(&policy))
        .await?;
    Api::<DynamicObject>::all_with(
        admin.clone(),
        &admission("ValidatingAdmissionPolicyBinding"),
    )
    .patch(name, &pp, &Patch::Apply(&binding))
    .await?;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    let probe: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "probe"}}))?;
    let t0 = Instant::now();
    loop {
        match cms.create(&PostParams::default(), &probe).await {
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => return Ok(()),
            Ok(_) => {
                cms.delete("probe", &DeleteParams::default()).await?;
            }
            Err(e) => return Err(e.into()),
        }
        if t0.elapsed() > WAIT {
            return Err("the admission policy was never enforced".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn remove_refusal(admin: &Client, name: &str) -> Res {
    for kind in [
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
    ] {
        match Api::<DynamicObject>::all_with(admin.clone(), &admission(kind))
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_status_write_is_written_again_and_the_step_is_not_sent_twice() -> Res {
    let fx = fixture("status-refused").await?;
    let policy = fx.ns.clone();
    let sims = Sims::start(&fx);
    let op = start(&fx, None).await?;
    let t = task_ref("sr", "flp004", "readout", 1, ControlMode::Direct);
    deploy(&fx, "sr", std::slice::from_ref(&t), false).await?;
    wait_env(&fx, "sr", "STANDBY", state_is(State::Standby)).await?;
    let pod = Api::<Pod>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&t.name)
        .await?;
    let ip = pod.status.and_then(|s| s.pod_ip).ok_or("no pod IP")?;
    let ep = TaskEndpoint::new(
        SocketAddr::new(ip.parse()?, t.control_port),
        ControlMode::Direct,
    );

    refuse_configure_status(&fx.admin, &fx.ns, &policy).await?;
    transition(&fx, "sr", "c1", Event::Configure).await?;
    // The task answers CONFIGURE; its Task cannot record it.
    let t0 = Instant::now();
    loop {
        let (state, _) = ControlClient::default()
            .get_state(&ep, Duration::from_secs(5))
            .await?;
        if state == State::Configured {
            break;
        }
        assert!(t0.elapsed() < WAIT, "the task never reached CONFIGURED");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Long enough for the operator's refused write and its retries.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let task = Api::<Task>::namespaced(fx.admin.clone(), &fx.ns)
        .get(&t.name)
        .await?;
    let recorded = task.status.and_then(|s| s.transition).map(|t| t.id);
    assert_ne!(recorded.as_deref(), Some("c1"), "the refusal did not hold");

    remove_refusal(&fx.admin, &policy).await?;
    assert_succeeded(&wait_transition(&fx, "sr", "c1").await?);
    wait_env(&fx, "sr", "CONFIGURED", state_is(State::Configured)).await?;
    let (state, _) = ControlClient::default()
        .get_state(&ep, Duration::from_secs(5))
        .await?;
    assert_eq!(state, State::Configured);
    destroy(&fx, "sr").await?;
    op.stop().await?;
    sims.stop().await;
    finish(fx).await
}

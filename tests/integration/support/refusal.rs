//! A real refusal of chosen writes, as the apiserver refuses every write while etcd or the
//! apiserver itself is down, but only where a test wants it: a ValidatingAdmissionPolicy
//! denying, in one namespace, the updates of one resource whose new object matches a CEL
//! condition; a probe ConfigMap tells when the policy is enforced.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use serde_json::json;

/// How long a policy may take to be enforced.
const ENFORCED_WITHIN: Duration = Duration::from_secs(60);

fn admission(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        kind,
    ))
}

/// Denies, in `ns`, the UPDATEs of envbridge's `resource` (e.g. `tasks/status`,
/// `environments`) whose new object matches `denied` (CEL over `object`); the policy and its
/// binding are called `name`. Returns once the policy is enforced.
pub async fn refuse_updates(
    admin: &Client,
    ns: &str,
    name: &str,
    resource: &str,
    denied: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let pp = PatchParams::apply("envbridge-tests").force();
    let expression = format!(
        "request.namespace != '{ns}' || (request.resource.resource == 'configmaps' \
         ? object.metadata.name != 'probe' : !({denied}))"
    );
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": [envbridge::crd::GROUP], "apiVersions": ["*"],
                 "operations": ["UPDATE"], "resources": [resource]},
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
        if t0.elapsed() > ENFORCED_WITHIN {
            return Err("the admission policy was never enforced".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Lifts the refusal `name`.
pub async fn lift(
    admin: &Client,
    name: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
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

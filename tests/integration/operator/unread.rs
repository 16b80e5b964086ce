//! The operator's writes whose reply it does not read (`operator::unread`), against the real
//! apiserver: each write lands, and each refusal comes back as `kube::Error::Api` with its
//! code (what the callers match on: 404 gone, 409 exists), as from `kube::Api`.

use envbridge::crd::{Environment, EnvironmentSpec, EnvironmentStatus};
use envbridge::operator::unread;
use envbridge::state::State;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Res, fixture};

fn code(r: kube::Result<()>) -> Option<u16> {
    match r {
        Err(kube::Error::Api(s)) => Some(s.code),
        _ => None,
    }
}

#[tokio::test]
async fn unread_writes_land_and_refusals_keep_their_code() -> Res {
    let fx = fixture("unread").await?;
    let cms: Api<ConfigMap> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let pp = PostParams::default();
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("u".into());
    cm.data = Some([("a".to_string(), "1".to_string())].into());

    unread::create(&cms, &pp, &cm).await?;
    assert_eq!(cms.get("u").await?.data, cm.data, "created as sent");
    assert_eq!(code(unread::create(&cms, &pp, &cm).await), Some(409));

    let merge = Patch::Merge(json!({"data": {"a": "2"}}));
    unread::patch(&cms, "u", &PatchParams::default(), &merge).await?;
    let data = cms.get("u").await?.data.unwrap_or_default();
    assert_eq!(data.get("a").map(String::as_str), Some("2"), "patched");
    let bad = Patch::Merge(json!({"data": {"a": 7}}));
    let refused = code(unread::patch(&cms, "u", &PatchParams::default(), &bad).await);
    assert!(
        matches!(refused, Some(400 | 422)),
        "a bad body is refused: {refused:?}"
    );
    let missing = unread::patch(&cms, "none", &PatchParams::default(), &merge).await;
    assert_eq!(code(missing), Some(404));

    // A status subresource: an Environment's, as the operator writes it.
    let envs: Api<Environment> = Api::namespaced(fx.admin.clone(), &fx.ns);
    let env = Environment::new(
        "u",
        EnvironmentSpec {
            id: "u".into(),
            ..Default::default()
        },
    );
    envs.create(&pp, &env).await?;
    let status = EnvironmentStatus {
        state: Some(State::Configured),
        ..Default::default()
    };
    let body = Patch::Merge(json!({"status": status}));
    unread::patch_status(&envs, "u", &PatchParams::default(), &body).await?;
    let got = envs.get("u").await?.status.and_then(|s| s.state);
    assert_eq!(got, Some(State::Configured), "status written");

    unread::delete(&cms, "u", &DeleteParams::default()).await?;
    assert!(cms.get_opt("u").await?.is_none(), "deleted");
    assert_eq!(
        code(unread::delete(&cms, "u", &DeleteParams::default()).await),
        Some(404)
    );
    unread::delete(&envs, "u", &DeleteParams::default()).await?;
    Ok(())
}

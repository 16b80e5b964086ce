//! The daemon under its least-privilege RBAC.

use super::*;

/// The daemon works under its own ServiceAccount with manifests/deploy/base/daemon-rbac.yaml, and
/// that RBAC does not let it write what it must not (Tasks, TaskTemplates).
#[tokio::test]
async fn the_daemon_runs_under_its_least_privilege_rbac() {
    let ns = Setup::shared("daemon-rbac").await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    fixture::apply_manifest(&ns.client, &root.join("deploy/base/namespace.yaml")).await;
    fixture::apply_manifest(&ns.client, &root.join("deploy/base/daemon-rbac.yaml")).await;
    let _sim = ns.sim(SimConfig::default());
    let sa = fixture::impersonating(
        &ns.kubeconfig,
        "system:serviceaccount:envbridge-system:envbridge-daemon",
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:envbridge-system",
            "system:authenticated",
        ],
    )
    .await;
    let d = ns.daemon_as(sa.clone(), fixed_ns(&ns.name)).await;
    let mut api = d.client().await;
    let c = fixture::create(&mut api, create_req("", "flp001,flp002", 48300)).await;
    assert_eq!(c.outcome, "reached", "{}", c.message);
    let r = fixture::run_transition(&mut api, transition(&c.id, "CONFIGURE", &[])).await;
    assert!(r.ok, "{}", r.message);
    let victim = format!("{}-flp001-readout", c.id);
    assert!(fixture::kill(&mut api, &c.id, &victim).await);
    let gone = fixture::destroy(&mut api, &c.id, 60).await;
    assert!(gone.gone, "{}", gone.message);

    // Least privilege: no writing Tasks (the operator's) or TaskTemplates (administrators').
    let tasks: Api<Task> = Api::namespaced(sa.clone(), &ns.name);
    let t = Task::new("forbidden", Default::default());
    let denied = tasks
        .create(&PostParams::default(), &t)
        .await
        .expect_err("create Task");
    assert!(
        matches!(denied, kube::Error::Api(ref s) if s.code == 403),
        "{denied}"
    );
    let tts: Api<envbridge::crd::TaskTemplate> = Api::all(sa);
    let denied = tts
        .delete(
            &format!("{}-readout", ns.tpl.prefix),
            &DeleteParams::default(),
        )
        .await
        .expect_err("delete TaskTemplate");
    assert!(
        matches!(denied, kube::Error::Api(ref s) if s.code == 403),
        "{denied}"
    );
}

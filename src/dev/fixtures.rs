//! Cluster setup shared by the integration tests and the benchmarks: manifest files applied
//! server-side, an Environment written as its TaskSets and then itself (packed by the one
//! packer, so tests see the objects the daemon writes).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DynamicObject, ListParams, ObjectMeta, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use kube::{Api, Client, ResourceExt};

use super::error::{DevError, IoContext, Result};
use crate::crd::{Environment, Task, TaskSet};
use crate::plan::TaskRef;

/// Applies every document of a YAML file (server-side apply, forced, as `manager`).
pub async fn apply_file(client: &Client, path: &Path, manager: &str) -> Result<()> {
    let text = std::fs::read_to_string(path).ctx("reading manifest", path)?;
    let bad = |what: String| DevError::Invalid(format!("{}: {what}", path.display()));
    let docs =
        serde_saphyr::from_multiple::<serde_json::Value>(&text).map_err(|e| bad(e.to_string()))?;
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        let obj: DynamicObject =
            serde_json::from_value(doc.clone()).map_err(|e| bad(e.to_string()))?;
        let tm = obj
            .types
            .clone()
            .ok_or_else(|| bad("document without apiVersion/kind".into()))?;
        let (group, version) = tm
            .api_version
            .split_once('/')
            .unwrap_or(("", tm.api_version.as_str()));
        let (ar, caps) =
            discovered(client, &GroupVersionKind::gvk(group, version, &tm.kind)).await?;
        let api: Api<DynamicObject> = match (&caps.scope, obj.namespace()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), &ns, &ar),
            _ => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            &obj.name_any(),
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&doc),
        )
        .await?;
    }
    Ok(())
}

/// The kind's API as discovery serves it. A CRD just Established may be missing from
/// discovery for a moment (seen on a fresh plane): asked again for up to 10 s.
async fn discovered(
    client: &Client,
    gvk: &GroupVersionKind,
) -> Result<(
    kube::discovery::ApiResource,
    kube::discovery::ApiCapabilities,
)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match pinned_kind(client, gvk).await {
            Err(kube::Error::Discovery(_)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            found => return Ok(found?),
        }
    }
}

/// Writes `tasks` as TaskSets packed the render's way under `budget` bytes (the one packer:
/// `objects`), then the Environment naming them (desired state STANDBY), as the daemon would.
pub async fn deploy(
    client: &Client,
    ns: &str,
    name: &str,
    tasks: &[TaskRef],
    budget: usize,
    manager: &str,
) -> Result<()> {
    deploy_in_shard(client, ns, name, tasks, budget, manager, None).await
}

/// [`deploy`], the objects labelled for the operator `shard`.
pub async fn deploy_in_shard(
    client: &Client,
    ns: &str,
    name: &str,
    tasks: &[TaskRef],
    budget: usize,
    manager: &str,
    shard: Option<&str>,
) -> Result<()> {
    let mut ports: std::collections::BTreeMap<String, BTreeSet<u16>> = Default::default();
    for t in tasks {
        ports.entry(t.node.clone()).or_default().extend(t.ports());
    }
    let plan = crate::plan::Plan {
        environment_id: name.into(),
        environment_name: name.into(),
        workflow: "readout-dataflow".into(),
        tasks: tasks.to_vec(),
        hooks: Vec::new(),
        ports,
    };
    let mut objs = crate::objects::from_plan(plan, Some(ns), budget, false);
    objs.place(ns, shard);
    let pp = PatchParams::apply(manager).force();
    let sets: Api<TaskSet> = Api::namespaced(client.clone(), ns);
    for set in &objs.task_sets {
        sets.patch(&set.name_any(), &pp, &Patch::Apply(set)).await?;
    }
    Api::<Environment>::namespaced(client.clone(), ns)
        .patch(name, &pp, &Patch::Apply(&objs.environment))
        .await?;
    Ok(())
}

/// A namespace object named `name`, labelled `<label>=true` so that leftovers of a test or a
/// benchmark are easy to find (`kubectl get ns -l <label>`).
pub fn labelled_namespace(name: &str, label: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(label.to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// What an operator's failover must leave as it was in namespace `ns`: each pod's uid, each
/// Task's asked transition, state and last transition (compared before and after).
pub async fn failover_view(client: &Client, ns: &str) -> kube::Result<BTreeMap<String, String>> {
    let lp = ListParams::default();
    let mut out = BTreeMap::new();
    for p in Api::<Pod>::namespaced(client.clone(), ns).list(&lp).await? {
        out.insert(format!("pod {}", p.name_any()), p.uid().unwrap_or_default());
    }
    for t in Api::<Task>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
    {
        let st = t.status.clone().unwrap_or_default();
        out.insert(
            format!("task {}", t.name_any()),
            format!(
                "spec {:?} state {:?} transition {:?}",
                t.spec.transition.as_ref().map(|r| &r.id),
                st.state,
                st.transition.as_ref().map(|x| (&x.id, x.phase)),
            ),
        );
    }
    Ok(out)
}

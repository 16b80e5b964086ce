//! Cluster setup shared by the integration tests and the benchmarks: manifest files applied
//! server-side, an Environment written as its TaskSets and then itself.

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DynamicObject, ObjectMeta, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use kube::{Api, Client, ResourceExt};

use super::error::{DevError, IoContext, Result};
use crate::crd::{Environment, EnvironmentSpec, TaskSet, TaskSetRef, TaskSetSpec};
use crate::plan::TaskRef;
use crate::state::State;

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
            pinned_kind(client, &GroupVersionKind::gvk(group, version, &tm.kind)).await?;
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

/// Writes `tasks` as TaskSets of `per_set` (named `<name>-<i>`), then the Environment naming
/// them (desired state STANDBY), as a renderer would.
pub async fn deploy(
    client: &Client,
    ns: &str,
    name: &str,
    tasks: &[TaskRef],
    per_set: usize,
    manager: &str,
) -> Result<()> {
    let pp = PatchParams::apply(manager).force();
    let sets: Api<TaskSet> = Api::namespaced(client.clone(), ns);
    let mut refs = Vec::new();
    for (i, chunk) in tasks.chunks(per_set.max(1)).enumerate() {
        let set_name = format!("{name}-{i}");
        let set = TaskSet::new(
            &set_name,
            TaskSetSpec {
                environment: name.into(),
                tasks: chunk.to_vec(),
            },
        );
        sets.patch(&set_name, &pp, &Patch::Apply(&set)).await?;
        refs.push(TaskSetRef {
            name: set_name,
            blake3: crate::model::digest::tasks_digest(chunk),
            tasks: chunk.len() as u32,
        });
    }
    let nodes: BTreeSet<&str> = tasks.iter().map(|t| t.node.as_str()).collect();
    let env = Environment::new(
        name,
        EnvironmentSpec {
            id: name.into(),
            workflow: "readout-dataflow".into(),
            nodes: nodes.len() as u32,
            tasks: tasks.len() as u32,
            task_sets: refs,
            desired_state: State::Standby,
            ..Default::default()
        },
    );
    Api::<Environment>::namespaced(client.clone(), ns)
        .patch(name, &pp, &Patch::Apply(&env))
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

//! The patches an existing Task gets from its environment. Pure.
//!
//! A Task is created by a plain create (POST), not by server-side apply: apply cost the
//! apiserver ~1.4x the CPU of a create for the same Task (docs/benchmarks.md). So every
//! later write is an update too (a merge or JSON patch by the same field manager), never an
//! apply: an apply after a create would leave the fields the create set and the apply no
//! longer names, as another manager's.

use serde_json::{Map, Value, json};

use crate::crd::{Task, TransitionRequest};

/// The merge patch (RFC 7386) that makes `existing` what `want` is: its spec and its labels
/// exactly (a field or label `want` has not is removed), its annotations set (others'
/// kept: the store holds none), its finalizers and owners added where missing (a list is
/// replaced whole by a merge patch, so the stored ones are carried).
pub fn update_patch(existing: &Task, want: &Task) -> Value {
    let mut meta = Map::new();
    let labels = merge_diff(
        &json!(existing.metadata.labels.clone().unwrap_or_default()),
        &json!(want.metadata.labels.clone().unwrap_or_default()),
    );
    if !is_empty(&labels) {
        meta.insert("labels".into(), labels);
    }
    if let Some(a) = want.metadata.annotations.as_ref().filter(|a| !a.is_empty()) {
        meta.insert("annotations".into(), json!(a));
    }
    let (have, wanted) = (&existing.metadata, &want.metadata);
    let finalizers = with_missing(
        have.finalizers.as_ref(),
        wanted.finalizers.as_ref(),
        |a, b| a == b,
    );
    if let Some(f) = finalizers {
        meta.insert("finalizers".into(), f);
    }
    let owners = with_missing(
        have.owner_references.as_ref(),
        wanted.owner_references.as_ref(),
        |a, b| a.uid == b.uid,
    );
    if let Some(o) = owners {
        meta.insert("ownerReferences".into(), o);
    }
    let mut patch = Map::new();
    if !meta.is_empty() {
        patch.insert("metadata".into(), Value::Object(meta));
    }
    let spec = merge_diff(&json!(existing.spec), &json!(want.spec));
    if !is_empty(&spec) {
        patch.insert("spec".into(), spec);
    }
    Value::Object(patch)
}

/// The JSON patch that asks a Task `req` and changes nothing else: its one field, replaced
/// whole (its arguments are exactly the transition's own).
pub fn transition_patch(req: &TransitionRequest) -> json_patch::Patch {
    json_patch::Patch(vec![json_patch::PatchOperation::Add(
        json_patch::AddOperation {
            path: json_patch::jsonptr::PointerBuf::from_tokens(["spec", "transition"]),
            value: serde_json::to_value(req).unwrap_or_default(),
        },
    )])
}

/// The merge patch from `old` to `new`: what differs, objects recursed into, a key `new`
/// has not set to null (removed).
fn merge_diff(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) if ov == nv => {}
                    Some(ov) if ov.is_object() && nv.is_object() => {
                        out.insert(k.clone(), merge_diff(ov, nv));
                    }
                    _ => {
                        out.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            Value::Object(out)
        }
        _ => new.clone(),
    }
}

/// `have` with the items of `want` it lacks appended (a merge patch replaces a list whole),
/// or None when it lacks none.
fn with_missing<T: Clone + serde::Serialize>(
    have: Option<&Vec<T>>,
    want: Option<&Vec<T>>,
    same: impl Fn(&T, &T) -> bool,
) -> Option<Value> {
    let have = have.map(Vec::as_slice).unwrap_or_default();
    let missing = want
        .into_iter()
        .flatten()
        .filter(|w| !have.iter().any(|h| same(h, w)));
    let all: Vec<&T> = have.iter().chain(missing).collect();
    (all.len() > have.len()).then(|| json!(all))
}

fn is_empty(v: &Value) -> bool {
    v.as_object().is_some_and(Map::is_empty)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kube::ResourceExt;

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    use crate::crd::TaskSpec;
    use crate::plan::TaskRef;
    use crate::state::Event;

    const FINALIZER: &str = "envbridge.dev/task-cleanup";

    /// A Task as the environment controller builds it (by hand: this file stands alone).
    fn build_task(tref: &TaskRef) -> Task {
        Task {
            metadata: ObjectMeta {
                name: Some(tref.name.clone()),
                namespace: Some("ns".into()),
                labels: Some(BTreeMap::from([
                    ("envbridge.dev/environment".into(), "e1".into()),
                    ("envbridge.dev/class".into(), tref.class.clone()),
                ])),
                annotations: Some(BTreeMap::from([(
                    "envbridge.dev/role-path".into(),
                    tref.path.clone(),
                )])),
                owner_references: Some(vec![OwnerReference {
                    uid: "env-uid".into(),
                    name: "e1".into(),
                    kind: "Environment".into(),
                    api_version: "envbridge.dev/v1alpha1".into(),
                    controller: Some(true),
                    ..Default::default()
                }]),
                finalizers: Some(vec![FINALIZER.into()]),
                ..Default::default()
            },
            spec: TaskSpec {
                environment: "e1".into(),
                task: tref.clone(),
                transition: None,
            },
            status: None,
        }
    }

    fn tref() -> TaskRef {
        TaskRef {
            name: "t1".into(),
            path: "rd.host-flp001.readout".into(),
            node: "flp001".into(),
            class: "readout".into(),
            user: Some("flp".into()),
            properties: BTreeMap::from([("A".into(), "1".into()), ("GONE".into(), "x".into())]),
            ..Default::default()
        }
    }

    /// `existing` as the apiserver holds it after the patch (with what the store trims and
    /// others wrote), as JSON.
    fn patched(existing: &Task, server: Value, want: &Task) -> Value {
        let mut doc = server;
        json_patch::merge(&mut doc, &update_patch(existing, want));
        doc
    }

    #[test]
    fn an_update_makes_spec_and_labels_exact_and_keeps_what_others_wrote() {
        let old = build_task(&tref());
        let mut stored = old.clone();
        stored.metadata.finalizers = Some(vec!["other/keep".into()]);
        stored.metadata.owner_references = None;
        stored
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("hand-made".into(), "x".into());
        let mut server = json!(stored);
        server["metadata"]["annotations"]["kubectl.kubernetes.io/note"] = json!("kept");
        stored.metadata.annotations = None; // the store trims them

        let mut r = tref();
        r.properties.remove("GONE");
        r.properties.insert("B".into(), "2".into());
        r.user = None;
        r.command = "new".into();
        let want = build_task(&r);
        let doc = patched(&stored, server, &want);

        let got: Task = serde_json::from_value(doc.clone()).unwrap();
        assert_eq!(got.spec, want.spec);
        assert_eq!(got.metadata.labels, want.metadata.labels);
        assert_eq!(
            got.metadata.finalizers,
            Some(vec!["other/keep".into(), FINALIZER.into()])
        );
        assert_eq!(got.owner_references()[0].uid, "env-uid");
        assert_eq!(
            doc["metadata"]["annotations"]["kubectl.kubernetes.io/note"],
            "kept"
        );
        for (k, v) in want.annotations() {
            assert_eq!(doc["metadata"]["annotations"][k], json!(v));
        }
        // Nothing more to change but the annotations, which the store never shows.
        let again = update_patch(&got, &want);
        assert!(again.get("spec").is_none(), "{again}");
        assert!(
            again["metadata"]
                .as_object()
                .unwrap()
                .keys()
                .all(|k| k == "annotations"),
            "{again}"
        );
    }

    #[test]
    fn an_update_names_only_what_differs() {
        let old = build_task(&tref());
        let mut r = tref();
        r.command = "new".into();
        let want = build_task(&r);
        let p = update_patch(&old, &want);
        assert_eq!(p["spec"], json!({"task": {"command": "new"}}), "{p}");
        assert!(p["metadata"].get("labels").is_none(), "{p}");
        assert!(p["metadata"].get("finalizers").is_none(), "{p}");
        assert!(p["metadata"].get("ownerReferences").is_none(), "{p}");
    }

    #[test]
    fn a_transition_patch_sets_that_field_alone() {
        let old = build_task(&tref());
        let req = TransitionRequest {
            id: "x1".into(),
            event: Event::Configure,
            arguments: Default::default(),
        };
        let mut doc = json!(old);
        json_patch::patch(&mut doc, &transition_patch(&req)).unwrap();
        let got: Task = serde_json::from_value(doc).unwrap();
        assert_eq!(got.spec.transition, Some(req));
        assert_eq!(got.spec.task, old.spec.task);
        assert_eq!(got.metadata, old.metadata);
    }
}

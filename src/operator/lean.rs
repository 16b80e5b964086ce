//! A watched object decoded without its `metadata.managedFields`. The stores drop them
//! anyway, but decoding them first was ~7% of the operator's CPU in a 2,000-task teardown:
//! each entry's `fieldsV1` is a tree of JSON values, allocated node by node, for every event
//! of every watch (a Task's or a Pod's managedFields can be half of it). `Lean<K>` decodes K
//! with that one key skipped unread (`IgnoredAny`); every other field as K decodes it.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::watcher;
use serde::Deserialize;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, Visitor,
};

/// K, decoded with its managedFields skipped. The same kind and URLs as K (a watch of
/// `Api<Lean<K>>` is a watch of K).
#[derive(Clone, Debug)]
pub struct Lean<K>(pub K);

impl<'de, K: Deserialize<'de>> Deserialize<'de> for Lean<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        K::deserialize(Skip {
            inner: d,
            at: Level::Object,
        })
        .map(Lean)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Lean<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

/// The watch event of K that `ev` carries.
pub fn unwrap<K>(ev: watcher::Event<Lean<K>>) -> watcher::Event<K> {
    match ev {
        watcher::Event::Apply(o) => watcher::Event::Apply(o.0),
        watcher::Event::Delete(o) => watcher::Event::Delete(o.0),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(o.0),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Where a map is: the object (whose `metadata` is looked into) or its metadata (whose
/// `managedFields` is skipped). Nothing deeper is wrapped: every other value is decoded by
/// the decoder underneath, as it would be without `Lean`.
#[derive(Clone, Copy, PartialEq)]
enum Level {
    Object,
    Meta,
}

struct Skip<D> {
    inner: D,
    at: Level,
}

struct SkipVisitor<V> {
    inner: V,
    at: Level,
}

struct SkipMap<A> {
    inner: A,
    at: Level,
    value_is_meta: bool,
}

struct SkipSeed<S> {
    inner: S,
    at: Level,
}

macro_rules! forward {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
            self.inner.$method(v)
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Skip<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        let at = self.at;
        self.inner.deserialize_any(SkipVisitor { inner: v, at })
    }
    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        let at = self.at;
        self.inner.deserialize_map(SkipVisitor { inner: v, at })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, D::Error> {
        let at = self.at;
        self.inner
            .deserialize_struct(name, fields, SkipVisitor { inner: v, at })
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        let at = self.at;
        self.inner.deserialize_option(SkipVisitor { inner: v, at })
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        v: V,
    ) -> Result<V::Value, D::Error> {
        let at = self.at;
        self.inner
            .deserialize_newtype_struct(name, SkipVisitor { inner: v, at })
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        v: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_unit_struct(name, v)
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, v: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_tuple(len, v)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        v: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_tuple_struct(name, len, v)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_enum(name, variants, v)
    }
    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
    forward! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_f32
        deserialize_f64 deserialize_char deserialize_str deserialize_string deserialize_bytes
        deserialize_byte_buf deserialize_unit deserialize_seq deserialize_identifier
        deserialize_ignored_any deserialize_i128 deserialize_u128
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for SkipVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(SkipMap {
            inner: map,
            at: self.at,
            value_is_meta: false,
        })
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(Skip {
            inner: d,
            at: self.at,
        })
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.inner.visit_newtype_struct(Skip {
            inner: d,
            at: self.at,
        })
    }
    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(seq)
    }
    fn visit_bool<E: de::Error>(self, x: bool) -> Result<V::Value, E> {
        self.inner.visit_bool(x)
    }
    fn visit_i64<E: de::Error>(self, x: i64) -> Result<V::Value, E> {
        self.inner.visit_i64(x)
    }
    fn visit_u64<E: de::Error>(self, x: u64) -> Result<V::Value, E> {
        self.inner.visit_u64(x)
    }
    fn visit_f64<E: de::Error>(self, x: f64) -> Result<V::Value, E> {
        self.inner.visit_f64(x)
    }
    fn visit_str<E: de::Error>(self, x: &str) -> Result<V::Value, E> {
        self.inner.visit_str(x)
    }
    fn visit_borrowed_str<E: de::Error>(self, x: &'de str) -> Result<V::Value, E> {
        self.inner.visit_borrowed_str(x)
    }
    fn visit_string<E: de::Error>(self, x: String) -> Result<V::Value, E> {
        self.inner.visit_string(x)
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkipMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let Some(key) = self.inner.next_key::<Cow<'de, str>>()? else {
                return Ok(None);
            };
            if self.at == Level::Meta && key == "managedFields" {
                self.inner.next_value::<IgnoredAny>()?;
                continue;
            }
            self.value_is_meta = self.at == Level::Object && key == "metadata";
            let key: de::value::CowStrDeserializer<'de, A::Error> = key.into_deserializer();
            return seed.deserialize(key).map(Some);
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        if std::mem::take(&mut self.value_is_meta) {
            self.inner.next_value_seed(SkipSeed {
                inner: seed,
                at: Level::Meta,
            })
        } else {
            self.inner.next_value_seed(seed)
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for SkipSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Skip {
            inner: d,
            at: self.at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::stored_pod::StoredPod;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "n", "uid": "u", "resourceVersion": "7",
                "labels": {"a": "b"}, "finalizers": ["f"],
                "managedFields": [{"manager": "m", "operation": "Apply", "apiVersion": "v1",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:nodeName": {}}}}],
                "deletionTimestamp": "2026-12-06T10:00:00Z"
            },
            "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        })
    }

    /// The same object as K's own decoding, managedFields left out, from text (as a watch
    /// decodes it) and from a value.
    #[test]
    fn decodes_as_k_without_managed_fields() {
        let text = pod().to_string();
        let mut want: Pod = serde_json::from_str(&text).unwrap();
        assert!(want.metadata.managed_fields.is_some());
        want.metadata.managed_fields = None;
        let got: Lean<Pod> = serde_json::from_str(&text).unwrap();
        assert_eq!(got.0, want);
        let got: Lean<Pod> = serde_json::from_value(pod()).unwrap();
        assert_eq!(got.0, want);
        let mut want: StoredPod = serde_json::from_str(&text).unwrap();
        want.metadata.managed_fields = None;
        let got: Lean<StoredPod> = serde_json::from_str(&text).unwrap();
        assert_eq!(got.0, want);
    }

    /// A Task (kube's derive, not k8s-openapi's code) decodes the same way.
    #[test]
    fn a_task_too() {
        use crate::crd::{Task, TaskSpec, TaskStatus};
        let mut t = Task::new(
            "t",
            TaskSpec {
                environment: "e".into(),
                ..Default::default()
            },
        );
        t.status = Some(TaskStatus {
            pod_ip: Some("10.0.0.2".into()),
            ..Default::default()
        });
        let mut v = serde_json::to_value(&t).unwrap();
        v["metadata"]["managedFields"] = pod()["metadata"]["managedFields"].clone();
        let got: Lean<Task> = serde_json::from_str(&v.to_string()).unwrap();
        assert_eq!(got.0.metadata, t.metadata);
        assert_eq!((got.0.spec, got.0.status), (t.spec, t.status));
        let full: Task = serde_json::from_value(v).unwrap();
        assert!(full.metadata.managed_fields.is_some(), "the input had them");
    }

    /// Only the metadata's managedFields: a key of that name anywhere else is kept.
    #[test]
    fn only_the_metadata_key_is_skipped() {
        let mut v = pod();
        v["metadata"]["annotations"] = json!({"managedFields": "x"});
        let got: Lean<Pod> = serde_json::from_value(v).unwrap();
        let a = got.0.metadata.annotations.unwrap_or_default();
        assert_eq!(a.get("managedFields").map(String::as_str), Some("x"));
    }

    /// A watch event, as the watcher decodes it, and a bad object's error as K's.
    #[test]
    fn watch_events_and_errors() {
        let ev = json!({"type": "MODIFIED", "object": pod()}).to_string();
        let got: kube::core::WatchEvent<Lean<Pod>> = serde_json::from_str(&ev).unwrap();
        let kube::core::WatchEvent::Modified(p) = got else {
            panic!("not a modification: {got:?}");
        };
        assert_eq!(p.0.metadata.name.as_deref(), Some("p"));
        assert!(p.0.metadata.managed_fields.is_none());
        let mut bad = pod();
        bad["metadata"]["name"] = json!(7);
        let text = bad.to_string();
        let want = serde_json::from_str::<Pod>(&text).unwrap_err().to_string();
        let got = serde_json::from_str::<Lean<Pod>>(&text)
            .unwrap_err()
            .to_string();
        assert_eq!(got, want);
    }
}

//! The Pod as the operator's store keeps it: metadata, the node it is on and its status, and
//! nothing else. k8s-openapi's `Pod` is 2,416 bytes inline even with its spec emptied (its
//! `PodSpec` alone 1,464): for 10,000 pods that is 24 MB of `None`s. This type is what the
//! Pod watch decodes into (the spec's other fields are skipped while decoding, never
//! allocated); Pods are still written as k8s-openapi's `Pod`.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct StoredPod {
    /// Its labels are not kept (`trim::pod`): a map of one label is a 544-byte tree node.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The `envbridge.dev/environment` label's value, the one label read of a stored Pod.
    #[serde(skip)]
    pub environment: Option<String>,
    pub spec: Option<StoredPodSpec>,
    pub status: Option<PodStatus>,
}

/// The one field of the spec the operator reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StoredPodSpec {
    pub node_name: Option<String>,
}

/// The apiserver's kind, plural and URLs of `$api` for `$stored`, a type of the operator's
/// own that the store decodes it into (with a `metadata: ObjectMeta` field).
macro_rules! stored_as {
    ($stored:ty, $api:ty) => {
        impl k8s_openapi::Resource for $stored {
            const API_VERSION: &'static str = <$api as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$api as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$api as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$api as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str =
                <$api as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$api as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::Metadata for $stored {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use stored_as;

stored_as!(StoredPod, Pod);

/// What the store would hold of `pod` (the decoding test compares against it).
#[cfg(test)]
impl From<Pod> for StoredPod {
    fn from(pod: Pod) -> StoredPod {
        StoredPod {
            metadata: pod.metadata,
            environment: None,
            spec: pod.spec.map(|s| StoredPodSpec {
                node_name: s.node_name,
            }),
            status: pod.status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec};

    fn full_pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("bo-flp001-readout-0".into()),
                namespace: Some("ns".into()),
                labels: Some([("envbridge.dev/environment".into(), "bo".into())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("flp001".into()),
                containers: vec![Container {
                    name: "task".into(),
                    env: Some(vec![EnvVar {
                        name: "X".into(),
                        value: Some("y".repeat(1000)),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some("127.128.0.3".into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_watched_pod_decodes_to_its_metadata_node_and_status() {
        let pod = full_pod();
        let json = serde_json::to_string(&pod).expect("json");
        let stored: StoredPod = serde_json::from_str(&json).expect("decodes");
        assert_eq!(stored, StoredPod::from(pod.clone()));
        assert_eq!(
            stored.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some("flp001")
        );
        assert_eq!(stored.status, pod.status);
        assert_eq!(stored.metadata, pod.metadata);
        assert!(std::mem::size_of::<StoredPod>() * 2 < std::mem::size_of::<Pod>());
    }

    #[test]
    fn it_is_the_apiservers_pod_kind() {
        use kube::Resource;
        assert_eq!(StoredPod::kind(&()), "Pod");
        assert_eq!(StoredPod::api_version(&()), "v1");
        assert_eq!(StoredPod::plural(&()), "pods");
        assert_eq!(
            StoredPod::url_path(&(), Some("ns")),
            Pod::url_path(&(), Some("ns"))
        );
    }
}

//! The Service as the operator's store keeps it: metadata, its environment, and of its spec
//! what `service_matches` reads (headless, its ports' numbers). k8s-openapi's `Service` is
//! 824 bytes inline, and its labels a 544-byte tree node. This type is what the Service watch
//! decodes into; Services are still written as k8s-openapi's `Service`.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::stored_pod::stored_as;

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct StoredService {
    /// Its labels are not kept (`trim::service`).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The `envbridge.dev/environment` label's value, the one label read of a stored Service.
    #[serde(skip)]
    pub environment: Option<String>,
    pub spec: Option<StoredServiceSpec>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct StoredServiceSpec {
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    #[serde(default)]
    pub ports: Vec<StoredServicePort>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct StoredServicePort {
    pub port: i32,
}

stored_as!(StoredService, Service);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_service_decodes_to_its_metadata_and_ports() {
        let svc = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "t-a", "namespace": "ns", "labels": {"envbridge.dev/environment": "bo"}},
            "spec": {"clusterIP": "None", "clusterIPs": ["None"], "selector": {"a": "b"},
                     "ports": [{"name": "discovery", "port": 47000, "protocol": "TCP", "targetPort": 47000}]},
            "status": {"loadBalancer": {}}
        });
        let stored: StoredService = serde_json::from_value(svc).expect("decodes");
        let spec = stored.spec.as_ref().expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.ports, vec![StoredServicePort { port: 47000 }]);
        assert_eq!(stored.metadata.name.as_deref(), Some("t-a"));
        let (stored, whole) = (
            std::mem::size_of::<StoredService>(),
            std::mem::size_of::<Service>(),
        );
        assert!(
            stored + 256 < whole,
            "{stored} bytes inline against {whole}"
        );
    }

    #[test]
    fn it_is_the_apiservers_service_kind() {
        use kube::Resource;
        assert_eq!(StoredService::kind(&()), "Service");
        assert_eq!(StoredService::plural(&()), "services");
        assert_eq!(
            StoredService::url_path(&(), Some("ns")),
            Service::url_path(&(), Some("ns"))
        );
    }
}

//! What the operator's stores keep of each watched object: only the fields it reads. (Pods
//! are decoded into a type of their own instead: `stored_pod`.)
//! Applied to every watch event before the store sees it.

use k8s_openapi::api::core::v1::{Node, NodeSpec, Service, ServiceSpec};

/// Objects read whole (Tasks, TaskSets, TaskTemplates).
pub fn keep<K>(_: &mut K) {}

/// A Service: whether it is headless, and its ports.
pub fn service(s: &mut Service) {
    let spec = s.spec.take().unwrap_or_default();
    s.spec = Some(ServiceSpec {
        cluster_ip: spec.cluster_ip,
        ports: spec.ports,
        ..ServiceSpec::default()
    });
    s.status = None;
}

/// A Node: its name and labels (placement reads nothing else).
pub fn node(n: &mut Node) {
    n.spec = Some(NodeSpec::default());
    n.status = None;
    n.metadata.annotations = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_keep_what_service_matches_reads() {
        use k8s_openapi::api::core::v1::ServicePort;
        let mut s = Service {
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".into()),
                ports: Some(vec![ServicePort {
                    port: 47000,
                    ..Default::default()
                }]),
                selector: Some([("a".to_string(), "b".to_string())].into()),
                session_affinity: Some("None".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(crate::operator::service::service_matches(&s, 47000));
        service(&mut s);
        assert!(crate::operator::service::service_matches(&s, 47000));
        assert!(s.spec.as_ref().unwrap().selector.is_none());
    }
}

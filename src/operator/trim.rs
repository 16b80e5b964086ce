//! What the operator's stores keep of each watched object: only the fields it reads, so that
//! thousands of pods cost their status, not their full spec (containers, env, volumes).
//! Applied to every watch event before the store sees it.

use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, PodSpec, Service, ServiceSpec};

/// Objects read whole (Tasks, TaskSets, TaskTemplates).
pub fn keep<K>(_: &mut K) {}

/// A pod: its metadata (names, labels, annotations, owners, timestamps), the node it is on
/// (`spec.nodeName`), and its whole status (phase, IP, container states, conditions).
pub fn pod(p: &mut Pod) {
    let node_name = p.spec.as_ref().and_then(|s| s.node_name.clone());
    p.spec = Some(PodSpec {
        node_name,
        ..PodSpec::default()
    });
}

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
    use k8s_openapi::api::core::v1::{Container, EnvVar, PodStatus};

    #[test]
    fn pods_keep_their_node_and_status_only() {
        let mut p = Pod {
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
            ..Default::default()
        };
        let before = crate::operator::pod_status::observe(&p);
        pod(&mut p);
        assert_eq!(crate::operator::pod_status::observe(&p), before);
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("flp001"));
        assert!(spec.containers.is_empty());
    }

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

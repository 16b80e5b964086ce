//! What the operator's stores keep of each watched object: only the fields it reads. (Pods
//! are decoded into a type of their own first: `stored_pod`.)
//! Applied to every watch event before the store sees it.

use k8s_openapi::api::core::v1::{ContainerStatus, Node, NodeSpec, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::stored_pod::StoredPod;
use super::stored_service::StoredService;
use super::task_controller::HOOK_RUN;
use crate::crd::Task;
use crate::crd::labels::ENVIRONMENT;

/// Objects read whole (TaskSets, TaskTemplates).
pub fn keep<K>(_: &mut K) {}

/// A Task but its annotations (the role path, which its spec holds too): nothing reads them
/// of a stored Task, and a map is a 544-byte tree node however few it holds.
pub fn task(t: &mut Task) {
    t.metadata.annotations = None;
}

/// A Pod: its environment label (as a field), its hook-run annotation, and of its status
/// what `pod_status` and `pod_story` read (phase, IP, start, reason, the conditions that are
/// not met, the containers that wait or ended). A running pod's status is mostly what is
/// fine (its met conditions and their times, images, IPs, QoS, running containers): for
/// 10,000 pods that is megabytes nobody reads.
pub fn pod(p: &mut StoredPod) {
    p.environment = take_environment(&mut p.metadata);
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.retain(|k, _| k == HOOK_RUN);
        if a.is_empty() {
            p.metadata.annotations = None;
        }
    }
    let Some(s) = p.status.take() else { return };
    let unmet: Vec<PodCondition> = (s.conditions.into_iter().flatten())
        .filter(|c| c.status != "True")
        .map(|c| PodCondition {
            last_probe_time: None,
            last_transition_time: None,
            ..c
        })
        .collect();
    p.status = Some(PodStatus {
        phase: s.phase,
        pod_ip: s.pod_ip,
        start_time: s.start_time,
        reason: s.reason,
        message: s.message,
        conditions: (!unmet.is_empty()).then_some(unmet),
        // A running container says nothing that is read (only waiting and terminated ones).
        container_statuses: s
            .container_statuses
            .map(|cs| {
                cs.into_iter()
                    .filter(|c| c.state.as_ref().is_some_and(|st| st.running.is_none()))
                    .map(|c| ContainerStatus {
                        name: c.name,
                        state: c.state,
                        ..ContainerStatus::default()
                    })
                    .collect::<Vec<_>>()
            })
            .filter(|cs| !cs.is_empty()),
        ..PodStatus::default()
    });
}

/// The environment label's value, the labels dropped: the one label read of a stored Pod or
/// Service (the teardown counts them by it; the watches select by the others on the server,
/// and the controllers map events to Tasks by owner reference).
fn take_environment(meta: &mut ObjectMeta) -> Option<String> {
    meta.labels.take().and_then(|mut l| l.remove(ENVIRONMENT))
}

/// A Service: its environment (as a field); its spec is decoded to what is read.
pub fn service(s: &mut StoredService) {
    s.environment = take_environment(&mut s.metadata);
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

    /// A pod as kwok or a kubelet reports it Running, then Failed: what the task controller
    /// reads of it is the same before and after the trim.
    #[test]
    fn pods_keep_what_the_task_controller_reads() {
        use crate::operator::{pod_status, pod_story};
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, PodIP,
        };
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use kube::ResourceExt;
        let now = Time(jiff::Timestamp::from_second(1_700_000_000).expect("time"));
        let cond = |t: &str, st: &str| PodCondition {
            type_: t.into(),
            status: st.into(),
            reason: (st == "False").then(|| "Unschedulable".to_string()),
            message: (st == "False").then(|| "0/1 nodes are available".to_string()),
            last_transition_time: Some(now.clone()),
            ..PodCondition::default()
        };
        let container = |state: ContainerState| ContainerStatus {
            name: "task".into(),
            image: "registry.local/o2/readout:1.0".into(),
            image_id: "sha256:0123".into(),
            container_id: Some("containerd://abc".into()),
            ready: true,
            started: Some(true),
            state: Some(state),
            ..ContainerStatus::default()
        };
        let mut running = StoredPod::default();
        running.metadata.labels = Some(
            [
                (ENVIRONMENT.to_string(), "bo".to_string()),
                (
                    "envbridge.dev/task".to_string(),
                    "bo-flp001-readout-0".to_string(),
                ),
            ]
            .into(),
        );
        running.metadata.annotations = Some(
            [
                (HOOK_RUN.to_string(), "before_CONFIGURE-3".to_string()),
                ("envbridge.dev/role-path".to_string(), "a.b.c".to_string()),
            ]
            .into(),
        );
        running.status = Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("127.1.0.5".into()),
            pod_ips: Some(vec![PodIP {
                ip: "127.1.0.5".into(),
            }]),
            host_ip: Some("127.1.0.1".into()),
            qos_class: Some("BestEffort".into()),
            start_time: Some(now.clone()),
            conditions: Some(vec![cond("Ready", "True"), cond("PodScheduled", "True")]),
            container_statuses: Some(vec![container(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(now.clone()),
                }),
                ..ContainerState::default()
            })]),
            ..PodStatus::default()
        });
        let mut failed = running.clone();
        let st = failed.status.as_mut().expect("status");
        st.phase = Some("Failed".into());
        st.conditions = Some(vec![cond("Ready", "False"), cond("PodScheduled", "True")]);
        st.container_statuses = Some(vec![container(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 3,
                reason: Some("Error".into()),
                message: Some("readout: no such card\n".into()),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        })]);
        let mut pending = running.clone();
        let st = pending.status.as_mut().expect("status");
        st.phase = Some("Pending".into());
        st.conditions = Some(vec![cond("PodScheduled", "False")]);
        st.container_statuses = None;
        for whole in [running, failed, pending] {
            let mut kept = whole.clone();
            pod(&mut kept);
            assert_eq!(pod_status::observe(&kept), pod_status::observe(&whole));
            assert_eq!(
                pod_story::termination_message(&kept),
                pod_story::termination_message(&whole)
            );
            assert_eq!(
                pod_story::pending_reasons(&kept),
                pod_story::pending_reasons(&whole)
            );
            assert_eq!(
                kept.annotations().get(HOOK_RUN).map(String::as_str),
                Some("before_CONFIGURE-3")
            );
            assert_eq!(kept.annotations().len(), 1);
            assert!(kept.labels().is_empty());
            assert_eq!(kept.environment.as_deref(), Some("bo"));
            let st = kept.status.as_ref().expect("status");
            assert_eq!(
                st.start_time,
                whole.status.as_ref().expect("status").start_time
            );
            assert!(st.host_ip.is_none() && st.pod_ips.is_none() && st.qos_class.is_none());
            assert!(st.conditions.iter().flatten().all(|c| c.status != "True"));
            assert!(
                st.container_statuses
                    .iter()
                    .flatten()
                    .all(|c| c.image.is_empty())
            );
        }
    }

    #[test]
    fn services_keep_their_environment_as_a_field() {
        let mut s = StoredService {
            metadata: ObjectMeta {
                labels: Some(
                    [
                        (ENVIRONMENT.to_string(), "bo".to_string()),
                        ("envbridge.dev/class".to_string(), "readout".to_string()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        service(&mut s);
        assert_eq!(s.environment.as_deref(), Some("bo"));
        assert!(s.metadata.labels.is_none());
    }
}

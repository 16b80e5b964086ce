//! What a Pod says about its task: phase, IP, and failures detected early. Pure.

use k8s_openapi::api::core::v1::ContainerStatus;

use super::stored_pod::StoredPod;

/// Waiting reasons that will not resolve on their own: reported at once, not after a timeout.
const FATAL_WAITING: [&str; 8] = [
    "ErrImagePull",
    "ErrImageNeverPull",
    "ImagePullBackOff",
    "RunContainerError",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Exactly as Kubernetes names it (Pending, Running, Succeeded, Failed, Unknown).
    pub phase: String,
    pub ip: Option<String>,
    /// Why the task's process is not (and will not be) running, when it failed.
    pub failure: Option<String>,
    /// The process ended with exit code 0.
    pub succeeded: bool,
    /// Why a pod that is not running yet is held, when the pod says so (not scheduled, a
    /// container waiting for a reason other than being created): worth a shifter's look.
    pub held: Option<String>,
}

pub fn observe(pod: &StoredPod) -> PodView {
    let status = pod.status.as_ref();
    let phase = status
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Pending".into());
    let ip = status
        .and_then(|s| s.pod_ip.clone())
        .filter(|ip| !ip.is_empty());
    let containers: &[ContainerStatus] = status
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or(&[]);
    let failure = containers
        .iter()
        .find_map(container_failure)
        .or_else(|| (phase == "Failed").then(|| phase_failure(pod)));
    let succeeded = phase == "Succeeded" && failure.is_none();
    let held = (phase == "Pending" && failure.is_none())
        .then(|| unscheduled(pod).or_else(|| containers.iter().find_map(container_held)))
        .flatten();
    PodView {
        phase,
        ip,
        failure,
        succeeded,
        held,
    }
}

/// The pod's `PodScheduled=False` condition, said as "Reason: message".
fn unscheduled(pod: &StoredPod) -> Option<String> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    Some(reason_message(
        c.reason.as_deref().unwrap_or("Unschedulable"),
        c.message.as_deref(),
    ))
}

/// A container waiting for a reason other than its creation under way.
fn container_held(c: &ContainerStatus) -> Option<String> {
    let w = c.state.as_ref()?.waiting.as_ref()?;
    let reason = w.reason.as_deref().unwrap_or("");
    if reason.is_empty() || matches!(reason, "ContainerCreating" | "PodInitializing") {
        return None;
    }
    Some(format!(
        "container {} {}",
        c.name,
        reason_message(reason, w.message.as_deref())
    ))
}

fn reason_message(reason: &str, message: Option<&str>) -> String {
    match message.filter(|m| !m.is_empty()) {
        Some(m) => format!("{reason}: {}", super::pod_story::tail(m, 256)),
        None => reason.to_string(),
    }
}

fn container_failure(c: &ContainerStatus) -> Option<String> {
    let state = c.state.as_ref()?;
    if let Some(w) = &state.waiting {
        let reason = w.reason.as_deref().unwrap_or("");
        if FATAL_WAITING.contains(&reason) {
            let msg = w
                .message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            return Some(format!("container {} {reason}{msg}", c.name));
        }
    }
    if let Some(t) = &state.terminated
        && t.exit_code != 0
    {
        let reason = t.reason.as_deref().unwrap_or("Error");
        // The termination message may be the process's last log lines (up to 4 KiB, kept
        // whole in the Task's `lastLog`): its last line says it here.
        let msg = t
            .message
            .as_deref()
            .and_then(|m| m.lines().rev().find(|l| !l.trim().is_empty()))
            .map(|m| format!(": {}", super::pod_story::tail(m.trim(), 256)))
            .unwrap_or_default();
        return Some(format!(
            "container {} exited with code {} ({reason}){msg}",
            c.name, t.exit_code
        ));
    }
    None
}

fn phase_failure(pod: &StoredPod) -> String {
    let s = pod.status.as_ref();
    let reason = s.and_then(|s| s.reason.as_deref()).unwrap_or("");
    let message = s.and_then(|s| s.message.as_deref()).unwrap_or("");
    match (reason.is_empty(), message.is_empty()) {
        (true, true) => "pod phase Failed".into(),
        (false, true) => format!("pod phase Failed ({reason})"),
        (true, false) => format!("pod phase Failed: {message}"),
        (false, false) => format!("pod phase Failed ({reason}): {message}"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, PodStatus,
    };

    use super::*;

    fn pod(phase: &str, containers: Vec<ContainerStatus>) -> StoredPod {
        StoredPod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                pod_ip: Some("127.1.0.5".into()),
                container_statuses: Some(containers),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn waiting(reason: &str) -> ContainerStatus {
        ContainerStatus {
            name: "task".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: Some("m".into()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn exited(code: i32) -> ContainerStatus {
        ContainerStatus {
            name: "task".into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn running_pod_has_ip_and_no_failure() {
        let v = observe(&pod("Running", vec![]));
        assert_eq!(
            v,
            PodView {
                phase: "Running".into(),
                ip: Some("127.1.0.5".into()),
                failure: None,
                succeeded: false,
                held: None,
            }
        );
    }

    #[test]
    fn held_pods_say_why_and_starting_ones_do_not() {
        use k8s_openapi::api::core::v1::PodCondition;
        assert_eq!(
            observe(&pod("Pending", vec![waiting("ContainerCreating")])).held,
            None
        );
        assert_eq!(
            observe(&pod("Pending", vec![waiting("SomethingSlow")])).held,
            Some("container task SomethingSlow: m".into())
        );
        let mut p = pod("Pending", vec![]);
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/4 nodes are available".into()),
            ..Default::default()
        }]);
        assert_eq!(
            observe(&p).held.as_deref(),
            Some("Unschedulable: 0/4 nodes are available")
        );
        // A fatal reason is a failure, not a hold; a running pod is not held.
        assert_eq!(
            observe(&pod("Pending", vec![waiting("ErrImagePull")])).held,
            None
        );
        assert_eq!(
            observe(&pod("Running", vec![waiting("SomethingSlow")])).held,
            None
        );
    }

    #[test]
    fn image_and_crash_failures_are_early() {
        for r in [
            "ErrImagePull",
            "ImagePullBackOff",
            "InvalidImageName",
            "CrashLoopBackOff",
        ] {
            let v = observe(&pod("Pending", vec![waiting(r)]));
            assert_eq!(v.failure, Some(format!("container task {r}: m")));
        }
        assert_eq!(
            observe(&pod("Pending", vec![waiting("ContainerCreating")])).failure,
            None
        );
    }

    #[test]
    fn exit_codes_and_failed_phase() {
        let v = observe(&pod("Failed", vec![exited(3)]));
        assert_eq!(
            v.failure.as_deref(),
            Some("container task exited with code 3 (Error)")
        );
        let v = observe(&pod("Succeeded", vec![exited(0)]));
        assert!(v.succeeded && v.failure.is_none());
        let mut p = pod("Failed", vec![]);
        p.status.as_mut().unwrap().reason = Some("Evicted".into());
        assert_eq!(
            observe(&p).failure.as_deref(),
            Some("pod phase Failed (Evicted)")
        );
    }
}

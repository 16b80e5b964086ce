//! What a Task reconcile decided besides the new status, a task's failure, its Events.

use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use crate::crd::{Task, TaskStatus, TransitionPhase, TransitionStatus};
use crate::operator::context::Ctx;
use crate::operator::live;
use crate::operator::pod_story;
use crate::state::State;

/// Task condition: the task's process ended (its pod failed or completed); the pod is not
/// re-created for it.
pub const COND_ENDED: &str = "ProcessEnded";

/// What one reconcile decided besides the new status.
#[derive(Default)]
pub(super) struct Step {
    pub(super) write_status: bool,
    pub(super) delete_pod: bool,
    pub(super) action: Option<Action>,
    /// A change a follower saw, which the new status records.
    pub(super) live_change: Option<LiveChange>,
}

/// A change of state a task's follower saw between transitions. It is told (an Event) and
/// forgotten only once the status that records it is written: the follower reports a lost
/// connection once, so a write refused (apiserver or etcd down) must leave it for the retry.
pub(super) struct LiveChange {
    pub(super) obs: live::Observed,
    pub(super) reason: &'static str,
    pub(super) message: String,
}

impl LiveChange {
    pub(super) async fn told(self, ctx: &Ctx, task: &Task) {
        ctx.live
            .consumed(&task.uid().unwrap_or_default(), &self.obs);
        publish(ctx, task, self.reason, self.message).await;
    }
}

pub(super) fn fail(st: &mut TaskStatus, task: &Task, message: String) {
    if st.state != Some(State::Error) || st.message.as_deref() != Some(message.as_str()) {
        info!(task = %task.name_any(), %message, "task ERROR");
    }
    st.state = Some(State::Error);
    st.message = Some(message.clone());
    // A pending transition fails with the task.
    if let Some(req) = &task.spec.transition
        && st.transition.as_ref().map(|t| &t.id) != Some(&req.id)
    {
        st.transition = Some(TransitionStatus {
            id: req.id.clone(),
            event: req.event,
            phase: TransitionPhase::Failed,
            message,
        });
    }
}

/// A Kubernetes Event on the Task (Warning: every reason published here is bad news but
/// `TaskStateChanged`).
pub(super) async fn publish(ctx: &Ctx, task: &Task, reason: &str, note: String) {
    use kube::runtime::events::{Event as KEvent, EventType};
    let ev = KEvent {
        type_: if reason == "TaskStateChanged" {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: reason.into(),
        note: Some(pod_story::tail(&note, 1024)),
        action: "Observe".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &task.object_ref(&())).await {
        warn!(task = %task.name_any(), error = %e, "could not publish event");
    }
}

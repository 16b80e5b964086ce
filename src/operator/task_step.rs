//! What a Task reconcile does next, as a pure function of what it observed (its pod, its
//! status, the store's lag, the clock): the controller only executes the answer. Unit-tested
//! without a server.

use std::net::IpAddr;
use std::time::Duration;

use super::pod_status::PodView;
use crate::model::ControlMode;
use crate::state::State;

/// The task's pod as the store shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum PodSeen {
    None,
    /// A pod of an earlier Task of the same name (another owner).
    Foreign {
        deleting: bool,
    },
    /// Ours, being deleted.
    Deleting,
    /// Ours, live; `age` since creation.
    Present {
        view: PodView,
        age: Duration,
    },
}

/// Everything the decision reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub mode: ControlMode,
    pub state: Option<State>,
    /// The task's process ended (its pod failed or completed) and was recorded so.
    pub ended: bool,
    /// A RECOVER is asked and not answered while the task is in ERROR.
    pub recover: bool,
    pub pod: PodSeen,
    /// This operator created the pod moments ago and the store may still show it within this
    /// (None: it did not, or the store had long enough).
    pub awaiting_pod: Option<Duration>,
    /// The task has a status at all (a pod that starts quietly gets its first write later).
    pub has_status: bool,
    pub startup_limit: Duration,
}

/// How long a fresh pod may be held (not scheduled, a container waiting) before its Task
/// reports why; failures are reported at once regardless.
pub const PENDING_REPORT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Delete the earlier Task's pod (unless already going) and look again in a second.
    ClearForeignPod { delete: bool },
    /// Our pod is going: look again in a second.
    WaitPodGone,
    /// A hook task: its own path (`drive_hook`).
    Hook,
    /// The process ended and nothing asks for it: wait for a change.
    Idle,
    /// RECOVER of a task whose process ended and whose pod is gone: a fresh pod.
    Recreate,
    /// The pod vanished while the task was live: the task fails.
    PodVanished,
    /// Created a moment ago, not in the store yet: look again after this.
    AwaitStore(Duration),
    /// No pod yet: create it (then its Service).
    CreatePod,
    /// RECOVER of a task whose ended pod was kept: delete the pod, look again in a second.
    ReplaceEndedPod,
    /// The process failed (the pod's words).
    Failed(String),
    /// A basic task's process ran to completion: it keeps following the transitions.
    BasicCompleted,
    /// The process ran to completion.
    Completed,
    /// Not Running within the start-up limit.
    StartupTimeout,
    /// Starting: look again after `after`; `quiet`: no status write yet.
    Starting { quiet: bool, after: Duration },
    /// The pod's IP does not parse.
    BadIp(String),
    /// A live, Running pod at this address: read and drive the process.
    Control(IpAddr),
}

pub fn next(s: &Seen) -> Next {
    let live = |st: Option<State>| {
        matches!(
            st,
            Some(State::Standby | State::Configured | State::Running)
        )
    };
    let (view, age) = match &s.pod {
        PodSeen::Foreign { deleting } => return Next::ClearForeignPod { delete: !deleting },
        PodSeen::Deleting => return Next::WaitPodGone,
        _ if s.mode == ControlMode::Hook => return Next::Hook,
        PodSeen::None if s.ended && s.recover => return Next::Recreate,
        PodSeen::None if s.ended => return Next::Idle,
        PodSeen::None if live(s.state) => return Next::PodVanished,
        PodSeen::None => {
            return match s.awaiting_pod {
                Some(left) => Next::AwaitStore(left),
                None => Next::CreatePod,
            };
        }
        PodSeen::Present { view, age } => (view, *age),
    };
    if (view.failure.is_some() || view.succeeded) && s.recover {
        return Next::ReplaceEndedPod;
    }
    if let Some(f) = &view.failure {
        return Next::Failed(f.clone());
    }
    if view.succeeded {
        return if s.mode == ControlMode::Basic {
            Next::BasicCompleted
        } else {
            Next::Completed
        };
    }
    match (view.ip.as_deref(), view.phase == "Running") {
        (Some(ip), true) => match ip.parse() {
            Ok(ip) => Next::Control(ip),
            Err(_) => Next::BadIp(ip.to_string()),
        },
        _ if age >= s.startup_limit => Next::StartupTimeout,
        _ => {
            let left = s.startup_limit - age;
            // A healthy start is quiet however slow: the Task's first status is its
            // process's answer (one write a task while thousands of pods start). A pod that
            // says why it is held is reported once it has been for PENDING_REPORT.
            let report = s.has_status || (age >= PENDING_REPORT && view.held.is_some());
            let after = if age < PENDING_REPORT {
                (PENDING_REPORT - age).min(left)
            } else {
                left
            };
            Next::Starting {
                quiet: !report,
                after: if report { left } else { after },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pod: PodSeen) -> Seen {
        Seen {
            mode: ControlMode::Direct,
            state: None,
            ended: false,
            recover: false,
            pod,
            awaiting_pod: None,
            has_status: false,
            startup_limit: Duration::from_secs(120),
        }
    }

    fn view(phase: &str, ip: Option<&str>) -> PodView {
        PodView {
            phase: phase.into(),
            ip: ip.map(String::from),
            failure: None,
            succeeded: false,
            held: None,
        }
    }

    fn present(v: PodView, age: u64) -> PodSeen {
        PodSeen::Present {
            view: v,
            age: Duration::from_secs(age),
        }
    }

    #[test]
    fn no_pod() {
        assert_eq!(next(&seen(PodSeen::None)), Next::CreatePod);
        let mut s = seen(PodSeen::None);
        s.awaiting_pod = Some(Duration::from_secs(6));
        assert_eq!(next(&s), Next::AwaitStore(Duration::from_secs(6)));
        s.awaiting_pod = None;
        s.state = Some(State::Running);
        assert_eq!(next(&s), Next::PodVanished);
        s.ended = true;
        assert_eq!(next(&s), Next::Idle);
        s.recover = true;
        assert_eq!(next(&s), Next::Recreate);
    }

    #[test]
    fn pods_of_others_and_going_pods_come_first() {
        assert_eq!(
            next(&seen(PodSeen::Foreign { deleting: false })),
            Next::ClearForeignPod { delete: true }
        );
        assert_eq!(
            next(&seen(PodSeen::Foreign { deleting: true })),
            Next::ClearForeignPod { delete: false }
        );
        assert_eq!(next(&seen(PodSeen::Deleting)), Next::WaitPodGone);
        let mut s = seen(PodSeen::None);
        s.mode = ControlMode::Hook;
        assert_eq!(next(&s), Next::Hook);
    }

    #[test]
    fn ended_pods() {
        let mut failed = view("Failed", None);
        failed.failure = Some("exit code 3".into());
        assert_eq!(
            next(&seen(present(failed.clone(), 5))),
            Next::Failed("exit code 3".into())
        );
        let mut s = seen(present(failed, 5));
        s.recover = true;
        assert_eq!(next(&s), Next::ReplaceEndedPod);
        let mut done = view("Succeeded", None);
        done.succeeded = true;
        assert_eq!(next(&seen(present(done.clone(), 5))), Next::Completed);
        let mut s = seen(present(done, 5));
        s.mode = ControlMode::Basic;
        assert_eq!(next(&s), Next::BasicCompleted);
    }

    #[test]
    fn starting_pods_report_late_and_time_out() {
        assert_eq!(
            next(&seen(present(view("Pending", None), 10))),
            Next::Starting {
                quiet: true,
                after: Duration::from_secs(50)
            }
        );
        let mut s = seen(present(view("Pending", None), 10));
        s.has_status = true;
        assert_eq!(
            next(&s),
            Next::Starting {
                quiet: false,
                after: Duration::from_secs(110)
            }
        );
        // Slow but healthy: quiet until the start-up limit.
        assert_eq!(
            next(&seen(present(view("Pending", None), 70))),
            Next::Starting {
                quiet: true,
                after: Duration::from_secs(50)
            }
        );
        // Held, saying why: reported after PENDING_REPORT, not before.
        let mut held = view("Pending", None);
        held.held = Some("Unschedulable".into());
        assert_eq!(
            next(&seen(present(held.clone(), 10))),
            Next::Starting {
                quiet: true,
                after: Duration::from_secs(50)
            }
        );
        assert_eq!(
            next(&seen(present(held, 70))),
            Next::Starting {
                quiet: false,
                after: Duration::from_secs(50)
            }
        );
        assert_eq!(
            next(&seen(present(view("Pending", None), 120))),
            Next::StartupTimeout
        );
        // An IP before Running is not enough.
        assert_eq!(
            next(&seen(present(view("Pending", Some("127.1.0.5")), 130))),
            Next::StartupTimeout
        );
    }

    #[test]
    fn running_pods_are_driven() {
        assert_eq!(
            next(&seen(present(view("Running", Some("127.128.0.7")), 1))),
            Next::Control("127.128.0.7".parse().unwrap())
        );
        assert_eq!(
            next(&seen(present(view("Running", Some("x")), 1))),
            Next::BadIp("x".into())
        );
    }
}

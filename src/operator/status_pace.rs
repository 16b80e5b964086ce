//! When an Environment's status is written: an outcome at once, progress at most once a
//! window. A pure function of the two statuses and the time since this operator's last write,
//! unit-tested without a server.
//!
//! An outcome is anything a waiting client or a shifter acts on: the state, the transition's
//! id or phase, a condition. Progress is the rest (counts, `ready`, the failing list while the
//! state holds): while thousands of tasks answer, it is coalesced so that the status is not
//! written once per task; the moment the last task answers, the outcome goes out.

use std::time::Duration;

use crate::crd::EnvironmentStatus;

/// How long to hold `new` back (None: write it now). `since_last`: since this operator last
/// wrote this Environment's status (None: not since it started).
pub fn hold(
    old: &EnvironmentStatus,
    new: &EnvironmentStatus,
    since_last: Option<Duration>,
    window: Duration,
) -> Option<Duration> {
    if new == old || is_outcome(old, new) {
        return None;
    }
    let since = since_last?;
    (since < window).then(|| window - since)
}

/// The progress window for an environment of `tasks` tasks: `base`, widened by a quarter of
/// a millisecond a task (2.5 s at 10,000 tasks), so that progress costs about as many
/// writes per transition at any size (~1% of its Task writes at 10,000) instead of growing
/// with the time thousands of tasks take.
pub fn window(base: Duration, tasks: usize) -> Duration {
    base.max(Duration::from_micros(250 * tasks as u64))
}

fn is_outcome(old: &EnvironmentStatus, new: &EnvironmentStatus) -> bool {
    let step = |s: &EnvironmentStatus| s.transition.as_ref().map(|t| (t.id.clone(), t.phase));
    old.state != new.state
        || step(old) != step(new)
        || old.conditions != new.conditions
        || old.observed_generation != new.observed_generation
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{TransitionPhase, TransitionStatus};
    use crate::state::{Event, State};

    const W: Duration = Duration::from_millis(250);

    fn status(state: State, phase: TransitionPhase, ready: &str) -> EnvironmentStatus {
        EnvironmentStatus {
            state: Some(state),
            ready: Some(ready.into()),
            transition: Some(TransitionStatus {
                id: "t1".into(),
                event: Event::Start,
                phase,
                message: String::new(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_window_widens_with_size() {
        assert_eq!(window(W, 12), W);
        assert_eq!(window(W, 2_000), Duration::from_millis(500));
        assert_eq!(window(W, 10_000), Duration::from_millis(2_500));
        assert_eq!(
            window(Duration::from_secs(5), 10_000),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn progress_is_coalesced_and_outcomes_are_not() {
        let running = status(State::Configured, TransitionPhase::Running, "3/12");
        let more = status(State::Configured, TransitionPhase::Running, "7/12");
        let done = status(State::Running, TransitionPhase::Succeeded, "12/12");
        let ms = Duration::from_millis;
        // Progress a moment after the last write waits out the window.
        assert_eq!(hold(&running, &more, Some(ms(100)), W), Some(ms(150)));
        // Past the window, or with no write since start: now.
        assert_eq!(hold(&running, &more, Some(ms(300)), W), None);
        assert_eq!(hold(&running, &more, None, W), None);
        // The last answer: at once, however recent the last write.
        assert_eq!(hold(&more, &done, Some(ms(1)), W), None);
        // Nothing changed: nothing to hold.
        assert_eq!(hold(&more, &more, Some(ms(1)), W), None);
        // A new transition, a failure turning the state: at once.
        let mut next = more.clone();
        next.transition.as_mut().unwrap().id = "t2".into();
        assert_eq!(hold(&more, &next, Some(ms(1)), W), None);
        let failed = status(State::Error, TransitionPhase::Running, "7/12");
        assert_eq!(hold(&more, &failed, Some(ms(1)), W), None);
        // A window of zero never holds.
        assert_eq!(hold(&running, &more, Some(ms(0)), Duration::ZERO), None);
    }
}

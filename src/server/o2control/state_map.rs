//! envbridge's states and events in the anchor's words, as o2control callers see them.
//!
//! envbridge's environments follow the task state machine (an environment's state is what
//! its tasks agree on); the anchor's environments have their own: STANDBY -DEPLOY-> DEPLOYED
//! -CONFIGURE-> CONFIGURED -START_ACTIVITY-> RUNNING, and so on. The one difference that
//! shows is the first step: an environment whose tasks are all up in STANDBY is what the
//! anchor calls DEPLOYED, and one whose tasks are not all up yet is still STANDBY.

use crate::state::{Event, State};

/// The anchor's environment state for an envbridge environment state (None: no status yet).
pub fn environment_state(s: Option<State>) -> &'static str {
    match s {
        None | Some(State::Deploying) => "STANDBY",
        Some(State::Standby) => "DEPLOYED",
        Some(State::Configured) => "CONFIGURED",
        Some(State::Running) => "RUNNING",
        Some(State::Error) => "ERROR",
        Some(State::Done) => "DONE",
        // Tasks disagree and no transition explains it: the anchor's word for a role whose
        // children disagree.
        Some(State::Mixed) => "MIXED",
    }
}

/// The anchor's task state: its task state machine is envbridge's, but a task whose
/// process has not answered yet is UNKNOWN there.
pub fn task_state(s: State) -> &'static str {
    match s {
        State::Deploying => "UNKNOWN",
        State::Standby => "STANDBY",
        State::Configured => "CONFIGURED",
        State::Running => "RUNNING",
        State::Error => "ERROR",
        State::Done => "DONE",
        State::Mixed => "MIXED",
    }
}

/// The anchor's task status: ACTIVE while the task's process is up (it answers in a state
/// of the machine), INACTIVE before it is up and once it is done.
pub fn task_status(s: State) -> &'static str {
    match s {
        State::Standby | State::Configured | State::Running | State::Error | State::Mixed => {
            "ACTIVE"
        }
        State::Deploying | State::Done => "INACTIVE",
    }
}

/// The anchor's name of an event (what `currentTransition` and the event stream say).
pub fn event_name(e: Event) -> &'static str {
    match e {
        Event::Configure => "CONFIGURE",
        Event::Start => "START_ACTIVITY",
        Event::Stop => "STOP_ACTIVITY",
        Event::Reset => "RESET",
        Event::Recover => "RECOVER",
        Event::Exit => "EXIT",
        Event::GoError => "GO_ERROR",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_up_in_standby_are_a_deployed_environment() {
        assert_eq!(environment_state(None), "STANDBY");
        assert_eq!(environment_state(Some(State::Deploying)), "STANDBY");
        assert_eq!(environment_state(Some(State::Standby)), "DEPLOYED");
        assert_eq!(environment_state(Some(State::Configured)), "CONFIGURED");
        assert_eq!(environment_state(Some(State::Running)), "RUNNING");
        assert_eq!(environment_state(Some(State::Error)), "ERROR");
        assert_eq!(environment_state(Some(State::Done)), "DONE");
        assert_eq!(environment_state(Some(State::Mixed)), "MIXED");
    }

    #[test]
    fn the_anchors_environment_machine_follows_envbridges_transitions() {
        // Each envbridge event, applied where it applies, lands where the anchor's does.
        let cases = [
            (State::Standby, Event::Configure, "DEPLOYED", "CONFIGURED"),
            (State::Configured, Event::Start, "CONFIGURED", "RUNNING"),
            (State::Running, Event::Stop, "RUNNING", "CONFIGURED"),
            (State::Configured, Event::Reset, "CONFIGURED", "DEPLOYED"),
            (State::Error, Event::Recover, "ERROR", "DEPLOYED"),
            (State::Configured, Event::Exit, "CONFIGURED", "DONE"),
            (State::Running, Event::GoError, "RUNNING", "ERROR"),
        ];
        for (from, ev, anchor_from, anchor_to) in cases {
            let to = crate::state::next(from, ev).expect("applies");
            assert_eq!(environment_state(Some(from)), anchor_from, "{ev:?}");
            assert_eq!(environment_state(Some(to)), anchor_to, "{ev:?}");
        }
    }

    #[test]
    fn task_states_and_statuses() {
        assert_eq!(task_state(State::Deploying), "UNKNOWN");
        assert_eq!(task_status(State::Deploying), "INACTIVE");
        for s in [
            State::Standby,
            State::Configured,
            State::Running,
            State::Error,
        ] {
            assert_eq!(
                task_state(s),
                environment_state(Some(s)).replace("DEPLOYED", "STANDBY")
            );
            assert_eq!(task_status(s), "ACTIVE");
        }
        assert_eq!(task_status(State::Done), "INACTIVE");
    }

    #[test]
    fn events_carry_the_anchors_names() {
        let names: Vec<&str> = Event::ALL.iter().map(|e| event_name(*e)).collect();
        assert_eq!(
            names,
            [
                "CONFIGURE",
                "START_ACTIVITY",
                "STOP_ACTIVITY",
                "RESET",
                "RECOVER",
                "EXIT",
                "GO_ERROR"
            ]
        );
    }
}

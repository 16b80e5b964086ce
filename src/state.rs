//! The run-control state machine shared by tasks and environments.
//!
//! Pure data: no I/O, no Kubernetes. The names and the transition table follow the
//! anchor's task state machine so that real task processes can be driven unchanged.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The state of one task process (and, when all agree, of an environment).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    /// Known to the system, but no process is reachable yet (pod pending, not yet dialed).
    #[default]
    Deploying,
    Standby,
    Configured,
    Running,
    Error,
    Done,
    /// Environment only: tasks disagree and no transition explains it.
    Mixed,
}

/// A run-control event: what a client asks an environment (and so each task) to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Event {
    Configure,
    Start,
    Stop,
    Reset,
    Recover,
    Exit,
    GoError,
}

impl Event {
    pub const ALL: [Event; 7] = [
        Event::Configure,
        Event::Start,
        Event::Stop,
        Event::Reset,
        Event::Recover,
        Event::Exit,
        Event::GoError,
    ];

    /// The state a task must be in for this event to apply (None: any state).
    pub fn source(self) -> Option<&'static [State]> {
        use State::*;
        match self {
            Event::Configure => Some(&[Standby]),
            Event::Start => Some(&[Configured]),
            Event::Stop => Some(&[Running]),
            Event::Reset => Some(&[Configured]),
            Event::Recover => Some(&[Error]),
            Event::Exit => Some(&[Standby, Configured, Error]),
            Event::GoError => None,
        }
    }

    /// The state a task reaches when the event succeeds.
    pub fn target(self) -> State {
        match self {
            Event::Configure => State::Configured,
            Event::Start => State::Running,
            Event::Stop => State::Configured,
            Event::Reset => State::Standby,
            Event::Recover => State::Standby,
            Event::Exit => State::Done,
            Event::GoError => State::Error,
        }
    }

    /// The protocol name of the event (`CONFIGURE`, `GO_ERROR`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Configure => "CONFIGURE",
            Event::Start => "START",
            Event::Stop => "STOP",
            Event::Reset => "RESET",
            Event::Recover => "RECOVER",
            Event::Exit => "EXIT",
            Event::GoError => "GO_ERROR",
        }
    }
}

/// Where `event` leads from `from`, or None when the event does not apply there.
pub fn next(from: State, event: Event) -> Option<State> {
    match event.source() {
        None => Some(event.target()),
        Some(sources) if sources.contains(&from) => Some(event.target()),
        Some(_) => None,
    }
}

impl State {
    pub const TASK_STATES: [State; 6] = [
        State::Deploying,
        State::Standby,
        State::Configured,
        State::Running,
        State::Error,
        State::Done,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Deploying => "DEPLOYING",
            State::Standby => "STANDBY",
            State::Configured => "CONFIGURED",
            State::Running => "RUNNING",
            State::Error => "ERROR",
            State::Done => "DONE",
            State::Mixed => "MIXED",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown {kind} {value:?} (expected one of: {expected})")]
pub struct ParseError {
    kind: &'static str,
    value: String,
    expected: String,
}

impl FromStr for State {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let all = State::TASK_STATES.iter().chain([State::Mixed].iter());
        all.clone()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
            .copied()
            .ok_or_else(|| ParseError {
                kind: "state",
                value: s.to_string(),
                expected: all.map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            })
    }
}

impl FromStr for Event {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.replace('-', "_");
        Event::ALL
            .iter()
            .find(|e| e.as_str().eq_ignore_ascii_case(&norm))
            .copied()
            .ok_or_else(|| ParseError {
                kind: "event",
                value: s.to_string(),
                expected: Event::ALL.map(|e| e.as_str()).join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_cycle_follows_the_anchor_table() {
        let mut s = State::Standby;
        for (ev, want) in [
            (Event::Configure, State::Configured),
            (Event::Start, State::Running),
            (Event::Stop, State::Configured),
            (Event::Reset, State::Standby),
        ] {
            s = next(s, ev).unwrap();
            assert_eq!(s, want);
        }
    }

    #[test]
    fn invalid_events_are_refused() {
        assert_eq!(next(State::Standby, Event::Start), None);
        assert_eq!(next(State::Running, Event::Configure), None);
        assert_eq!(next(State::Error, Event::Recover), Some(State::Standby));
        assert_eq!(next(State::Running, Event::GoError), Some(State::Error));
    }

    #[test]
    fn names_round_trip() {
        for e in Event::ALL {
            assert_eq!(e.as_str().parse::<Event>().unwrap(), e);
        }
        assert_eq!("go-error".parse::<Event>().unwrap(), Event::GoError);
        assert!("LAUNCH".parse::<Event>().is_err());
        assert_eq!("running".parse::<State>().unwrap(), State::Running);
    }
}

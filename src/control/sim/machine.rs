//! The simulated process's own state machine. Pure: the server applies delays and failures.
//!
//! Direct mode plays an OCC-library task (STANDBY, CONFIGURED, RUNNING, ERROR, DONE and the
//! run-control events); fairmq mode plays a FairMQ device (IDLE ... READY and its steps).

use std::str::FromStr;

use super::config::{Requested, SimMode};
use crate::control::fairmq::{FmqEvent, FmqState};
use crate::state::{self, Event, State};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    Direct(State),
    Fairmq(FmqState),
}

/// Why a request is rejected with a gRPC error. The status code differs by kind and mode
/// (see `server`): the OCC library answers a mismatch INVALID_ARGUMENT and an unknown event
/// UNKNOWN; OCClite answers a mismatch CANCELLED.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Rejection {
    #[error("transition not possible: state mismatch: source: {src} current: {current}")]
    Mismatch { src: String, current: String },
    #[error("argument {0} is not a valid transition name")]
    UnknownEvent(String),
}

/// An accepted request: where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub requested: Requested,
    pub from: Machine,
    /// The transient state shown while the transition runs (FairMQ BINDING, ...).
    pub transient: Option<Machine>,
    /// None: the event does not apply in this state (the reply is ok=false, state unchanged).
    pub to: Option<Machine>,
}

impl Machine {
    pub fn initial(mode: SimMode) -> Machine {
        match mode {
            SimMode::Direct => Machine::Direct(State::Standby),
            SimMode::Fairmq => Machine::Fairmq(FmqState::Idle),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Machine::Direct(s) => s.as_str(),
            Machine::Fairmq(s) => s.as_str(),
        }
    }

    /// The ERROR state of this machine's kind.
    pub fn error(self) -> Machine {
        match self {
            Machine::Direct(_) => Machine::Direct(State::Error),
            Machine::Fairmq(_) => Machine::Fairmq(FmqState::Error),
        }
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            Machine::Direct(State::Done) | Machine::Fairmq(FmqState::Exiting)
        )
    }

    /// The run-control state this is (None for FairMQ's intermediate states).
    pub fn run_state(self) -> Option<State> {
        match self {
            Machine::Direct(s) => Some(s),
            Machine::Fairmq(s) => s.to_state(),
        }
    }

    /// Checks a Transition request against the current state. Names are compared exactly,
    /// as the real processes do (a lower-case event is unknown to them).
    pub fn begin(self, src: &str, event: &str) -> Result<Move, Rejection> {
        let current = self.name();
        let same = src == current;
        let unknown = || Rejection::UnknownEvent(event.to_string());
        // Parse the event first: an unknown name is the more useful error.
        let mv = match self {
            Machine::Direct(s) => {
                let e = Event::from_str(event)
                    .ok()
                    .filter(|e| e.as_str() == event)
                    .ok_or_else(unknown)?;
                Move {
                    requested: Requested::Run(e),
                    from: self,
                    transient: None,
                    to: state::next(s, e).map(Machine::Direct),
                }
            }
            Machine::Fairmq(s) => {
                let e = FmqEvent::from_str(event)
                    .ok()
                    .filter(|e| e.as_str() == event)
                    .ok_or_else(unknown)?;
                let applied = e.apply(s);
                Move {
                    requested: Requested::Step(e),
                    from: self,
                    transient: applied.and_then(|(t, _)| t).map(Machine::Fairmq),
                    to: applied.map(|(_, to)| Machine::Fairmq(to)),
                }
            }
        };
        if !same {
            return Err(Rejection::Mismatch {
                src: src.to_string(),
                current: current.to_string(),
            });
        }
        Ok(mv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_follows_the_run_control_table() {
        let m = Machine::initial(SimMode::Direct);
        let mv = m.begin("STANDBY", "CONFIGURE").unwrap();
        assert_eq!(mv.to, Some(Machine::Direct(State::Configured)));
        assert_eq!(mv.transient, None);
        // Exact names, as the OCC library compares.
        assert!(m.begin("standby", "CONFIGURE").is_err());
        assert_eq!(
            m.begin("STANDBY", "configure"),
            Err(Rejection::UnknownEvent("configure".into()))
        );
        assert_eq!(m.begin("STANDBY", "START").unwrap().to, None);
        assert_eq!(
            m.begin("RUNNING", "STOP"),
            Err(Rejection::Mismatch {
                src: "RUNNING".into(),
                current: "STANDBY".into()
            })
        );
        assert_eq!(
            m.begin("STANDBY", "LAUNCH"),
            Err(Rejection::UnknownEvent("LAUNCH".into()))
        );
    }

    #[test]
    fn fairmq_walks_device_states() {
        let mut m = Machine::initial(SimMode::Fairmq);
        for (ev, transient, to) in [
            ("INIT DEVICE", None, FmqState::InitializingDevice),
            ("COMPLETE INIT", None, FmqState::Initialized),
            ("BIND", Some(FmqState::Binding), FmqState::Bound),
            ("CONNECT", Some(FmqState::Connecting), FmqState::DeviceReady),
            (
                "INIT TASK",
                Some(FmqState::InitializingTask),
                FmqState::Ready,
            ),
            ("RUN", None, FmqState::Running),
        ] {
            let mv = m.begin(m.name(), ev).unwrap();
            assert_eq!(mv.transient, transient.map(Machine::Fairmq), "{ev}");
            m = mv.to.unwrap();
            assert_eq!(m, Machine::Fairmq(to));
        }
        // Run-control names mean nothing to a device.
        assert!(matches!(
            m.begin("RUNNING", "START"),
            Err(Rejection::UnknownEvent(_))
        ));
        assert_eq!(m.begin("RUNNING", "BIND").unwrap().to, None);
        assert!(!m.is_final());
    }
}

//! FairMQ devices: their state machine, the mapping to run-control states, and the multi-step
//! sequences that one run-control event becomes. Pure: no I/O, unit-tested here.
//!
//! A FairMQ device does not know CONFIGURE: it walks IDLE -INIT DEVICE-> INITIALIZING DEVICE
//! -COMPLETE INIT-> INITIALIZED -BIND-> BOUND -CONNECT-> DEVICE READY -INIT TASK-> READY, and
//! back with RESET TASK and RESET DEVICE. A step that leaves the device where it was ("stuck")
//! is rolled back (RESET DEVICE during CONFIGURE, INIT TASK during RESET), as the anchor does.

use std::fmt;
use std::str::FromStr;

use crate::state::{Event, State};

/// A FairMQ device state, with the exact names the device reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FmqState {
    Ok,
    Error,
    Idle,
    InitializingDevice,
    Initialized,
    Binding,
    Bound,
    Connecting,
    DeviceReady,
    InitializingTask,
    Ready,
    Running,
    ResettingTask,
    ResettingDevice,
    Exiting,
}

impl FmqState {
    pub const ALL: [FmqState; 15] = [
        FmqState::Ok,
        FmqState::Error,
        FmqState::Idle,
        FmqState::InitializingDevice,
        FmqState::Initialized,
        FmqState::Binding,
        FmqState::Bound,
        FmqState::Connecting,
        FmqState::DeviceReady,
        FmqState::InitializingTask,
        FmqState::Ready,
        FmqState::Running,
        FmqState::ResettingTask,
        FmqState::ResettingDevice,
        FmqState::Exiting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FmqState::Ok => "OK",
            FmqState::Error => "ERROR",
            FmqState::Idle => "IDLE",
            FmqState::InitializingDevice => "INITIALIZING DEVICE",
            FmqState::Initialized => "INITIALIZED",
            FmqState::Binding => "BINDING",
            FmqState::Bound => "BOUND",
            FmqState::Connecting => "CONNECTING",
            FmqState::DeviceReady => "DEVICE READY",
            FmqState::InitializingTask => "INITIALIZING TASK",
            FmqState::Ready => "READY",
            FmqState::Running => "RUNNING",
            FmqState::ResettingTask => "RESETTING TASK",
            FmqState::ResettingDevice => "RESETTING DEVICE",
            FmqState::Exiting => "EXITING",
        }
    }

    /// States the device passes through on its own (the plugin waits past them).
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            FmqState::Binding
                | FmqState::Connecting
                | FmqState::InitializingTask
                | FmqState::ResettingTask
                | FmqState::ResettingDevice
        )
    }

    /// The run-control state this device state stands for (None: a state between two).
    pub fn to_state(self) -> Option<State> {
        match self {
            FmqState::Idle => Some(State::Standby),
            FmqState::Ready => Some(State::Configured),
            FmqState::Running => Some(State::Running),
            FmqState::Error => Some(State::Error),
            FmqState::Exiting => Some(State::Done),
            _ => None,
        }
    }

    /// The device state a run-control state corresponds to.
    pub fn from_state(s: State) -> Option<FmqState> {
        match s {
            State::Standby => Some(FmqState::Idle),
            State::Configured => Some(FmqState::Ready),
            State::Running => Some(FmqState::Running),
            State::Error => Some(FmqState::Error),
            State::Done => Some(FmqState::Exiting),
            State::Deploying | State::Mixed => None,
        }
    }
}

/// A FairMQ device event (a "transition" in FairMQ's words), with the exact names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FmqEvent {
    InitDevice,
    CompleteInit,
    Bind,
    Connect,
    InitTask,
    Run,
    Stop,
    ResetTask,
    ResetDevice,
    End,
    ErrorFound,
}

impl FmqEvent {
    pub const ALL: [FmqEvent; 11] = [
        FmqEvent::InitDevice,
        FmqEvent::CompleteInit,
        FmqEvent::Bind,
        FmqEvent::Connect,
        FmqEvent::InitTask,
        FmqEvent::Run,
        FmqEvent::Stop,
        FmqEvent::ResetTask,
        FmqEvent::ResetDevice,
        FmqEvent::End,
        FmqEvent::ErrorFound,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FmqEvent::InitDevice => "INIT DEVICE",
            FmqEvent::CompleteInit => "COMPLETE INIT",
            FmqEvent::Bind => "BIND",
            FmqEvent::Connect => "CONNECT",
            FmqEvent::InitTask => "INIT TASK",
            FmqEvent::Run => "RUN",
            FmqEvent::Stop => "STOP",
            FmqEvent::ResetTask => "RESET TASK",
            FmqEvent::ResetDevice => "RESET DEVICE",
            FmqEvent::End => "END",
            FmqEvent::ErrorFound => "ERROR FOUND",
        }
    }

    /// The device's own table: from `from`, this event passes through an optional transient
    /// state and settles in the returned state. None: the device refuses it there.
    pub fn apply(self, from: FmqState) -> Option<(Option<FmqState>, FmqState)> {
        use FmqEvent as E;
        use FmqState as S;
        Some(match (from, self) {
            (S::Idle, E::InitDevice) => (None, S::InitializingDevice),
            (S::InitializingDevice, E::CompleteInit) => (None, S::Initialized),
            (S::Initialized, E::Bind) => (Some(S::Binding), S::Bound),
            (S::Bound, E::Connect) => (Some(S::Connecting), S::DeviceReady),
            (S::DeviceReady, E::InitTask) => (Some(S::InitializingTask), S::Ready),
            (S::Ready, E::Run) => (None, S::Running),
            (S::Running, E::Stop) => (None, S::Ready),
            (S::Ready, E::ResetTask) => (Some(S::ResettingTask), S::DeviceReady),
            (S::Initialized | S::Bound | S::DeviceReady, E::ResetDevice) => {
                (Some(S::ResettingDevice), S::Idle)
            }
            (S::Idle | S::Error, E::End) => (None, S::Exiting),
            (S::Exiting, _) => return None,
            (_, E::ErrorFound) => (None, S::Error),
            _ => return None,
        })
    }
}

/// Names compare ignoring case and the separator (`INIT DEVICE`, `init_device`, `Init-Device`).
fn norm(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '_' | '-' => ' ',
            c => c.to_ascii_uppercase(),
        })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown FairMQ {kind} {value:?}")]
pub struct FmqParseError {
    kind: &'static str,
    value: String,
}

impl FromStr for FmqState {
    type Err = FmqParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let n = norm(s);
        FmqState::ALL
            .into_iter()
            .find(|st| st.as_str() == n)
            .ok_or_else(|| FmqParseError {
                kind: "state",
                value: s.to_string(),
            })
    }
}

impl FromStr for FmqEvent {
    type Err = FmqParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let n = norm(s);
        FmqEvent::ALL
            .into_iter()
            .find(|e| e.as_str() == n)
            .ok_or_else(|| FmqParseError {
                kind: "event",
                value: s.to_string(),
            })
    }
}

impl fmt::Display for FmqState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for FmqEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One request of a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub event: FmqEvent,
    /// The state the request names as its source (`srcState`).
    pub from: FmqState,
    /// The state the device must report for the step to count as done.
    pub expect: FmqState,
    /// Whether the run-control event's arguments travel with this step.
    pub with_args: bool,
    /// When the device replies still in `from`: the event that rolls it back.
    pub on_stuck: Option<FmqEvent>,
}

impl Step {
    const fn new(event: FmqEvent, from: FmqState, expect: FmqState) -> Self {
        Step {
            event,
            from,
            expect,
            with_args: false,
            on_stuck: None,
        }
    }
    const fn args(mut self) -> Self {
        self.with_args = true;
        self
    }
    const fn stuck(mut self, rollback: FmqEvent) -> Self {
        self.on_stuck = Some(rollback);
        self
    }

    /// The rollback request for a device stuck in `self.from`, if this step has one.
    pub fn rollback(&self) -> Option<Step> {
        let ev = self.on_stuck?;
        let (_, to) = ev.apply(self.from)?;
        Some(Step::new(ev, self.from, to))
    }
}

use FmqEvent as E;
use FmqState as S;

const CONFIGURE: [Step; 5] = [
    Step::new(E::InitDevice, S::Idle, S::InitializingDevice).args(),
    Step::new(E::CompleteInit, S::InitializingDevice, S::Initialized),
    Step::new(E::Bind, S::Initialized, S::Bound).stuck(E::ResetDevice),
    Step::new(E::Connect, S::Bound, S::DeviceReady).stuck(E::ResetDevice),
    Step::new(E::InitTask, S::DeviceReady, S::Ready).stuck(E::ResetDevice),
];

const RESET: [Step; 2] = [
    Step::new(E::ResetTask, S::Ready, S::DeviceReady),
    Step::new(E::ResetDevice, S::DeviceReady, S::Idle).stuck(E::InitTask),
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error(
        "FairMQ devices cannot {event}: the device state machine has no way out of ERROR but END (EXIT)"
    )]
    Unsupported { event: Event },
    #[error("{event} does not apply to a FairMQ device in state {from}")]
    NotFrom { event: Event, from: FmqState },
}

/// The requests that carry a device in `current` through `event`, in order.
///
/// A sequence may be resumed from a state part-way along it (CONFIGURE from BOUND sends only
/// CONNECT and INIT TASK); an event whose target the device is already in plans nothing.
pub fn plan(event: Event, current: FmqState) -> Result<Vec<Step>, PlanError> {
    let not_from = || PlanError::NotFrom {
        event,
        from: current,
    };
    let suffix = |seq: &[Step], done: FmqState| -> Result<Vec<Step>, PlanError> {
        if current == done {
            return Ok(Vec::new());
        }
        seq.iter()
            .position(|s| s.from == current)
            .map(|i| seq[i..].to_vec())
            .ok_or_else(not_from)
    };
    match event {
        Event::Configure => suffix(&CONFIGURE, S::Ready),
        Event::Reset => suffix(&RESET, S::Idle),
        Event::Start => suffix(
            &[Step::new(E::Run, S::Ready, S::Running).args()],
            S::Running,
        ),
        Event::Stop => suffix(&[Step::new(E::Stop, S::Running, S::Ready)], S::Ready),
        Event::Exit => {
            let end = |from| Step::new(E::End, from, S::Exiting);
            match current {
                S::Exiting => Ok(Vec::new()),
                S::Idle | S::Error => Ok(vec![end(current)]),
                S::Ready | S::DeviceReady => {
                    let mut steps = suffix(&RESET, S::Idle)?;
                    steps.push(end(S::Idle));
                    Ok(steps)
                }
                _ => Err(not_from()),
            }
        }
        Event::Recover | Event::GoError => Err(PlanError::Unsupported { event }),
    }
}

/// What a step's reply means for the sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Reached `expect` with ok: go on.
    Advance,
    /// The device did not move: send this rollback step, then report the failure.
    RollBack(Step),
    /// Anything else (ERROR, an unexpected state, ok=false): the sequence fails here.
    Fail,
}

pub fn judge(step: &Step, reached: FmqState, ok: bool) -> Verdict {
    if ok && reached == step.expect {
        return Verdict::Advance;
    }
    if reached == step.from
        && let Some(rb) = step.rollback()
    {
        return Verdict::RollBack(rb);
    }
    Verdict::Fail
}

/// The arguments FairMQ tasks get in addition to their own: the control port, the plugin
/// search path and name (OCClite), and the device id (the anchor adds the same).
pub fn fairmq_launch_args(task_id: &str, control_port: u16, plugin_dir: &str) -> Vec<String> {
    let dir = plugin_dir.trim_end_matches('/');
    vec![
        "--control-port".into(),
        control_port.to_string(),
        "-S".into(),
        format!("{dir}/lib/"),
        "-P".into(),
        "OCClite".into(),
        "--id".into(),
        task_id.to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(steps: &[Step]) -> Vec<&'static str> {
        steps.iter().map(|s| s.event.as_str()).collect()
    }

    #[test]
    fn configure_is_five_steps_with_arguments_on_the_first() {
        let p = plan(Event::Configure, FmqState::Idle).unwrap();
        assert_eq!(
            events(&p),
            [
                "INIT DEVICE",
                "COMPLETE INIT",
                "BIND",
                "CONNECT",
                "INIT TASK"
            ]
        );
        assert!(p[0].with_args);
        assert!(p[1..].iter().all(|s| !s.with_args));
        // Every step starts where the previous one settles, per the device's own table.
        let mut at = FmqState::Idle;
        for s in &p {
            assert_eq!(s.from, at);
            assert_eq!(s.event.apply(at).map(|(_, to)| to), Some(s.expect));
            at = s.expect;
        }
        assert_eq!(at.to_state(), Some(State::Configured));
    }

    #[test]
    fn sequences_resume_part_way_and_skip_when_done() {
        let p = plan(Event::Configure, FmqState::Bound).unwrap();
        assert_eq!(events(&p), ["CONNECT", "INIT TASK"]);
        assert!(plan(Event::Configure, FmqState::Ready).unwrap().is_empty());
        assert_eq!(
            plan(Event::Configure, FmqState::Running),
            Err(PlanError::NotFrom {
                event: Event::Configure,
                from: FmqState::Running
            })
        );
    }

    #[test]
    fn reset_start_stop_exit() {
        assert_eq!(
            events(&plan(Event::Reset, FmqState::Ready).unwrap()),
            ["RESET TASK", "RESET DEVICE"]
        );
        let start = plan(Event::Start, FmqState::Ready).unwrap();
        assert_eq!(events(&start), ["RUN"]);
        assert!(start[0].with_args);
        assert_eq!(
            events(&plan(Event::Stop, FmqState::Running).unwrap()),
            ["STOP"]
        );
        assert_eq!(events(&plan(Event::Exit, FmqState::Idle).unwrap()), ["END"]);
        assert_eq!(
            events(&plan(Event::Exit, FmqState::Ready).unwrap()),
            ["RESET TASK", "RESET DEVICE", "END"]
        );
        assert_eq!(
            events(&plan(Event::Exit, FmqState::Error).unwrap()),
            ["END"]
        );
        assert!(plan(Event::Start, FmqState::Idle).is_err());
        assert_eq!(
            plan(Event::Recover, FmqState::Error),
            Err(PlanError::Unsupported {
                event: Event::Recover
            })
        );
    }

    #[test]
    fn stuck_steps_roll_back_and_errors_fail() {
        let p = plan(Event::Configure, FmqState::Idle).unwrap();
        let bind = p[2];
        assert_eq!(judge(&bind, FmqState::Bound, true), Verdict::Advance);
        match judge(&bind, FmqState::Initialized, false) {
            Verdict::RollBack(rb) => {
                assert_eq!(rb.event, FmqEvent::ResetDevice);
                assert_eq!(rb.from, FmqState::Initialized);
                assert_eq!(rb.expect, FmqState::Idle);
            }
            v => panic!("expected a rollback, got {v:?}"),
        }
        assert_eq!(judge(&bind, FmqState::Error, false), Verdict::Fail);
        // ok=false is never taken as success, even in the expected state.
        assert_eq!(judge(&bind, FmqState::Bound, false), Verdict::Fail);
        // INIT DEVICE has no rollback: a device still IDLE simply fails the step.
        assert_eq!(judge(&p[0], FmqState::Idle, false), Verdict::Fail);
        let reset = plan(Event::Reset, FmqState::Ready).unwrap();
        match judge(&reset[1], FmqState::DeviceReady, false) {
            Verdict::RollBack(rb) => assert_eq!(rb.expect, FmqState::Ready),
            v => panic!("expected a rollback, got {v:?}"),
        }
    }

    #[test]
    fn state_mapping_round_trips_and_names_parse() {
        for s in [
            State::Standby,
            State::Configured,
            State::Running,
            State::Error,
            State::Done,
        ] {
            assert_eq!(
                FmqState::from_state(s).and_then(FmqState::to_state),
                Some(s)
            );
        }
        assert_eq!(FmqState::from_state(State::Standby), Some(FmqState::Idle));
        assert_eq!(FmqState::from_state(State::Done), Some(FmqState::Exiting));
        assert_eq!(FmqState::DeviceReady.to_state(), None);
        for s in FmqState::ALL {
            assert_eq!(s.as_str().parse::<FmqState>(), Ok(s));
        }
        for e in FmqEvent::ALL {
            assert_eq!(e.as_str().parse::<FmqEvent>(), Ok(e));
        }
        assert_eq!("init_task".parse::<FmqEvent>(), Ok(FmqEvent::InitTask));
        assert!("CONFIGURE".parse::<FmqEvent>().is_err());
    }

    #[test]
    fn launch_args_name_port_plugin_and_id() {
        assert_eq!(
            fairmq_launch_args("stfb-1", 47101, "/opt/o2/"),
            [
                "--control-port",
                "47101",
                "-S",
                "/opt/o2/lib/",
                "-P",
                "OCClite",
                "--id",
                "stfb-1"
            ]
        );
    }
}

//! What a task simulator is told: protocol mode, delays and injected failures. Pure parsing.
//!
//! Event names in `--delay`, `--fail-on`, `--crash-on`, `--hang-on` and `--stuck-on` are
//! run-control events (`CONFIGURE`, `START`, ...) or FairMQ steps (`INIT DEVICE`, `BIND`,
//! ...). In fairmq mode a run-control event designates the step that completes it
//! (CONFIGURE = INIT TASK, START = RUN, STOP = STOP, RESET = RESET DEVICE, EXIT = END); a
//! FairMQ step name never matches in direct mode.
//!
//! A fault file (`--fault-file`, read by the server at every transition request) switches
//! more of these failures on and off at runtime: [`Faults::parse`].

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::control::fairmq::FmqEvent;
use crate::state::{Event, State};

/// Which state machine and wire variant the simulator plays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SimMode {
    /// OCC-library task: run-control states and events, protobuf.
    #[default]
    Direct,
    /// FairMQ device with the OCClite plugin: device states and steps (answers JSON and protobuf).
    Fairmq,
}

impl fmt::Display for SimMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SimMode::Direct => "direct",
            SimMode::Fairmq => "fairmq",
        })
    }
}

/// An event name as the options give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKey {
    Run(Event),
    Step(FmqEvent),
}

impl EventKey {
    /// Whether this key designates a request for `requested` in `mode`.
    pub fn matches(self, mode: SimMode, requested: Requested) -> bool {
        match (mode, self, requested) {
            (SimMode::Direct, EventKey::Run(k), Requested::Run(e)) => k == e,
            (SimMode::Fairmq, EventKey::Step(k), Requested::Step(e)) => k == e,
            (SimMode::Fairmq, EventKey::Run(k), Requested::Step(e)) => {
                completing_step(k) == Some(e)
            }
            _ => false,
        }
    }
}

/// The request a simulator received, in its mode's vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requested {
    Run(Event),
    Step(FmqEvent),
}

/// The FairMQ step that completes a run-control event.
pub fn completing_step(e: Event) -> Option<FmqEvent> {
    match e {
        Event::Configure => Some(FmqEvent::InitTask),
        Event::Start => Some(FmqEvent::Run),
        Event::Stop => Some(FmqEvent::Stop),
        Event::Reset => Some(FmqEvent::ResetDevice),
        Event::Exit => Some(FmqEvent::End),
        Event::Recover | Event::GoError => None,
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "{option}: unknown event {value:?} (a run-control event such as CONFIGURE, or a FairMQ step such as \"INIT DEVICE\")"
    )]
    UnknownEvent { option: &'static str, value: String },
    #[error("{option}: invalid duration {value:?} (expected e.g. 200ms, 2s, 1.5s, 0)")]
    BadDuration { option: &'static str, value: String },
    #[error(
        "--fail-in: {value:?} is not STATE=DURATION with STATE one of STANDBY, CONFIGURED, RUNNING (e.g. RUNNING=2s)"
    )]
    BadFailIn { value: String },
}

impl EventKey {
    fn parse(option: &'static str, s: &str) -> Result<EventKey, ConfigError> {
        let s = s.trim();
        if let Ok(e) = Event::from_str(s) {
            return Ok(EventKey::Run(e));
        }
        FmqEvent::from_str(s)
            .map(EventKey::Step)
            .map_err(|_| ConfigError::UnknownEvent {
                option,
                value: s.to_string(),
            })
    }
}

/// `200ms`, `2s`, `1.5s`, `500us`, `1m`, or a bare `0`.
pub fn parse_duration(option: &'static str, s: &str) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::BadDuration {
        option,
        value: s.to_string(),
    };
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t.find(|c: char| c.is_ascii_alphabetic()).ok_or_else(bad)?;
    let (num, unit) = t.split_at(split);
    let n: f64 = num.trim().parse().map_err(|_| bad())?;
    let secs = match unit {
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(bad()),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(bad());
    }
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// Delays, failures and protocol mode of one simulator.
#[derive(Clone, Debug, Default)]
pub struct SimConfig {
    pub mode: SimMode,
    pub default_delay: Duration,
    pub delays: HashMap<EventKey, Duration>,
    /// Reply ok=false and go to ERROR.
    pub fail_on: Vec<EventKey>,
    /// Exit the process (non-zero) on receipt, never replying.
    pub crash_on: Vec<EventKey>,
    /// Never reply.
    pub hang_on: Vec<EventKey>,
    /// Reply ok=false and stay in the source state (FairMQ: the client must roll back).
    pub stuck_on: Vec<EventKey>,
    /// Move to ERROR by itself this long after reaching this run-control state (a failure
    /// between transitions, unprompted; in fairmq mode the device then exits, as a real one).
    pub fail_in: Vec<(State, Duration)>,
    /// Read at every transition request for faults switched on at runtime ([`Faults`]).
    pub fault_file: Option<PathBuf>,
}

/// Failures switched on at runtime by a fault file, applied on top of a [`SimConfig`]'s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    pub fail_on: Vec<EventKey>,
    pub crash_on: Vec<EventKey>,
    pub hang_on: Vec<EventKey>,
    pub stuck_on: Vec<EventKey>,
}

/// A fault file's first bad line (1-based) and what is wrong with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {message}")]
pub struct FaultFileError {
    pub line: usize,
    pub message: String,
}

impl Faults {
    /// A fault file's text: lines `fail-on=EVENT`, `stuck-on=EVENT`, `hang-on=EVENT`,
    /// `crash-on=EVENT` (EVENT as the options take it), `#` comments and blank lines.
    pub fn parse(text: &str) -> Result<Faults, FaultFileError> {
        let mut f = Faults::default();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let bad = |message: String| FaultFileError {
                line: i + 1,
                message,
            };
            let (kind, event) = line
                .split_once('=')
                .ok_or_else(|| bad(format!("{line:?} is not KIND=EVENT")))?;
            let (option, list) = match kind.trim() {
                "fail-on" => ("--fail-on", &mut f.fail_on),
                "crash-on" => ("--crash-on", &mut f.crash_on),
                "hang-on" => ("--hang-on", &mut f.hang_on),
                "stuck-on" => ("--stuck-on", &mut f.stuck_on),
                other => {
                    return Err(bad(format!(
                        "unknown fault {other:?} (one of fail-on, crash-on, hang-on, stuck-on)"
                    )));
                }
            };
            list.push(EventKey::parse(option, event).map_err(|e| bad(e.to_string()))?);
        }
        Ok(f)
    }

    pub fn is_empty(&self) -> bool {
        self.fail_on.is_empty()
            && self.crash_on.is_empty()
            && self.hang_on.is_empty()
            && self.stuck_on.is_empty()
    }
}

/// What to do with one received request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Succeed,
    Fail,
    Crash,
    Hang,
    Stick,
}

impl SimConfig {
    /// Builds a config from option values (`--delay 50ms --delay CONFIGURE=200ms`, ...).
    pub fn parse(
        mode: SimMode,
        delays: &[String],
        fail_on: &[String],
        crash_on: &[String],
        hang_on: &[String],
        stuck_on: &[String],
    ) -> Result<SimConfig, ConfigError> {
        let mut c = SimConfig {
            mode,
            ..SimConfig::default()
        };
        for d in delays.iter().filter(|d| !d.trim().is_empty()) {
            match d.split_once('=') {
                Some((k, v)) => {
                    let key = EventKey::parse("--delay", k)?;
                    c.delays.insert(key, parse_duration("--delay", v)?);
                }
                None => c.default_delay = parse_duration("--delay", d)?,
            }
        }
        let keys = |option: &'static str, vals: &[String]| -> Result<Vec<EventKey>, ConfigError> {
            vals.iter()
                .filter(|v| !v.trim().is_empty())
                .map(|v| EventKey::parse(option, v))
                .collect()
        };
        c.fail_on = keys("--fail-on", fail_on)?;
        c.crash_on = keys("--crash-on", crash_on)?;
        c.hang_on = keys("--hang-on", hang_on)?;
        c.stuck_on = keys("--stuck-on", stuck_on)?;
        Ok(c)
    }

    /// Adds `--fail-in STATE=DURATION` values (e.g. `RUNNING=2s`).
    pub fn with_fail_in(mut self, values: &[String]) -> Result<SimConfig, ConfigError> {
        for v in values.iter().filter(|v| !v.trim().is_empty()) {
            let bad = || ConfigError::BadFailIn {
                value: v.to_string(),
            };
            let (state, after) = v.split_once('=').ok_or_else(bad)?;
            let state = State::from_str(state.trim())
                .ok()
                .filter(|s| matches!(s, State::Standby | State::Configured | State::Running))
                .ok_or_else(bad)?;
            self.fail_in
                .push((state, parse_duration("--fail-in", after)?));
        }
        Ok(self)
    }

    /// How long after reaching `state` the simulator fails by itself, if it does.
    pub fn fails_in(&self, state: State) -> Option<Duration> {
        self.fail_in
            .iter()
            .find(|(s, _)| *s == state)
            .map(|(_, d)| *d)
    }

    pub fn delay_for(&self, req: Requested) -> Duration {
        // A key naming exactly this request wins over a run-control event designating it.
        let exact = match req {
            Requested::Run(e) => EventKey::Run(e),
            Requested::Step(e) => EventKey::Step(e),
        };
        if exact.matches(self.mode, req)
            && let Some(d) = self.delays.get(&exact)
        {
            return *d;
        }
        self.delays
            .iter()
            .find(|(k, _)| k.matches(self.mode, req))
            .map(|(_, d)| *d)
            .unwrap_or(self.default_delay)
    }

    pub fn fate(&self, req: Requested) -> Fate {
        self.fate_with(req, &Faults::default())
    }

    /// The fate with `extra` faults (a fault file's) on top of this config's.
    pub fn fate_with(&self, req: Requested, extra: &Faults) -> Fate {
        let hit = |own: &[EventKey], more: &[EventKey]| {
            own.iter().chain(more).any(|k| k.matches(self.mode, req))
        };
        if hit(&self.crash_on, &extra.crash_on) {
            Fate::Crash
        } else if hit(&self.hang_on, &extra.hang_on) {
            Fate::Hang
        } else if hit(&self.fail_on, &extra.fail_on) {
            Fate::Fail
        } else if hit(&self.stuck_on, &extra.stuck_on) {
            Fate::Stick
        } else {
            Fate::Succeed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("x", "200ms").unwrap(),
            Duration::from_millis(200)
        );
        assert_eq!(
            parse_duration("x", "1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("x", "0").unwrap(), Duration::ZERO);
        assert_eq!(
            parse_duration("x", "250us").unwrap(),
            Duration::from_micros(250)
        );
        assert!(parse_duration("x", "200").is_err());
        assert!(parse_duration("x", "-1s").is_err());
        assert!(parse_duration("x", "fast").is_err());
    }

    #[test]
    fn delays_default_and_per_event() {
        let c = SimConfig::parse(
            SimMode::Fairmq,
            &s(&["10ms", "CONFIGURE=200ms", "BIND=30ms"]),
            &[],
            &[],
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(
            c.delay_for(Requested::Step(FmqEvent::InitTask)),
            Duration::from_millis(200)
        );
        assert_eq!(
            c.delay_for(Requested::Step(FmqEvent::Bind)),
            Duration::from_millis(30)
        );
        assert_eq!(
            c.delay_for(Requested::Step(FmqEvent::InitDevice)),
            Duration::from_millis(10)
        );
        let d =
            SimConfig::parse(SimMode::Direct, &s(&["CONFIGURE=1s"]), &[], &[], &[], &[]).unwrap();
        assert_eq!(
            d.delay_for(Requested::Run(Event::Configure)),
            Duration::from_secs(1)
        );
        assert_eq!(d.delay_for(Requested::Run(Event::Start)), Duration::ZERO);
    }

    #[test]
    fn failures_match_by_mode() {
        let c = SimConfig::parse(
            SimMode::Fairmq,
            &[],
            &s(&["CONFIGURE"]),
            &s(&["start"]),
            &s(&["reset-device"]),
            &s(&["BIND"]),
        )
        .unwrap();
        assert_eq!(c.fate(Requested::Step(FmqEvent::InitTask)), Fate::Fail);
        assert_eq!(c.fate(Requested::Step(FmqEvent::InitDevice)), Fate::Succeed);
        assert_eq!(c.fate(Requested::Step(FmqEvent::Run)), Fate::Crash);
        assert_eq!(c.fate(Requested::Step(FmqEvent::ResetDevice)), Fate::Hang);
        assert_eq!(c.fate(Requested::Step(FmqEvent::Bind)), Fate::Stick);
        let d =
            SimConfig::parse(SimMode::Direct, &[], &s(&["BIND", "STOP"]), &[], &[], &[]).unwrap();
        assert_eq!(d.fate(Requested::Run(Event::Stop)), Fate::Fail);
        assert_eq!(d.fate(Requested::Run(Event::Configure)), Fate::Succeed);
    }

    #[test]
    fn bad_names_are_reported_with_the_option() {
        let e = SimConfig::parse(SimMode::Direct, &[], &s(&["LAUNCH"]), &[], &[], &[]).unwrap_err();
        assert_eq!(
            e,
            ConfigError::UnknownEvent {
                option: "--fail-on",
                value: "LAUNCH".into()
            }
        );
        assert!(
            SimConfig::parse(SimMode::Direct, &s(&["CONFIGURE=soon"]), &[], &[], &[], &[]).is_err()
        );
        let f = SimConfig::default()
            .with_fail_in(&s(&["RUNNING=2s", ""]))
            .unwrap();
        assert_eq!(f.fails_in(State::Running), Some(Duration::from_secs(2)));
        assert_eq!(f.fails_in(State::Configured), None);
        for bad in ["RUNNING", "ERROR=1s", "RUNNING=soon", "=1s"] {
            assert!(
                SimConfig::default().with_fail_in(&s(&[bad])).is_err(),
                "{bad}"
            );
        }
        // Empty values (an empty env var) are ignored.
        assert!(SimConfig::parse(SimMode::Direct, &s(&[""]), &s(&[""]), &[], &[], &[]).is_ok());
    }

    #[test]
    fn fault_files_add_failures() {
        let f = Faults::parse(
            "# switched on by the test\n\nfail-on=CONFIGURE\n  stuck-on = BIND # a step\nhang-on=start\ncrash-on=RESET DEVICE\n",
        )
        .unwrap();
        assert_eq!(f.fail_on, vec![EventKey::Run(Event::Configure)]);
        assert_eq!(f.stuck_on, vec![EventKey::Step(FmqEvent::Bind)]);
        assert_eq!(f.hang_on, vec![EventKey::Run(Event::Start)]);
        assert_eq!(f.crash_on, vec![EventKey::Step(FmqEvent::ResetDevice)]);
        assert!(Faults::parse("").unwrap().is_empty());
        assert!(Faults::parse("# nothing\n\n").unwrap().is_empty());

        let c = SimConfig {
            mode: SimMode::Fairmq,
            ..SimConfig::default()
        };
        let init_task = Requested::Step(FmqEvent::InitTask);
        assert_eq!(c.fate_with(init_task, &Faults::default()), Fate::Succeed);
        assert_eq!(c.fate_with(init_task, &f), Fate::Fail);
        assert_eq!(
            c.fate_with(Requested::Step(FmqEvent::Bind), &f),
            Fate::Stick
        );
        assert_eq!(c.fate_with(Requested::Step(FmqEvent::Run), &f), Fate::Hang);
        // The static config's faults still apply, with the same precedence.
        let crash =
            SimConfig::parse(SimMode::Fairmq, &[], &[], &s(&["CONFIGURE"]), &[], &[]).unwrap();
        assert_eq!(crash.fate_with(init_task, &f), Fate::Crash);
        assert_eq!(crash.fate_with(init_task, &Faults::default()), Fate::Crash);
    }

    #[test]
    fn bad_fault_file_lines_are_named() {
        for (text, line) in [
            ("fail-on=CONFIGURE\nfail-on=LAUNCH\n", 2),
            ("\n# c\nexplode-on=START", 3),
            ("fail-on", 1),
            ("fail-on=", 1),
        ] {
            assert_eq!(Faults::parse(text).unwrap_err().line, line, "{text:?}");
        }
        let e = Faults::parse("hang-on=LAUNCH").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("line 1: --hang-on: unknown event"),
            "{e}"
        );
    }
}

//! A requested transition with its own identity, and what was observed of it.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::state::{Event, State};

/// A transition requested by a client. The id makes each request distinct: the same event
/// asked twice is two transitions, and a status can say exactly which one it finished.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransitionRequest {
    pub id: String,
    pub event: Event,
    /// Run arguments (START: run number, run type, any key=value) passed to every task.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arguments: BTreeMap<String, String>,
}

impl TransitionRequest {
    pub fn target(&self) -> State {
        self.event.target()
    }

    /// The run number a START carries, in either spelling clients use (`run_number`, the
    /// processes' `runNumber`).
    pub fn run_number(&self) -> Option<&str> {
        (self.event == Event::Start)
            .then(|| run_number_in(&self.arguments))
            .flatten()
    }
}

/// The run number among transition arguments, in either spelling.
pub fn run_number_in(arguments: &BTreeMap<String, String>) -> Option<&str> {
    arguments
        .get("run_number")
        .or_else(|| arguments.get("runNumber"))
        .map(String::as_str)
}

/// The run variables an Environment keeps after `event` (None: unchanged), as the anchor
/// keeps them among its user variables: START begins a new run's, its arguments (the run
/// parameters: `run_number`, `run_type`, ...) with `run_start_time_ms` (given, else
/// `now_ms`); STOP adds its own arguments to the run's, with `run_end_time_ms` (given, else
/// `now_ms`).
pub fn run_variables(
    event: Event,
    arguments: &BTreeMap<String, String>,
    previous: &BTreeMap<String, String>,
    now_ms: i64,
) -> Option<BTreeMap<String, String>> {
    let (mut vars, time_key) = match event {
        Event::Start => (BTreeMap::new(), "run_start_time_ms"),
        Event::Stop => (previous.clone(), "run_end_time_ms"),
        _ => return None,
    };
    vars.extend(arguments.iter().map(|(k, v)| (k.clone(), v.clone())));
    vars.entry(time_key.to_string())
        .or_insert_with(|| now_ms.to_string());
    Some(vars)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TransitionPhase {
    Running,
    Succeeded,
    Failed,
}

/// What a controller observed of the transition named by `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransitionStatus {
    pub id: String,
    pub event: Event,
    pub phase: TransitionPhase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_run_keeps_its_start_and_end_among_its_variables() {
        let old = map(&[("run_number", "6"), ("run_end_time_ms", "5")]);
        let start = run_variables(Event::Start, &map(&[("run_number", "7")]), &old, 100).unwrap();
        assert_eq!(
            start,
            map(&[("run_number", "7"), ("run_start_time_ms", "100")])
        );
        let given = run_variables(
            Event::Start,
            &map(&[("run_start_time_ms", "90")]),
            &old,
            100,
        );
        assert_eq!(given.unwrap()["run_start_time_ms"], "90");
        let stop = run_variables(Event::Stop, &BTreeMap::new(), &start, 200).unwrap();
        assert_eq!(
            stop,
            map(&[
                ("run_number", "7"),
                ("run_start_time_ms", "100"),
                ("run_end_time_ms", "200")
            ])
        );
        assert_eq!(
            run_variables(Event::Reset, &BTreeMap::new(), &stop, 300),
            None
        );
        assert_eq!(
            run_variables(Event::Configure, &BTreeMap::new(), &stop, 300),
            None
        );
    }
}

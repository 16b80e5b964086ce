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

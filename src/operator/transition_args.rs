//! What each transition carries to a task process, as the anchor sends it (occ-wire.md, last
//! section). Pure.
//!
//! * CONFIGURE: the task's properties (`environment_id`, the class's `properties`) and its
//!   channel configuration (`chans.<name>.<i>.*`).
//! * START: `runNumber` (the key the real processes read), `cleanup`, and each run parameter
//!   that is set, twice: as written (snake_case) and in lowerCamelCase.
//! * STOP: the fill parameters and `run_end_time_ms`, both spellings; never a run number.
//!
//! The run parameters come from the transition's own arguments: what the caller gives with
//! START or STOP (the anchor's clients set them on the environment just before). Any other
//! argument the caller gives goes with its transition as it is.

use std::collections::BTreeMap;

use crate::plan::TaskRef;
use crate::state::Event;

/// Run parameters START carries when they are set (the anchor's StartActivityParameterKeys).
pub const START_KEYS: [&str; 13] = [
    "fill_info_fill_number",
    "fill_info_filling_scheme",
    "fill_info_beam_type",
    "fill_info_stable_beams_start_ms",
    "fill_info_stable_beams_end_ms",
    "run_number",
    "run_type",
    "run_start_time_ms",
    "run_end_time_ms",
    "lhc_period",
    "pdp_beam_type",
    "pdp_override_run_start_time",
    "original_run_number",
];

/// Run parameters STOP carries when they are set.
pub const STOP_KEYS: [&str; 6] = [
    "fill_info_fill_number",
    "fill_info_filling_scheme",
    "fill_info_beam_type",
    "fill_info_stable_beams_start_ms",
    "fill_info_stable_beams_end_ms",
    "run_end_time_ms",
];

/// The environment variable holding the FairMQ cleanup count START sends as `cleanup`.
const CLEANUP_VAR: &str = "__fmq_cleanup_count";

/// `fill_info_fill_number` -> `fillInfoFillNumber`.
pub fn lower_camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = !out.is_empty();
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The arguments of `event` for the task `task`, given the transition's own `given`.
pub fn arguments(
    event: Event,
    task: &TaskRef,
    given: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut rest = given.clone();
    match event {
        Event::Configure => {
            out.extend(task.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
            out.extend(
                task.channels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
        }
        Event::Start => {
            let run = crate::crd::run_number_in(given).unwrap_or("0").to_string();
            let cleanup = rest
                .remove("cleanup")
                .or_else(|| rest.remove(CLEANUP_VAR))
                .unwrap_or_else(|| "0".into());
            rest.remove("runNumber");
            out.insert("runNumber".into(), run);
            out.insert("cleanup".into(), cleanup);
            both_spellings(&mut out, &mut rest, &START_KEYS);
        }
        Event::Stop => {
            // A run number given with STOP stays out: STOP carries none.
            rest.remove("run_number");
            rest.remove("runNumber");
            both_spellings(&mut out, &mut rest, &STOP_KEYS);
        }
        _ => {}
    }
    out.extend(rest);
    out.into_iter().collect()
}

/// The STOP a GO_ERROR sends to a task still RUNNING: the STOP keys given, snake_case only,
/// as the anchor's forced STOP carries them.
pub fn go_error_stop(given: &BTreeMap<String, String>) -> Vec<(String, String)> {
    STOP_KEYS
        .iter()
        .filter_map(|k| {
            given
                .get(*k)
                .or_else(|| given.get(&lower_camel(k)))
                .map(|v| ((*k).to_string(), v.clone()))
        })
        .collect()
}

/// Moves each of `keys` set in `rest` (in either spelling) to `out`, in both spellings.
fn both_spellings(
    out: &mut BTreeMap<String, String>,
    rest: &mut BTreeMap<String, String>,
    keys: &[&str],
) {
    for key in keys {
        let camel = lower_camel(key);
        if let Some(v) = rest.remove(*key).or_else(|| rest.remove(&camel)) {
            out.insert(camel, v.clone());
            out.insert((*key).to_string(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn get<'a>(args: &'a [(String, String)], k: &str) -> Option<&'a str> {
        args.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn camel_case_as_the_anchor_spells_it() {
        assert_eq!(lower_camel("fill_info_fill_number"), "fillInfoFillNumber");
        assert_eq!(lower_camel("run_type"), "runType");
        assert_eq!(lower_camel("lhc_period"), "lhcPeriod");
        assert_eq!(
            lower_camel("pdp_override_run_start_time"),
            "pdpOverrideRunStartTime"
        );
    }

    #[test]
    fn start_carries_the_run_number_cleanup_and_run_parameters_twice() {
        let t = TaskRef::default();
        let a = arguments(
            Event::Start,
            &t,
            &given(&[("run_number", "7"), ("run_type", "PHYSICS"), ("k", "v")]),
        );
        assert_eq!(get(&a, "runNumber"), Some("7"));
        assert_eq!(get(&a, "run_number"), Some("7"));
        assert_eq!(get(&a, "cleanup"), Some("0"));
        assert_eq!(get(&a, "run_type"), Some("PHYSICS"));
        assert_eq!(get(&a, "runType"), Some("PHYSICS"));
        assert_eq!(get(&a, "k"), Some("v"));
        // Without a run number: 0, as the processes read a missing one.
        let a = arguments(Event::Start, &t, &BTreeMap::new());
        assert_eq!(get(&a, "runNumber"), Some("0"));
        assert_eq!(get(&a, "run_number"), None);
    }

    #[test]
    fn stop_carries_its_own_keys_and_no_run_number() {
        let t = TaskRef::default();
        let a = arguments(
            Event::Stop,
            &t,
            &given(&[
                ("run_number", "7"),
                ("fill_info_fill_number", "42"),
                ("run_end_time_ms", "99"),
            ]),
        );
        assert_eq!(get(&a, "runNumber"), None);
        assert_eq!(get(&a, "run_number"), None);
        assert_eq!(get(&a, "fillInfoFillNumber"), Some("42"));
        assert_eq!(get(&a, "fill_info_fill_number"), Some("42"));
        assert_eq!(get(&a, "runEndTimeMs"), Some("99"));
        assert!(arguments(Event::Stop, &t, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn go_error_stops_with_the_stop_keys_in_snake_case_only() {
        let a = go_error_stop(&given(&[
            ("runEndTimeMs", "5"),
            ("run_number", "7"),
            ("k", "v"),
        ]));
        assert_eq!(a, vec![("run_end_time_ms".to_string(), "5".to_string())]);
    }

    #[test]
    fn configure_carries_properties_and_channels() {
        let mut t = TaskRef::default();
        t.properties.insert("environment_id".into(), "E1".into());
        t.channels
            .insert("chans.data.0.address".into(), "tcp://*:5555".into());
        let a = arguments(Event::Configure, &t, &given(&[("extra", "1")]));
        assert_eq!(get(&a, "environment_id"), Some("E1"));
        assert_eq!(get(&a, "chans.data.0.address"), Some("tcp://*:5555"));
        assert_eq!(get(&a, "extra"), Some("1"));
        // Nothing of CONFIGURE goes with RESET.
        assert!(arguments(Event::Reset, &t, &BTreeMap::new()).is_empty());
    }
}

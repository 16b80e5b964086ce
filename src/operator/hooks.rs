//! Hook tasks (`controlMode: hook`): which moment of a transition starts each hook, which
//! moment waits for it, and what the transition may do next. Pure (no I/O, no Kubernetes).
//!
//! A transition E from S to T passes these moments, in order (the anchor's order):
//! `before_E`, `leave_S`, `E` (the tasks receive E), `enter_T`, `after_E`. Within one moment
//! a hook's weight (`before_E+10`, `after_E-1`) orders it; the tasks are weight 0 of `E`.
//! A hook starts at its `trigger` and the transition waits for it at its `await` (default:
//! the trigger). Steps run one after the other: everything triggered at a step starts, then
//! everything awaited at it must have ended before the next step.

use crate::state::{Event, State};

/// The five moments of a transition, in the order they happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Before,
    Leave,
    During,
    Enter,
    After,
}

/// A parsed `trigger` / `await` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moment {
    /// `before_E`, `E` (bare: alongside the tasks), `after_E`: E as written (`START_ACTIVITY`).
    Event {
        phase: Phase,
        event: String,
        weight: i64,
    },
    /// `leave_S`, `enter_S`.
    State {
        phase: Phase,
        state: String,
        weight: i64,
    },
    /// Environment teardown (not a transition).
    Destroy,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value:?}: {why}")]
pub struct MomentError {
    pub field: &'static str,
    pub value: String,
    pub why: &'static str,
}

/// Parses `before_CONFIGURE`, `after_START_ACTIVITY+100`, `enter_RUNNING`, `leave_STANDBY-5`,
/// `CONFIGURE`, `DESTROY`. `field` names the value in errors (`trigger`, `await`).
pub fn parse_moment(field: &'static str, value: &str) -> Result<Moment, MomentError> {
    let err = |why| MomentError {
        field,
        value: value.to_string(),
        why,
    };
    let v = value.trim();
    if v.is_empty() {
        return Err(err("empty"));
    }
    // A trailing +N / -N is the weight.
    let (name, weight) = match v.rfind(['+', '-']) {
        Some(i) => {
            let w: i64 = v[i..]
                .trim_start_matches('+')
                .parse()
                .map_err(|_| err("the weight after + or - is not an integer"))?;
            (&v[..i], w)
        }
        None => (v, 0),
    };
    if name == "DESTROY" {
        return Ok(Moment::Destroy);
    }
    let upper = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_uppercase() || c == '_');
    let event = |phase, e: &str| {
        upper(e)
            .then(|| Moment::Event {
                phase,
                event: e.to_string(),
                weight,
            })
            .ok_or_else(|| err("expected an upper-case event name"))
    };
    let state = |phase, s: &str| {
        upper(s)
            .then(|| Moment::State {
                phase,
                state: s.to_string(),
                weight,
            })
            .ok_or_else(|| err("expected an upper-case state name"))
    };
    if let Some(e) = name.strip_prefix("before_") {
        event(Phase::Before, e)
    } else if let Some(e) = name.strip_prefix("after_") {
        event(Phase::After, e)
    } else if let Some(s) = name.strip_prefix("enter_") {
        state(Phase::Enter, s)
    } else if let Some(s) = name.strip_prefix("leave_") {
        state(Phase::Leave, s)
    } else if upper(name) {
        event(Phase::During, name)
    } else {
        Err(err(
            "expected before_EVENT, after_EVENT, enter_STATE, leave_STATE, EVENT or DESTROY",
        ))
    }
}

/// True when the workflow's event name `name` designates `event` (the anchor says
/// `START_ACTIVITY`/`STOP_ACTIVITY` where we say START/STOP).
fn names_event(name: &str, event: Event) -> bool {
    name == event.as_str()
        || matches!(
            (name, event),
            ("START_ACTIVITY", Event::Start) | ("STOP_ACTIVITY", Event::Stop)
        )
}

/// Position of a moment within transition `event`, or None when `event` does not pass it.
/// `leave_S` matches when S is a state `event` applies from (GO_ERROR: none).
pub fn step_of(m: &Moment, event: Event) -> Option<Step> {
    match m {
        Moment::Event {
            phase,
            event: e,
            weight,
        } => names_event(e, event).then_some((*phase, *weight)),
        Moment::State {
            phase,
            state,
            weight,
        } => {
            let hit = match phase {
                Phase::Enter => event.target().as_str() == state,
                _ => event
                    .source()
                    .unwrap_or(&[])
                    .iter()
                    .any(|s: &State| s.as_str() == state),
            };
            hit.then_some((*phase, *weight))
        }
        Moment::Destroy => None,
    }
}

/// A position within a transition: the moment, then the weight.
pub type Step = (Phase, i64);

/// The step at which the tasks themselves receive the event and are waited for.
pub const TASKS_STEP: Step = (Phase::During, 0);

/// True when a hook with this trigger runs during transition `event`.
pub fn in_transition(trigger: &str, event: Event) -> bool {
    parse_moment("trigger", trigger)
        .ok()
        .and_then(|m| step_of(&m, event))
        .is_some()
}

/// Where one hook stands in the current transition (by its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    /// Not asked to run for this transition yet.
    Idle,
    /// Asked to run; its pod has not ended yet.
    Started,
    Succeeded,
    Failed(String),
}

#[derive(Debug, Clone)]
pub struct Hook<'a> {
    /// What it is, for messages: `hook task` or `call`.
    pub kind: &'a str,
    pub name: &'a str,
    pub trigger: &'a str,
    /// None: the trigger.
    pub await_: Option<&'a str>,
    pub critical: bool,
    pub run: Run,
}

/// Where the (non-hook) tasks stand in the transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tasks {
    Waiting(String),
    Succeeded,
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Waiting for the named hooks or the tasks.
    Running(String),
    /// Every step passed; failed non-critical hooks are listed as warnings.
    Succeeded {
        warnings: Vec<String>,
    },
    Failed(String),
}

/// What the environment controller does next in a transition with hooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    /// Indices (into the `hooks` given) of hooks to start now.
    pub start: Vec<usize>,
    /// The tasks may receive the event.
    pub release_tasks: bool,
    pub outcome: Outcome,
}

/// Walks the steps of transition `event` in order: starts what is triggered, stops at the
/// first step whose awaited hooks (or tasks) have not ended. A critical hook that failed
/// fails the transition (later steps never start); a non-critical one is a warning.
pub fn gate(event: Event, hooks: &[Hook], tasks: &Tasks) -> Gate {
    // (index, trigger step, await step) of the hooks in this transition; a hook whose await
    // is not a moment of the same transition at or after its trigger is a failed hook.
    let mut placed: Vec<(usize, Step, Step)> = Vec::new();
    let mut warnings = Vec::new();
    for (i, h) in hooks.iter().enumerate() {
        let Some(trig) = parse_moment("trigger", h.trigger)
            .ok()
            .and_then(|m| step_of(&m, event))
        else {
            continue;
        };
        let aw = match h.await_ {
            None => Some(trig),
            Some(a) => parse_moment("await", a)
                .ok()
                .and_then(|m| step_of(&m, event)),
        };
        match aw {
            Some(aw) if aw >= trig => placed.push((i, trig, aw)),
            _ => {
                let why = format!(
                    "{} {}: await {:?} is not a moment of {} at or after its trigger {:?}",
                    h.kind,
                    h.name,
                    h.await_.unwrap_or(""),
                    event.as_str(),
                    h.trigger
                );
                if h.critical {
                    return Gate {
                        start: Vec::new(),
                        release_tasks: false,
                        outcome: Outcome::Failed(why),
                    };
                }
                warnings.push(why);
            }
        }
    }
    let mut steps: Vec<Step> = placed
        .iter()
        .flat_map(|(_, t, a)| [*t, *a])
        .chain([TASKS_STEP])
        .collect();
    steps.sort();
    steps.dedup();

    let mut start = Vec::new();
    let mut release_tasks = false;
    for step in steps {
        for (i, _, _) in placed.iter().filter(|(_, t, _)| *t == step) {
            if hooks[*i].run == Run::Idle {
                start.push(*i);
            }
        }
        if step == TASKS_STEP {
            release_tasks = true;
        }
        let mut waiting: Vec<String> = Vec::new();
        for (i, _, _) in placed.iter().filter(|(_, _, a)| *a == step) {
            let h = &hooks[*i];
            match &h.run {
                Run::Idle | Run::Started => waiting.push(format!("{} {}", h.kind, h.name)),
                Run::Succeeded => {}
                Run::Failed(why) if h.critical => {
                    return Gate {
                        start,
                        release_tasks,
                        outcome: Outcome::Failed(format!("{} {}: {why}", h.kind, h.name)),
                    };
                }
                Run::Failed(why) => warnings.push(format!("{} {}: {why}", h.kind, h.name)),
            }
        }
        if step == TASKS_STEP {
            match tasks {
                Tasks::Waiting(msg) => waiting.push(msg.clone()),
                Tasks::Succeeded => {}
                Tasks::Failed(msg) => {
                    return Gate {
                        start,
                        release_tasks,
                        outcome: Outcome::Failed(msg.clone()),
                    };
                }
            }
        }
        if !waiting.is_empty() {
            return Gate {
                start,
                release_tasks,
                outcome: Outcome::Running(format!("waiting for {}", waiting.join(", "))),
            };
        }
    }
    Gate {
        start,
        release_tasks,
        outcome: Outcome::Succeeded { warnings },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook<'a>(name: &'a str, trigger: &'a str, await_: Option<&'a str>, run: Run) -> Hook<'a> {
        Hook {
            kind: "hook task",
            name,
            trigger,
            await_,
            critical: true,
            run,
        }
    }

    #[test]
    fn parses_the_anchor_syntax() {
        assert_eq!(
            parse_moment("trigger", "before_START_ACTIVITY+100"),
            Ok(Moment::Event {
                phase: Phase::Before,
                event: "START_ACTIVITY".into(),
                weight: 100
            })
        );
        assert_eq!(
            parse_moment("await", "after_CONFIGURE-1"),
            Ok(Moment::Event {
                phase: Phase::After,
                event: "CONFIGURE".into(),
                weight: -1
            })
        );
        assert_eq!(
            parse_moment("trigger", "leave_STANDBY"),
            Ok(Moment::State {
                phase: Phase::Leave,
                state: "STANDBY".into(),
                weight: 0
            })
        );
        assert_eq!(
            parse_moment("trigger", "CONFIGURE"),
            Ok(Moment::Event {
                phase: Phase::During,
                event: "CONFIGURE".into(),
                weight: 0
            })
        );
        assert_eq!(parse_moment("trigger", "DESTROY"), Ok(Moment::Destroy));
        for bad in [
            "",
            "before_",
            "before_CONFIGURE+x",
            "sometimes",
            "enter_running",
        ] {
            let e = parse_moment("trigger", bad).unwrap_err();
            assert_eq!(e.field, "trigger", "{bad}");
        }
    }

    #[test]
    fn moments_of_a_transition_are_ordered() {
        let at = |s: &str, e| step_of(&parse_moment("t", s).unwrap(), e);
        assert_eq!(
            at("before_START_ACTIVITY-50", Event::Start),
            Some((Phase::Before, -50))
        );
        assert_eq!(at("before_CONFIGURE", Event::Start), None);
        assert_eq!(
            at("leave_STANDBY", Event::Configure),
            Some((Phase::Leave, 0))
        );
        assert_eq!(at("enter_CONFIGURED", Event::Stop), Some((Phase::Enter, 0)));
        assert_eq!(at("enter_RUNNING", Event::Stop), None);
        assert_eq!(at("DESTROY", Event::Exit), None);
        assert!(
            at("before_CONFIGURE+5", Event::Configure) > at("before_CONFIGURE", Event::Configure)
        );
        assert!(
            at("leave_STANDBY-100", Event::Configure)
                > at("before_CONFIGURE+100", Event::Configure)
        );
        assert!(at("after_CONFIGURE-1", Event::Configure) > Some(TASKS_STEP));
        assert!(in_transition("after_STOP_ACTIVITY+100", Event::Stop));
        assert!(!in_transition("after_STOP_ACTIVITY+100", Event::Start));
    }

    #[test]
    fn before_hooks_run_first_and_gate_the_tasks() {
        let waiting = Tasks::Waiting("0/2 critical tasks done".into());
        let hooks = [hook("h", "before_CONFIGURE", None, Run::Idle)];
        let g = gate(Event::Configure, &hooks, &waiting);
        assert_eq!(g.start, vec![0]);
        assert!(!g.release_tasks);
        assert_eq!(
            g.outcome,
            Outcome::Running("waiting for hook task h".into())
        );
        let hooks = [hook("h", "before_CONFIGURE", None, Run::Started)];
        let g = gate(Event::Configure, &hooks, &waiting);
        assert!(g.start.is_empty() && !g.release_tasks);
        let hooks = [hook("h", "before_CONFIGURE", None, Run::Succeeded)];
        let g = gate(Event::Configure, &hooks, &waiting);
        assert!(g.release_tasks);
        assert_eq!(
            g.outcome,
            Outcome::Running("waiting for 0/2 critical tasks done".into())
        );
        let g = gate(Event::Configure, &hooks, &Tasks::Succeeded);
        assert_eq!(g.outcome, Outcome::Succeeded { warnings: vec![] });
        // A hook of another transition plays no part.
        let g = gate(Event::Start, &hooks, &Tasks::Succeeded);
        assert!(g.start.is_empty() && g.release_tasks);
    }

    #[test]
    fn weights_order_hooks_within_a_moment() {
        let hooks = [
            hook("late", "before_START_ACTIVITY+100", None, Run::Idle),
            hook("early", "before_START_ACTIVITY-200", None, Run::Idle),
        ];
        let g = gate(Event::Start, &hooks, &Tasks::Succeeded);
        assert_eq!(g.start, vec![1]);
        let hooks = [
            hook("late", "before_START_ACTIVITY+100", None, Run::Idle),
            hook("early", "before_START_ACTIVITY-200", None, Run::Succeeded),
        ];
        let g = gate(Event::Start, &hooks, &Tasks::Succeeded);
        assert_eq!(g.start, vec![0]);
        assert!(!g.release_tasks);
    }

    #[test]
    fn after_hooks_wait_for_the_tasks_and_parallel_hooks_start_with_them() {
        let hooks = [
            hook("after", "after_CONFIGURE", None, Run::Idle),
            hook(
                "pfr",
                "before_CONFIGURE",
                Some("after_CONFIGURE-1"),
                Run::Idle,
            ),
        ];
        let waiting = Tasks::Waiting("1/2 critical tasks done".into());
        let g = gate(Event::Configure, &hooks, &waiting);
        // pfr starts before the tasks and is not waited for before them.
        assert_eq!(g.start, vec![1]);
        assert!(g.release_tasks);
        assert_eq!(
            g.outcome,
            Outcome::Running("waiting for 1/2 critical tasks done".into())
        );
        // Tasks done: pfr (after_CONFIGURE-1) is awaited before the after hook starts.
        let hooks = [
            hook("after", "after_CONFIGURE", None, Run::Idle),
            hook(
                "pfr",
                "before_CONFIGURE",
                Some("after_CONFIGURE-1"),
                Run::Started,
            ),
        ];
        let g = gate(Event::Configure, &hooks, &Tasks::Succeeded);
        assert!(g.start.is_empty());
        assert_eq!(
            g.outcome,
            Outcome::Running("waiting for hook task pfr".into())
        );
        let hooks = [
            hook("after", "after_CONFIGURE", None, Run::Idle),
            hook(
                "pfr",
                "before_CONFIGURE",
                Some("after_CONFIGURE-1"),
                Run::Succeeded,
            ),
        ];
        let g = gate(Event::Configure, &hooks, &Tasks::Succeeded);
        assert_eq!(g.start, vec![0]);
    }

    #[test]
    fn critical_failures_fail_non_critical_ones_warn() {
        let mut hooks = [hook(
            "h",
            "before_CONFIGURE",
            None,
            Run::Failed("pod failed: exit code 1".into()),
        )];
        let g = gate(Event::Configure, &hooks, &Tasks::Waiting(String::new()));
        assert!(!g.release_tasks);
        assert_eq!(
            g.outcome,
            Outcome::Failed("hook task h: pod failed: exit code 1".into())
        );
        hooks[0].critical = false;
        let g = gate(Event::Configure, &hooks, &Tasks::Succeeded);
        assert!(g.release_tasks);
        assert_eq!(
            g.outcome,
            Outcome::Succeeded {
                warnings: vec!["hook task h: pod failed: exit code 1".into()]
            }
        );
        // The tasks' own failure fails the transition; later hooks never start.
        let hooks = [hook("after", "after_CONFIGURE", None, Run::Idle)];
        let g = gate(
            Event::Configure,
            &hooks,
            &Tasks::Failed("task a: boom".into()),
        );
        assert!(g.start.is_empty());
        assert_eq!(g.outcome, Outcome::Failed("task a: boom".into()));
    }

    #[test]
    fn an_await_before_its_trigger_or_outside_the_transition_is_a_failed_hook() {
        let hooks = [hook(
            "h",
            "after_CONFIGURE",
            Some("before_CONFIGURE"),
            Run::Idle,
        )];
        let g = gate(Event::Configure, &hooks, &Tasks::Succeeded);
        assert!(g.start.is_empty());
        let Outcome::Failed(msg) = g.outcome else {
            panic!("expected a failure")
        };
        assert!(
            msg.contains("hook task h: await \"before_CONFIGURE\""),
            "{msg}"
        );
        let mut hooks = [hook(
            "h",
            "before_CONFIGURE",
            Some("after_START"),
            Run::Idle,
        )];
        hooks[0].critical = false;
        let g = gate(Event::Configure, &hooks, &Tasks::Succeeded);
        assert!(g.start.is_empty() && g.release_tasks);
        assert!(matches!(g.outcome, Outcome::Succeeded { ref warnings } if warnings.len() == 1));
    }
}

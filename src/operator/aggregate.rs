//! Task states -> Environment status (state, counts, ready, failing tasks, transition). Pure.

use std::collections::BTreeMap;

use crate::crd::{FailingTask, Task, TransitionPhase, TransitionRequest, TransitionStatus};
use crate::plan::ControlMode;
use crate::state::{State, next};

/// Failing tasks listed in the status (all are counted).
pub const FAILING_LISTED: usize = 100;
/// Longest message of a listed failing task (bytes).
pub const FAILING_MESSAGE: usize = 512;

/// What the environment's tasks add up to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    pub state: State,
    pub counts: BTreeMap<State, u32>,
    pub ready: String,
    /// At most [`FAILING_LISTED`], critical first, messages bounded.
    pub failing_tasks: Vec<FailingTask>,
    /// How many are failing in all.
    pub failing_count: usize,
    /// How many of them are critical.
    pub failing_critical: usize,
    pub transition: Option<TransitionStatus>,
}

/// `tasks` are the environment's Task objects; `expected` is how many non-hook tasks it
/// should have (tasks not created yet count as DEPLOYING). Hook tasks (`controlMode: hook`)
/// only count when they failed: they are named in `failing_tasks` (a critical one makes the
/// environment ERROR); idle or running they decide nothing, and their transition is gated
/// by [`super::hooks::gate`], not here.
pub fn aggregate(
    desired: State,
    transition: Option<&TransitionRequest>,
    all: &[&Task],
    expected: usize,
) -> Aggregate {
    let is_hook = |t: &Task| t.spec.task.control_mode == ControlMode::Hook;
    let tasks: Vec<&Task> = all.iter().copied().filter(|t| !is_hook(t)).collect();
    let tasks = tasks.as_slice();
    let state_of = |t: &Task| {
        t.status
            .as_ref()
            .and_then(|s| s.state)
            .unwrap_or(State::Deploying)
    };
    let mut counts: BTreeMap<State, u32> = BTreeMap::new();
    for t in tasks {
        *counts.entry(state_of(t)).or_default() += 1;
    }
    let missing = expected.saturating_sub(tasks.len());
    if missing > 0 {
        *counts.entry(State::Deploying).or_default() += missing as u32;
    }
    let total = tasks.len().max(expected);
    let ready = format!("{}/{}", counts.get(&desired).copied().unwrap_or(0), total);

    // Failing: in ERROR; or, when the environment is split (MIXED), failed the transition
    // asked now: a task that answered its state again after being unreachable is out of
    // ERROR and still never took the step. A transition refused alike by every task (an
    // event that does not apply) splits nothing and names nobody: the tasks are sound.
    let failed_now = |t: &Task| {
        let req = transition?;
        t.status
            .as_ref()
            .and_then(|s| s.transition.as_ref())
            .filter(|tr| tr.id == req.id && tr.phase == TransitionPhase::Failed)
            .map(|tr| tr.message.clone())
    };
    let failing = |t: &Task, message: String| FailingTask {
        name: t.metadata.name.clone().unwrap_or_default(),
        node: t.spec.task.node.clone(),
        path: t.spec.task.path.clone(),
        critical: t.spec.task.critical,
        message,
    };
    let in_error = |t: &Task| state_of(t) == State::Error;
    let mut failing_tasks: Vec<FailingTask> = all
        .iter()
        .filter(|t| in_error(t))
        .map(|t| {
            let m = t.status.as_ref().and_then(|s| s.message.clone());
            failing(t, m.unwrap_or_default())
        })
        .collect();

    // Non-critical tasks in ERROR are named, but do not decide the environment's state.
    let mut deciding = tasks
        .iter()
        .map(|t| state_of(t))
        .filter(|s| *s != State::Error)
        .chain((missing > 0).then_some(State::Deploying));
    let consistent = match deciding.next() {
        None => desired,
        Some(first) if deciding.all(|s| s == first) => first,
        Some(_) => State::Mixed,
    };
    if consistent == State::Mixed {
        failing_tasks.extend(
            all.iter()
                .filter(|t| !in_error(t))
                .filter_map(|t| Some(failing(t, failed_now(t)?))),
        );
    }
    failing_tasks.sort_by(|a, b| (!a.critical, &a.name).cmp(&(!b.critical, &b.name)));
    let failing_count = failing_tasks.len();
    let failing_critical = failing_tasks.iter().filter(|f| f.critical).count();
    // The anchor's GO_ERROR puts the environment in ERROR whatever its tasks' states (those
    // still RUNNING are stopped, the others keep theirs), until another transition is asked.
    let go_error = transition.is_some_and(|t| t.event == crate::state::Event::GoError);
    let state = if failing_critical > 0 || go_error {
        State::Error
    } else {
        consistent
    };

    let transition = transition.map(|req| transition_status(req, tasks, missing));
    // Bounded: a mass failure still fits in one object (the state is decided above).
    failing_tasks.truncate(FAILING_LISTED);
    for f in &mut failing_tasks {
        if f.message.len() > FAILING_MESSAGE {
            f.message = format!("{}[...]", super::bounded::head(&f.message, FAILING_MESSAGE));
        }
    }
    Aggregate {
        state,
        counts,
        ready,
        failing_tasks,
        failing_count,
        failing_critical,
        transition,
    }
}

/// Succeeded once every critical task finished transition `req.id` and every other task is
/// done with it (a non-critical failure is a warning, reported with it); Failed as soon as one
/// critical task failed it, or is in ERROR without having acted on it while the event cannot
/// leave ERROR (a RECOVER waits for the ERROR tasks to act on it).
fn transition_status(req: &TransitionRequest, tasks: &[&Task], missing: usize) -> TransitionStatus {
    let critical: Vec<&&Task> = tasks.iter().filter(|t| t.spec.task.critical).collect();
    let of = |t: &Task| {
        t.status
            .as_ref()
            .and_then(|s| s.transition.as_ref())
            .filter(|tr| tr.id == req.id)
            .cloned()
    };
    // In ERROR without having acted on it, where the event cannot leave ERROR: it never will.
    let stuck = |t: &Task| {
        of(t).is_none()
            && t.status.as_ref().and_then(|s| s.state) == Some(State::Error)
            && next(State::Error, req.event).is_none()
    };
    // A non-critical task neither fails nor holds back the transition once it is done with
    // it, either way, so that its failure is reported with the outcome.
    let finished_or_stuck =
        |t: &Task| of(t).is_some_and(|tr| tr.phase != TransitionPhase::Running) || stuck(t);
    let failed = critical.iter().find_map(|t| {
        let st = t.status.as_ref();
        match of(t) {
            Some(tr) if tr.phase == TransitionPhase::Failed => Some((t, tr.message)),
            Some(_) => None,
            None if stuck(t) => Some((
                t,
                st.and_then(|s| s.message.clone())
                    .unwrap_or_else(|| "task in ERROR".into()),
            )),
            None => None,
        }
    });
    let (phase, message) = if let Some((t, msg)) = failed {
        let name = t.metadata.name.as_deref().unwrap_or("");
        (
            TransitionPhase::Failed,
            format!("task {name} (node {}): {msg}", t.spec.task.node),
        )
    } else if missing == 0
        && critical
            .iter()
            .all(|t| of(t).is_some_and(|tr| tr.phase == TransitionPhase::Succeeded))
        && tasks
            .iter()
            .filter(|t| !t.spec.task.critical)
            .all(|t| finished_or_stuck(t))
    {
        (TransitionPhase::Succeeded, String::new())
    } else {
        let done = critical.iter().filter(|t| of(t).is_some()).count();
        (
            TransitionPhase::Running,
            format!("{done}/{} critical tasks done", critical.len()),
        )
    };
    TransitionStatus {
        id: req.id.clone(),
        event: req.event,
        phase,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{TaskSpec, TaskStatus};
    use crate::plan::TaskRef;
    use crate::state::Event;

    fn task(
        name: &str,
        critical: bool,
        state: Option<State>,
        tr: Option<(&str, TransitionPhase, &str)>,
    ) -> Task {
        let tref = TaskRef {
            name: name.into(),
            node: "flp001".into(),
            path: format!("p.{name}"),
            critical,
            ..Default::default()
        };
        let mut t = Task::new(
            name,
            TaskSpec {
                environment: "e".into(),
                task: tref,
                transition: None,
            },
        );
        t.status = Some(TaskStatus {
            state,
            message: (state == Some(State::Error)).then(|| format!("{name} broke")),
            transition: tr.map(|(id, phase, m)| TransitionStatus {
                id: id.into(),
                event: Event::Configure,
                phase,
                message: m.into(),
            }),
            ..Default::default()
        });
        t
    }

    fn agg(
        tasks: &[Task],
        expected: usize,
        tr: Option<&TransitionRequest>,
        desired: State,
    ) -> Aggregate {
        let refs: Vec<&Task> = tasks.iter().collect();
        aggregate(desired, tr, &refs, expected)
    }

    /// The transition status `tasks` add up to for `req`.
    fn outcome(
        tasks: &[Task],
        expected: usize,
        req: &TransitionRequest,
        desired: State,
    ) -> (TransitionPhase, String) {
        let t = agg(tasks, expected, Some(req), desired)
            .transition
            .expect("a transition status");
        (t.phase, t.message)
    }

    fn configure(id: &str) -> TransitionRequest {
        TransitionRequest {
            id: id.into(),
            event: Event::Configure,
            arguments: Default::default(),
        }
    }

    #[test]
    fn go_error_puts_the_environment_in_error_whatever_its_tasks_say() {
        let go = TransitionRequest {
            id: "g".into(),
            event: Event::GoError,
            arguments: Default::default(),
        };
        let tasks = vec![
            task(
                "a",
                true,
                Some(State::Configured),
                Some(("g", TransitionPhase::Succeeded, "")),
            ),
            task(
                "b",
                true,
                Some(State::Configured),
                Some(("g", TransitionPhase::Succeeded, "")),
            ),
        ];
        let a = agg(&tasks, 2, Some(&go), State::Error);
        assert_eq!(a.state, State::Error);
        assert_eq!(a.failing_count, 0, "nobody failed: the shifter asked");
        // Another transition asked afterwards decides from the tasks again.
        let a = agg(&tasks, 2, Some(&configure("c")), State::Configured);
        assert_eq!(a.state, State::Configured);
    }

    #[test]
    fn a_mass_failure_still_fits_in_one_object() {
        let tasks: Vec<Task> = (0..2000)
            .map(|i| {
                let mut t = task(&format!("t{i:04}"), i % 2 == 0, Some(State::Error), None);
                t.status.as_mut().unwrap().message = Some("x".repeat(4096));
                t
            })
            .collect();
        let a = agg(&tasks, 2000, None, State::Running);
        assert_eq!(a.state, State::Error);
        assert_eq!(a.failing_count, 2000);
        assert_eq!(a.failing_critical, 1000);
        assert_eq!(a.failing_tasks.len(), FAILING_LISTED);
        assert!(
            a.failing_tasks
                .iter()
                .all(|f| f.critical && f.message.len() <= FAILING_MESSAGE + 5)
        );
        let bytes = serde_json::to_vec(&a.failing_tasks).unwrap().len();
        assert!(bytes < 128 * 1024, "{bytes} bytes");
    }

    #[test]
    fn equal_states_mixed_and_counts() {
        let s = Some(State::Standby);
        let tasks = [task("a", true, s, None), task("b", true, s, None)];
        let a = agg(&tasks, 2, None, State::Standby);
        assert_eq!((a.state, a.ready.as_str()), (State::Standby, "2/2"));
        let a = agg(&tasks, 3, None, State::Standby);
        assert_eq!((a.state, a.ready.as_str()), (State::Mixed, "2/3"));
        assert_eq!(
            a.counts,
            BTreeMap::from([(State::Deploying, 1), (State::Standby, 2)])
        );
        let tasks = [
            task("a", true, s, None),
            task("b", true, Some(State::Configured), None),
        ];
        assert_eq!(agg(&tasks, 2, None, State::Configured).state, State::Mixed);
    }

    #[test]
    fn critical_error_fails_environment_non_critical_does_not() {
        let s = Some(State::Standby);
        let tasks = [
            task("a", true, s, None),
            task("b", false, Some(State::Error), None),
        ];
        let a = agg(&tasks, 2, None, State::Standby);
        assert_eq!(a.state, State::Standby);
        assert_eq!(a.failing_tasks.len(), 1);
        assert!(!a.failing_tasks[0].critical);
        assert_eq!(a.failing_tasks[0].message, "b broke");
        let tasks = [
            task("a", true, Some(State::Error), None),
            task("b", false, Some(State::Error), None),
        ];
        let a = agg(&tasks, 2, None, State::Standby);
        assert_eq!(a.state, State::Error);
        assert_eq!(
            a.failing_tasks
                .iter()
                .map(|f| (f.name.as_str(), f.critical))
                .collect::<Vec<_>>(),
            [("a", true), ("b", false)]
        );
    }

    #[test]
    fn transition_phases() {
        use TransitionPhase::*;
        let c = Some(State::Configured);
        let req = configure("t1");
        let tasks = [
            task("a", true, c, Some(("t1", Succeeded, ""))),
            task("b", true, Some(State::Standby), None),
        ];
        let a = agg(&tasks, 2, Some(&req), State::Configured);
        assert_eq!(a.transition.as_ref().unwrap().phase, Running);
        assert_eq!(a.transition.unwrap().message, "1/2 critical tasks done");
        // An older transition id does not count for this one.
        let tasks = [
            task("a", true, c, Some(("t1", Succeeded, ""))),
            task("b", true, c, Some(("t0", Succeeded, ""))),
        ];
        assert_eq!(outcome(&tasks, 2, &req, State::Configured).0, Running);
        // A non-critical task still on its way holds the outcome back (its failure is to be
        // reported with it)...
        let tasks = [
            task("a", true, c, Some(("t1", Succeeded, ""))),
            task("b", false, Some(State::Standby), None),
        ];
        assert_eq!(outcome(&tasks, 2, &req, State::Configured).0, Running);
        // ... but does not fail it.
        let tasks = [
            task("a", true, c, Some(("t1", Succeeded, ""))),
            task("b", false, Some(State::Error), Some(("t1", Failed, "x"))),
        ];
        assert_eq!(outcome(&tasks, 2, &req, State::Configured).0, Succeeded);
        let tasks = [
            task(
                "a",
                true,
                Some(State::Error),
                Some(("t1", Failed, "ok=false from server")),
            ),
            task("b", true, Some(State::Standby), None),
        ];
        assert_eq!(
            outcome(&tasks, 2, &req, State::Configured),
            (
                Failed,
                "task a (node flp001): ok=false from server".to_string()
            )
        );
        let tasks = [task("a", true, Some(State::Error), None)];
        assert_eq!(
            outcome(&tasks, 1, &req, State::Configured),
            (Failed, "task a (node flp001): a broke".to_string())
        );
    }

    #[test]
    fn a_recover_waits_for_the_error_tasks_to_act_on_it() {
        use TransitionPhase::*;
        let recover = TransitionRequest {
            id: "r1".into(),
            event: Event::Recover,
            arguments: Default::default(),
        };
        let before = [
            task("a", true, Some(State::Error), Some(("c1", Failed, "x"))),
            task("b", true, Some(State::Standby), None),
        ];
        let (phase, message) = outcome(&before, 2, &recover, State::Standby);
        assert_eq!(phase, Running, "{message}");
        let after = [
            task(
                "a",
                true,
                Some(State::Error),
                Some(("r1", Failed, "still broken")),
            ),
            task("b", true, Some(State::Standby), None),
        ];
        assert_eq!(
            outcome(&after, 2, &recover, State::Standby),
            (Failed, "task a (node flp001): still broken".to_string())
        );
    }

    #[test]
    fn hook_tasks_count_only_when_they_failed() {
        let c = Some(State::Configured);
        let mut idle = task("h", true, Some(State::Standby), None);
        idle.spec.task.control_mode = ControlMode::Hook;
        let tasks = [
            task("a", true, c, Some(("t1", TransitionPhase::Succeeded, ""))),
            idle,
        ];
        let a = agg(&tasks, 1, Some(&configure("t1")), State::Configured);
        assert_eq!((a.state, a.ready.as_str()), (State::Configured, "1/1"));
        assert_eq!(a.counts, BTreeMap::from([(State::Configured, 1)]));
        assert_eq!(a.transition.unwrap().phase, TransitionPhase::Succeeded);
        let mut failed = task("h", true, Some(State::Error), None);
        failed.spec.task.control_mode = ControlMode::Hook;
        let tasks = [task("a", true, Some(State::Standby), None), failed];
        let a = agg(&tasks, 1, None, State::Standby);
        assert_eq!(a.state, State::Error);
        assert_eq!(a.failing_tasks[0].name, "h");
    }

    /// The fault run's seed 500 round 17: a task failed START unreachable, answered again
    /// later in CONFIGURED (out of ERROR, the step never taken): it is still named failing
    /// for that START, and the environment says ERROR, not the target.
    #[test]
    fn a_task_that_failed_the_transition_is_named_even_out_of_error() {
        use TransitionPhase::*;
        let req = TransitionRequest {
            id: "s1".into(),
            event: crate::state::Event::Start,
            arguments: Default::default(),
        };
        let r = Some(State::Running);
        let tasks = [
            task("a", true, r, Some(("s1", Succeeded, ""))),
            task(
                "b",
                true,
                Some(State::Configured),
                Some(("s1", Failed, "unreachable")),
            ),
        ];
        let a = agg(&tasks, 2, Some(&req), State::Running);
        assert_eq!(a.state, State::Error);
        assert_eq!(a.failing_tasks.len(), 1);
        assert_eq!(a.failing_tasks[0].name, "b");
        assert_eq!(a.failing_tasks[0].message, "unreachable");
        assert_eq!(a.transition.unwrap().phase, Failed);
        // A failure of an earlier transition names nobody now.
        let tasks = [
            task("a", true, r, Some(("s1", Succeeded, ""))),
            task("b", true, r, Some(("s0", Failed, "old"))),
        ];
        let a = agg(&tasks, 2, Some(&req), State::Running);
        assert!(a.failing_tasks.is_empty());
        // An event every task refused alike (it does not apply) names nobody and leaves
        // the environment where it is.
        let c = Some(State::Configured);
        let tasks = [
            task("a", true, c, Some(("s1", Failed, "does not apply"))),
            task("b", true, c, Some(("s1", Failed, "does not apply"))),
        ];
        let a = agg(&tasks, 2, Some(&req), State::Running);
        assert_eq!(a.state, State::Configured);
        assert!(a.failing_tasks.is_empty());
        assert_eq!(a.transition.unwrap().phase, Failed);
    }
}

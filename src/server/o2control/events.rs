//! Roster changes -> the anchor's event stream (`events.Event`, what Subscribe sends), for
//! one environment. Pure: fed the roster's changes, it answers the events they mean.
//!
//! A roster change that tells the anchor's clients nothing new (a count, a resync, a
//! message) sends nothing: the feed remembers what it last said of the environment and of
//! each task, and speaks only when that changes. A relist (`Change::Reset`) is answered by
//! comparing the roster's view with what was said.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::pb::events as ev;
use super::state_map;
use crate::roster::{Change, EnvKey, EnvRecord, Phase, Roster, Str, TaskRecord};

/// What an environment event says (the feed speaks when it changes).
#[derive(Clone, Debug, PartialEq)]
struct EnvSaid {
    state: &'static str,
    transition: &'static str,
    status: ev::OpStatus,
    run: u32,
    error: String,
}

/// What a task event says.
#[derive(Clone, Debug, PartialEq)]
struct TaskSaid {
    state: &'static str,
    status: &'static str,
}

/// The events of one environment, from the roster's changes.
pub struct Feed {
    key: EnvKey,
    env_id: String,
    env: Option<EnvSaid>,
    tasks: HashMap<Str, TaskSaid>,
    /// The environment's end was told.
    ended: bool,
}

/// An event stamped now.
pub fn stamped(payload: ev::event::Payload) -> ev::Event {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    ev::Event {
        timestamp: now.as_millis() as i64,
        timestamp_nano: now.as_nanos() as i64,
        payload: Some(payload),
    }
}

/// An environment event in the anchor's words for `e`.
fn env_said(e: &EnvRecord) -> EnvSaid {
    let (transition, status, error) = match (&e.requested, &e.observed) {
        (Some((id, event)), observed) => {
            let o = observed.as_ref().filter(|o| o.id == *id);
            let status = match o.map(|o| o.phase) {
                None => ev::OpStatus::Started,
                Some(Phase::Running) => ev::OpStatus::Ongoing,
                Some(Phase::Succeeded) => ev::OpStatus::DoneOk,
                Some(Phase::Failed) => ev::OpStatus::DoneError,
            };
            let error = o
                .filter(|o| o.phase == Phase::Failed)
                .and_then(|o| o.message.as_deref())
                .unwrap_or_default()
                .to_string();
            (state_map::event_name(*event), status, error)
        }
        (None, _) => ("", ev::OpStatus::Null, String::new()),
    };
    EnvSaid {
        state: state_map::environment_state(e.state),
        transition,
        status,
        run: e
            .run_number
            .as_deref()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0),
        error,
    }
}

fn task_said(t: &TaskRecord) -> TaskSaid {
    TaskSaid {
        state: state_map::task_state(t.state),
        status: state_map::task_status(t.state),
    }
}

impl Feed {
    pub fn new(key: EnvKey, env_id: &str) -> Self {
        Feed {
            key,
            env_id: env_id.to_string(),
            env: None,
            tasks: HashMap::new(),
            ended: false,
        }
    }

    /// Whether the environment's end (its object gone) was told.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Everything the roster knows of the environment now, as events (a new subscriber's
    /// first view, and the answer to a relist).
    pub fn snapshot(&mut self, roster: &Roster) -> Vec<ev::Event> {
        let mut out = Vec::new();
        match roster.env(&self.key) {
            Some(e) => out.extend(self.env_changed(&e)),
            None if self.env.is_some() => out.push(self.env_gone()),
            None => {}
        }
        let now: Vec<Arc<TaskRecord>> = roster.tasks_of(&self.key);
        let names: std::collections::HashSet<&str> = now.iter().map(|t| &*t.name).collect();
        let gone: Vec<Str> = self
            .tasks
            .keys()
            .filter(|n| !names.contains(&***n))
            .cloned()
            .collect();
        for t in &now {
            out.extend(self.task_changed(t));
        }
        for name in gone {
            out.extend(self.task_gone(&name));
        }
        out
    }

    /// The events one roster change means for this environment (none, mostly).
    pub fn on(&mut self, change: &Change, roster: &Roster) -> Vec<ev::Event> {
        match change {
            Change::EnvApplied(e) if e.key == self.key => self.env_changed(e).into_iter().collect(),
            Change::EnvDeleted(k) if *k == self.key && self.env.is_some() => vec![self.env_gone()],
            Change::TaskApplied(t) if t.env == self.key => {
                self.task_changed(t).into_iter().collect()
            }
            Change::TaskDeleted { env, name } if *env == self.key => {
                self.task_gone(name).into_iter().collect()
            }
            Change::Reset(_) => self.snapshot(roster),
            _ => vec![],
        }
    }

    fn env_changed(&mut self, e: &EnvRecord) -> Option<ev::Event> {
        let said = env_said(e);
        if self.env.as_ref() == Some(&said) {
            return None;
        }
        let payload = ev::event::Payload::EnvironmentEvent(ev::EvEnvironmentEvent {
            environment_id: self.env_id.clone(),
            state: said.state.into(),
            run_number: said.run,
            error: said.error.clone(),
            transition: said.transition.into(),
            transition_status: said.status as i32,
            message: if e.deleting {
                "being destroyed".into()
            } else {
                String::new()
            },
            ..Default::default()
        });
        self.env = Some(said);
        Some(stamped(payload))
    }

    /// The environment's object is gone: its tasks and pods with it.
    pub fn env_gone(&mut self) -> ev::Event {
        self.env = None;
        self.ended = true;
        stamped(ev::event::Payload::EnvironmentEvent(
            ev::EvEnvironmentEvent {
                environment_id: self.env_id.clone(),
                state: "DONE".into(),
                message: "environment teardown complete".into(),
                ..Default::default()
            },
        ))
    }

    fn task_changed(&mut self, t: &TaskRecord) -> Option<ev::Event> {
        let said = task_said(t);
        if self.tasks.get(&t.name) == Some(&said) {
            return None;
        }
        let event = task_event(t, &said, &self.env_id);
        self.tasks.insert(t.name.clone(), said);
        Some(event)
    }

    /// A task whose object is gone: its process was ended with its environment.
    fn task_gone(&mut self, name: &Str) -> Option<ev::Event> {
        let last = self.tasks.remove(name)?;
        Some(stamped(ev::event::Payload::TaskEvent(ev::EvTaskEvent {
            name: name.to_string(),
            taskid: name.to_string(),
            state: last.state.into(),
            status: "INACTIVE".into(),
            environment_id: self.env_id.clone(),
            ..Default::default()
        })))
    }
}

fn task_event(t: &TaskRecord, said: &TaskSaid, env_id: &str) -> ev::Event {
    stamped(ev::event::Payload::TaskEvent(ev::EvTaskEvent {
        name: t.name.to_string(),
        taskid: t.name.to_string(),
        state: said.state.into(),
        status: said.status.into(),
        hostname: t.node.to_string(),
        class_name: t.class.to_string(),
        traits: Some(ev::Traits {
            critical: t.critical,
            ..Default::default()
        }),
        environment_id: env_id.to_string(),
        path: t.path.to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roster::Observed;
    use crate::server::o2control::fixture;
    use crate::state::{Event, State};

    fn env(state: Option<State>) -> EnvRecord {
        fixture::env("2abc", 1, 1, state)
    }

    fn env_event(e: &ev::Event) -> &ev::EvEnvironmentEvent {
        match e.payload.as_ref() {
            Some(ev::event::Payload::EnvironmentEvent(x)) => x,
            other => panic!("not an environment event: {other:?}"),
        }
    }

    fn task_ev(e: &ev::Event) -> &ev::EvTaskEvent {
        match e.payload.as_ref() {
            Some(ev::event::Payload::TaskEvent(x)) => x,
            other => panic!("not a task event: {other:?}"),
        }
    }

    #[test]
    fn a_transition_is_told_as_it_goes_and_repeats_are_not() {
        let r = Roster::new();
        let mut f = Feed::new(EnvKey::new("runs", "e1"), "2abc");
        let standby = Arc::new(env(Some(State::Standby)));
        let out = f.on(&Change::EnvApplied(standby.clone()), &r);
        assert_eq!(out.len(), 1);
        assert_eq!(env_event(&out[0]).state, "DEPLOYED");
        assert_eq!(env_event(&out[0]).environment_id, "2abc");
        // The same again (a resync, a count): nothing.
        assert!(f.on(&Change::EnvApplied(standby), &r).is_empty());

        let mut start = env(Some(State::Configured));
        start.requested = Some(("t1".into(), Event::Start));
        start.run_number = Some("7".into());
        let out = f.on(&Change::EnvApplied(Arc::new(start.clone())), &r);
        let e = env_event(&out[0]);
        assert_eq!(
            (e.state.as_str(), e.transition.as_str(), e.run_number),
            ("CONFIGURED", "START_ACTIVITY", 7)
        );
        assert_eq!(e.transition_status, ev::OpStatus::Started as i32);

        start.state = Some(State::Running);
        start.observed = Some(Observed {
            id: "t1".into(),
            event: Event::Start,
            phase: Phase::Succeeded,
            message: None,
        });
        let out = f.on(&Change::EnvApplied(Arc::new(start.clone())), &r);
        let e = env_event(&out[0]);
        assert_eq!(e.state, "RUNNING");
        assert_eq!(e.transition_status, ev::OpStatus::DoneOk as i32);

        // Another environment's change is not this feed's.
        let mut other = start;
        other.key = EnvKey::new("runs", "e2");
        other.state = Some(State::Error);
        assert!(f.on(&Change::EnvApplied(Arc::new(other)), &r).is_empty());

        let out = f.on(&Change::EnvDeleted(EnvKey::new("runs", "e1")), &r);
        let e = env_event(&out[0]);
        assert_eq!(
            (e.state.as_str(), e.message.as_str()),
            ("DONE", "environment teardown complete")
        );
    }

    #[test]
    fn a_failed_transition_carries_its_error() {
        let r = Roster::new();
        let mut f = Feed::new(EnvKey::new("runs", "e1"), "2abc");
        let mut e = env(Some(State::Error));
        e.requested = Some(("t1".into(), Event::Configure));
        e.observed = Some(Observed {
            id: "t1".into(),
            event: Event::Configure,
            phase: Phase::Failed,
            message: Some("readout on flp001 refused CONFIGURE".into()),
        });
        let out = f.on(&Change::EnvApplied(Arc::new(e)), &r);
        let e = env_event(&out[0]);
        assert_eq!(e.state, "ERROR");
        assert_eq!(e.transition_status, ev::OpStatus::DoneError as i32);
        assert!(e.error.contains("refused CONFIGURE"), "{}", e.error);
    }

    #[test]
    fn tasks_are_told_on_a_change_of_state_and_when_gone() {
        let r = Roster::new();
        let key = EnvKey::new("runs", "e1");
        let mut f = Feed::new(key.clone(), "2abc");
        let t = fixture::task(
            "e1-readout-0",
            "flp001",
            "rd.host-flp001.readout",
            State::Standby,
            true,
        );
        let out = f.on(&Change::TaskApplied(t.clone()), &r);
        let e = task_ev(&out[0]);
        assert_eq!(
            (
                e.taskid.as_str(),
                e.state.as_str(),
                e.status.as_str(),
                e.hostname.as_str()
            ),
            ("e1-readout-0", "STANDBY", "ACTIVE", "flp001")
        );
        assert_eq!(e.class_name, "readout");
        assert_eq!(e.path, "rd.host-flp001.readout");
        assert!(e.traits.as_ref().unwrap().critical);
        assert!(f.on(&Change::TaskApplied(t.clone()), &r).is_empty());

        let mut running = (*t).clone();
        running.state = State::Running;
        let out = f.on(&Change::TaskApplied(Arc::new(running)), &r);
        assert_eq!(task_ev(&out[0]).state, "RUNNING");

        let out = f.on(
            &Change::TaskDeleted {
                env: key,
                name: "e1-readout-0".into(),
            },
            &r,
        );
        let e = task_ev(&out[0]);
        assert_eq!(
            (e.state.as_str(), e.status.as_str()),
            ("RUNNING", "INACTIVE")
        );
    }

    #[test]
    fn a_relist_is_answered_by_what_changed_and_what_is_gone() {
        let r = Roster::new();
        let key = EnvKey::new("runs", "e1");
        let mut f = Feed::new(key.clone(), "2abc");
        r.apply_env(env(Some(State::Standby)));
        let t = fixture::task("e1-a", "flp001", "rd.a", State::Standby, true);
        r.apply_task((*t).clone());
        assert_eq!(f.snapshot(&r).len(), 2, "the environment and its task");
        assert!(f.snapshot(&r).is_empty(), "nothing new");
        r.reset_tasks(vec![]);
        let out = f.on(&Change::Reset(crate::roster::Kind::Tasks), &r);
        assert_eq!(out.len(), 1);
        assert_eq!(task_ev(&out[0]).status, "INACTIVE");
    }
}

//! What to break, when: a fault schedule that follows from (seed, rounds, faults per round)
//! alone, printed whenever a run fails so that the same run can be made again.

use std::fmt;

use super::rng::Rng;

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// SIGKILL the operator, start it again.
    OperatorKill,
    /// SIGKILL the daemon replica that holds the lease, start it again (as the standby).
    DaemonLeaderKill,
    /// SIGKILL kube-apiserver, start it again on its port.
    ApiserverKill,
    /// SIGKILL etcd, start it again on its data.
    EtcdKill,
    /// SIGKILL one task's process (it stays down: no kubelet restarts it).
    TaskKill,
    /// SIGSTOP one task's process for longer than a control call may take, then SIGCONT.
    TaskFreeze,
    /// One task refuses the step it is asked next (fails it, or a FairMQ step stays stuck).
    TaskRefuse,
    /// The control connection to one task holds every byte for a while.
    ProxyStall,
    /// The control connection to one task is cut, and refused for a while.
    ProxyCut,
    /// One kwok node turns NotReady for a while.
    NodeNotReady,
}

impl Kind {
    /// Faults of the control plane and of envbridge itself: no task is at fault, so every
    /// transition must still reach its target.
    pub const INFRA: [Kind; 4] = [
        Kind::OperatorKill,
        Kind::DaemonLeaderKill,
        Kind::ApiserverKill,
        Kind::EtcdKill,
    ];
    /// Faults of one task (or one node's tasks): the environment may end in ERROR, naming it.
    pub const TASK: [Kind; 6] = [
        Kind::TaskKill,
        Kind::TaskFreeze,
        Kind::TaskRefuse,
        Kind::ProxyStall,
        Kind::ProxyCut,
        Kind::NodeNotReady,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::OperatorKill => "operator-kill",
            Kind::DaemonLeaderKill => "daemon-leader-kill",
            Kind::ApiserverKill => "apiserver-kill",
            Kind::EtcdKill => "etcd-kill",
            Kind::TaskKill => "task-kill",
            Kind::TaskFreeze => "task-freeze",
            Kind::TaskRefuse => "task-refuse",
            Kind::ProxyStall => "proxy-stall",
            Kind::ProxyCut => "proxy-cut",
            Kind::NodeNotReady => "node-not-ready",
        }
    }

    pub fn hits_tasks(self) -> bool {
        Kind::TASK.contains(&self)
    }
}

/// The steps of one round, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Create,
    Configure,
    Start,
    Stop,
    Reset,
    Destroy,
}

impl Step {
    pub const ALL: [Step; 6] = [
        Step::Create,
        Step::Configure,
        Step::Start,
        Step::Stop,
        Step::Reset,
        Step::Destroy,
    ];

    /// The run-control event of a transition step (None: create, destroy).
    pub fn event(self) -> Option<&'static str> {
        match self {
            Step::Configure => Some("CONFIGURE"),
            Step::Start => Some("START"),
            Step::Stop => Some("STOP"),
            Step::Reset => Some("RESET"),
            Step::Create | Step::Destroy => None,
        }
    }

    /// The state every task reaches when this step succeeds.
    pub fn target(self) -> &'static str {
        match self {
            Step::Create | Step::Reset => "STANDBY",
            Step::Configure | Step::Stop => "CONFIGURED",
            Step::Start => "RUNNING",
            Step::Destroy => "GONE",
        }
    }
}

/// One fault: at `step` of `round`, `after_ms` into it, `kind` on the target chosen by `pick`
/// (taken modulo what exists then: tasks, nodes), undone (restart, SIGCONT, reconnect, Ready)
/// after `hold_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub round: u32,
    pub step: Step,
    pub kind: Kind,
    pub after_ms: u64,
    pub hold_ms: u64,
    pub pick: u64,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "round {} {:?} +{} ms: {} (pick {}, held {} ms)",
            self.round,
            self.step,
            self.after_ms,
            self.kind.name(),
            self.pick,
            self.hold_ms
        )
    }
}

/// How long a kind's fault is held before it is undone. `control_timeout_ms` is the
/// operator's per-call deadline: a freeze or a stall outlasts it.
fn hold_ms(kind: Kind, rng: &mut Rng, control_timeout_ms: u64) -> u64 {
    match kind {
        Kind::OperatorKill | Kind::DaemonLeaderKill => rng.between(0, 500),
        Kind::ApiserverKill | Kind::EtcdKill => rng.between(0, 2_000),
        Kind::TaskKill | Kind::TaskRefuse => 0,
        Kind::TaskFreeze | Kind::ProxyStall => {
            control_timeout_ms + rng.between(500, control_timeout_ms)
        }
        Kind::ProxyCut => rng.between(200, 3_000),
        Kind::NodeNotReady => rng.between(2_000, 8_000),
    }
}

/// `rounds` rounds of `per_round` faults (at least 1): one task fault per round, last, at a
/// random step; the others control-plane faults at earlier (or the same) steps. Kinds are
/// dealt from shuffled decks, so that every kind comes up once the rounds allow it (six
/// rounds of two: all ten).
pub fn plan(seed: u64, rounds: u32, per_round: u32, control_timeout_ms: u64) -> Vec<Vec<Fault>> {
    let mut rng = Rng::new(seed);
    let mut infra: Vec<Kind> = Vec::new();
    let mut task: Vec<Kind> = Vec::new();
    let deal = |deck: &mut Vec<Kind>, all: &[Kind], rng: &mut Rng| {
        if deck.is_empty() {
            deck.extend_from_slice(all);
            rng.shuffle(deck);
        }
        deck.pop().expect("a refilled deck")
    };
    (0..rounds)
        .map(|round| {
            let mut faults = Vec::new();
            let task_step = Step::ALL[rng.below(Step::ALL.len() as u64) as usize];
            for _ in 1..per_round.max(1) {
                let kind = deal(&mut infra, &Kind::INFRA, &mut rng);
                // At or before the task fault's step: a task fault may end the cycle early.
                let upto = Step::ALL.iter().position(|s| *s == task_step).unwrap_or(0);
                let step = Step::ALL[rng.below(upto as u64 + 1) as usize];
                faults.push(Fault {
                    round,
                    step,
                    kind,
                    after_ms: rng.between(0, 1_500),
                    hold_ms: hold_ms(kind, &mut rng, control_timeout_ms),
                    pick: rng.next_u64(),
                });
            }
            let kind = deal(&mut task, &Kind::TASK, &mut rng);
            faults.push(Fault {
                round,
                step: task_step,
                kind,
                after_ms: rng.between(0, 1_500),
                hold_ms: hold_ms(kind, &mut rng, control_timeout_ms),
                pick: rng.next_u64(),
            });
            faults.sort_by_key(|f| (f.step, f.kind.hits_tasks(), f.after_ms));
            faults
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_six_rounds_of_two_cover_every_kind() {
        let a = plan(7, 6, 2, 4_000);
        assert_eq!(a, plan(7, 6, 2, 4_000));
        assert_ne!(a, plan(8, 6, 2, 4_000));
        let kinds: std::collections::BTreeSet<Kind> = a.iter().flatten().map(|f| f.kind).collect();
        assert_eq!(kinds.len(), Kind::INFRA.len() + Kind::TASK.len());
        for round in &a {
            assert_eq!(round.iter().filter(|f| f.kind.hits_tasks()).count(), 1);
            let last = round.last().unwrap();
            assert!(last.kind.hits_tasks(), "{round:?}");
        }
    }
}

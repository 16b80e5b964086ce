//! What a run counts: faults by kind, survived, violations, convergence after a fault.

use std::collections::BTreeMap;
use std::time::Duration;

use super::schedule::Kind;

#[derive(Default)]
pub struct Figures {
    pub injected: BTreeMap<Kind, u32>,
    pub survived: u32,
    pub violations: Vec<String>,
    /// From a fault's injection until its step's truth held, by kind.
    pub convergence: Vec<(Kind, Duration)>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

impl Figures {
    pub fn total(&self) -> u32 {
        self.injected.values().sum()
    }

    pub fn print(&self) {
        println!("faults by kind:");
        for (k, n) in &self.injected {
            println!("  {:<20} {n}", k.name());
        }
        let line = |what: &str, mut c: Vec<Duration>| {
            c.sort();
            println!(
                "  {what:<20} p50 {:>6.2} s  p99 {:>6.2} s  max {:>6.2} s  ({} faults)",
                percentile(&c, 0.5).as_secs_f64(),
                percentile(&c, 0.99).as_secs_f64(),
                c.last().copied().unwrap_or_default().as_secs_f64(),
                c.len()
            );
        };
        println!("convergence after a fault (injection to the truth holding):");
        line("all", self.convergence.iter().map(|c| c.1).collect());
        for k in self.injected.keys() {
            let of: Vec<Duration> = self
                .convergence
                .iter()
                .filter(|c| c.0 == *k)
                .map(|c| c.1)
                .collect();
            line(k.name(), of);
        }
        for v in &self.violations {
            println!("VIOLATION: {v}");
        }
        println!(
            "faults: {} injected, {} survived, {} violations",
            self.total(),
            self.survived,
            self.violations.len()
        );
    }
}

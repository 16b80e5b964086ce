//! The one retry delay of every watch envbridge keeps (operator stores, the daemon's roster,
//! the configuration store, the sim-runner's pods).
//!
//! kube-runtime's default (client-go's: 0.8 s doubling to 30 s, reset only after 120 s without
//! an error) is kind to an apiserver that thousands of clients watch; envbridge is a handful
//! of watchers, and with it an apiserver or etcd restart left the operator's Service store
//! 46 s behind and a create waiting 80 s (the fault run). Here: 250 ms doubling to 4 s, with
//! jitter, reset after 10 s without an error, so a watch is back within seconds of its server.

use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use kube::runtime::utils::Backoff;

const FIRST: Duration = Duration::from_millis(250);
const MOST: Duration = Duration::from_secs(4);
const QUIET_RESET: Duration = Duration::from_secs(10);

/// Doubling delays between `FIRST` and `MOST`, each drawn from [d/2, d] (jitter), starting
/// over when the last delay was handed out more than `QUIET_RESET` ago.
#[derive(Debug)]
pub struct WatchBackoff {
    next: Duration,
    last: Option<Instant>,
    jitter: RandomState,
    drawn: u64,
}

pub fn watch_backoff() -> WatchBackoff {
    WatchBackoff {
        next: FIRST,
        last: None,
        jitter: RandomState::new(),
        drawn: 0,
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) > QUIET_RESET)
        {
            self.next = FIRST;
        }
        self.last = Some(now);
        let d = self.next;
        self.next = (d * 2).min(MOST);
        self.drawn += 1;
        // A fraction in [0.5, 1] from a per-watch random hasher: watches restarted together
        // do not retry in step.
        let r = (self.jitter.hash_one(self.drawn) % 1000) as f64 / 1000.0;
        Some(d.mul_f64(0.5 + r / 2.0))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter_and_reset() {
        let mut b = watch_backoff();
        let delays: Vec<Duration> = (&mut b).take(8).collect();
        let caps = [250, 500, 1000, 2000, 4000, 4000, 4000, 4000];
        for (d, cap) in delays.iter().zip(caps) {
            let cap = Duration::from_millis(cap);
            assert!(
                *d <= cap && *d >= cap / 2,
                "{d:?} outside [{:?}, {cap:?}]",
                cap / 2
            );
        }
        b.reset();
        assert!(b.next().unwrap() <= FIRST);
    }
}

//! Prometheus metrics of the daemon (served on /metrics).

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Watch streams that failed and were restarted (by kind).
    pub watch_restarts: Family<Labels, Counter>,
    /// Watch events received (by kind).
    pub watch_events: Family<Labels, Counter>,
    /// Time between an object's last write (managedFields) and the event reaching the roster.
    pub event_lag: Histogram,
    pub roster_environments: Gauge,
    pub roster_tasks: Gauge,
    /// Approximate heap bytes of the roster's task side (records, maps, interned strings).
    pub roster_task_bytes: Gauge,
    /// Transitions by event and outcome.
    pub transitions: Family<Labels, Counter>,
    /// 1 while this replica holds the leader lease.
    pub leader: Gauge,
    /// Requests this daemon sent to the apiserver.
    pub apiserver_requests: Counter,
    /// Answers 429 (throttled) the client got, and retried.
    pub apiserver_throttled: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut reg = Registry::with_prefix("envbridge");
        let m = Metrics {
            registry: Arc::new(Registry::default()),
            watch_restarts: Family::default(),
            watch_events: Family::default(),
            event_lag: Histogram::new([0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0]),
            roster_environments: Gauge::default(),
            roster_tasks: Gauge::default(),
            roster_task_bytes: Gauge::default(),
            transitions: Family::default(),
            leader: Gauge::default(),
            apiserver_requests: Counter::default(),
            apiserver_throttled: Counter::default(),
        };
        reg.register(
            "watch_restarts",
            "Watch streams restarted after an error",
            m.watch_restarts.clone(),
        );
        reg.register(
            "watch_events",
            "Watch events received",
            m.watch_events.clone(),
        );
        reg.register(
            "watch_event_lag_seconds",
            "Object write to roster update",
            m.event_lag.clone(),
        );
        reg.register(
            "roster_environments",
            "Environments in the roster",
            m.roster_environments.clone(),
        );
        reg.register(
            "roster_tasks",
            "Tasks in the roster",
            m.roster_tasks.clone(),
        );
        reg.register(
            "roster_task_bytes",
            "Approximate heap bytes of the roster's tasks",
            m.roster_task_bytes.clone(),
        );
        reg.register(
            "transitions",
            "Transitions by event and outcome",
            m.transitions.clone(),
        );
        reg.register(
            "leader",
            "1 while this replica holds the leader lease",
            m.leader.clone(),
        );
        reg.register(
            "apiserver_requests",
            "Requests sent to the apiserver",
            m.apiserver_requests.clone(),
        );
        reg.register(
            "apiserver_throttled",
            "Answers 429 (throttled) from the apiserver, retried after Retry-After",
            m.apiserver_throttled.clone(),
        );
        Metrics {
            registry: Arc::new(reg),
            ..m
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    pub fn kind(kind: &str) -> Labels {
        vec![("kind", kind.to_string())]
    }
}

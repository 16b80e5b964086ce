//! The operator's Prometheus metrics, served on `/metrics` by [`super::http`]. Reconciles and
//! their errors are counted as they happen; the rest is read at each scrape from what the
//! operator already keeps: apiserver requests from the client's observer
//! ([`RequestCount`]), live followers and tasks by state from the running controllers (a
//! [`Sample`]), leadership from the lease.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use kube::runtime::controller;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::Error;
use super::requests::RequestCount;
use crate::state::State;

/// Every metric name starts with this (`envbridge_operator_reconciles_total`, ...).
pub const PREFIX: &str = "envbridge_operator";
/// The `Content-Type` of `/metrics` (Prometheus text format 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;
/// The `controller` label of the Task controller.
pub const TASK: &str = "task";
/// The `controller` label of the Environment controller.
pub const ENVIRONMENT: &str = "environment";

type One = [(&'static str, &'static str); 1];
type Two = [(&'static str, &'static str); 2];

/// What the running controllers know now (read at each scrape, and by `/readyz`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Every watch has had its first list (reconciles decide on a complete view only).
    pub listed: bool,
    /// Tasks followed between transitions now.
    pub live_followers: usize,
    /// Stored Tasks per state.
    pub tasks: BTreeMap<State, u64>,
}

impl Sample {
    /// Tasks per state; a Task without a state yet counts as DEPLOYING (as the Environment's
    /// `counts` do).
    pub fn count_tasks(states: impl IntoIterator<Item = Option<State>>) -> BTreeMap<State, u64> {
        let mut out = BTreeMap::new();
        for s in states {
            *out.entry(s.unwrap_or_default()).or_default() += 1;
        }
        out
    }
}

/// Reads a [`Sample`] from the running controllers; None once they are gone.
pub type Sampler = Box<dyn Fn() -> Option<Sample> + Send + Sync>;

/// The metrics read at each scrape.
#[derive(Default)]
struct Now {
    leading: AtomicBool,
    /// The running controllers' sampler and its attachment number.
    sampler: RwLock<Option<(u64, Sampler)>>,
    attachments: AtomicU64,
    requests: Arc<RequestCount>,
}

impl std::fmt::Debug for Now {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Now")
            .field("leading", &self.leading)
            .finish_non_exhaustive()
    }
}

impl Now {
    fn sample(&self) -> Option<Sample> {
        let guard = self.sampler.read().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().and_then(|(_, f)| f())
    }
}

impl Collector for Now {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let leading = i64::from(self.leading.load(Ordering::Relaxed));
        let m = enc.encode_descriptor(
            "leader",
            "1 while this replica holds the leadership lease (or runs without election).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(leading).encode(m)?;

        let mut m = enc.encode_descriptor(
            "apiserver_requests",
            "Requests sent to the apiserver, by verb and resource[/subresource].",
            None,
            MetricType::Counter,
        )?;
        for (key, n) in self.requests.by_kind() {
            let (verb, kind) = key.split_once(' ').unwrap_or((key.as_str(), ""));
            let labels = [("verb", verb), ("kind", kind)];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }

        let sample = self.sample();
        let m = enc.encode_descriptor(
            "live_followers",
            "Tasks followed between transitions now.",
            None,
            MetricType::Gauge,
        )?;
        let followers = sample.as_ref().map_or(0, |s| s.live_followers);
        ConstGauge::new(i64::try_from(followers).unwrap_or(i64::MAX)).encode(m)?;

        // A standby watches no Tasks: it reports none rather than zeros.
        if let Some(s) = &sample {
            let mut m = enc.encode_descriptor(
                "tasks",
                "Tasks in the operator's store, by state.",
                None,
                MetricType::Gauge,
            )?;
            for state in State::TASK_STATES {
                let n = s.tasks.get(&state).copied().unwrap_or(0);
                let labels = [("state", state.as_str())];
                ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))
                    .encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The operator's metric families, one registry.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<One, Counter>,
    reconcile_errors: Family<Two, Counter>,
    now: Arc<Now>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(Arc::default())
    }
}

impl Metrics {
    /// The families; apiserver requests are read from `requests` (the observer of the
    /// operator's client).
    pub fn new(requests: Arc<RequestCount>) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let reconciles = Family::<One, Counter>::default();
        let reconcile_errors = Family::<Two, Counter>::default();
        // Both controllers show from the start (at 0), so that a rate has a beginning.
        for c in [TASK, ENVIRONMENT] {
            let _ = reconciles.get_or_create(&[("controller", c)]);
        }
        registry.register(
            "reconciles",
            "Reconciles run, by controller (failed ones included)",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that returned an error, by controller and error (the error's metric label; \
             `pending` is a cleanup or a Task still waiting, `taken` a Task name another object \
             controls)",
            reconcile_errors.clone(),
        );
        let now = Arc::new(Now {
            requests,
            ..Now::default()
        });
        registry.register_collector(Box::new(now.clone()));
        Metrics {
            registry,
            reconciles,
            reconcile_errors,
            now,
        }
    }

    /// Counts one answer of `controller`'s stream: a reconcile that ran, and its error if it
    /// failed. Neither an object gone from the store nor a watch error is a reconcile.
    pub fn reconciled<T, Q>(
        &self,
        controller: &'static str,
        answer: &Result<T, controller::Error<Error, Q>>,
    ) {
        let error = match answer {
            Ok(_) => None,
            Err(controller::Error::ReconcilerFailed(e, _)) => Some(e.metric_label()),
            Err(_) => return,
        };
        self.reconciles
            .get_or_create(&[("controller", controller)])
            .inc();
        if let Some(error) = error {
            self.reconcile_errors
                .get_or_create(&[("controller", controller), ("error", error)])
                .inc();
        }
    }

    pub fn set_leading(&self, leading: bool) {
        self.now.leading.store(leading, Ordering::Relaxed);
    }

    /// This replica holds the lease (or runs without election) and its controllers may run.
    pub fn leading(&self) -> bool {
        self.now.leading.load(Ordering::Relaxed)
    }

    /// The running controllers are read through `sampler` until the returned guard drops.
    pub fn attach(&self, sampler: Sampler) -> Attached {
        let id = self.now.attachments.fetch_add(1, Ordering::Relaxed);
        *self.now.sampler.write().unwrap_or_else(|e| e.into_inner()) = Some((id, sampler));
        Attached {
            now: self.now.clone(),
            id,
        }
    }

    /// What the running controllers know now; None while none run.
    pub fn sample(&self) -> Option<Sample> {
        self.now.sample()
    }

    /// The Prometheus text exposition of every family.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// Detaches its sampler when dropped (the controllers stopped).
pub struct Attached {
    now: Arc<Now>,
    id: u64,
}

impl Drop for Attached {
    fn drop(&mut self) {
        let mut slot = self.now.sampler.write().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|(id, _)| *id == self.id) {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::ObjectRef;

    type Answer = Result<(), controller::Error<Error, std::io::Error>>;

    fn failed(e: Error) -> controller::Error<Error, std::io::Error> {
        let obj = ObjectRef::<k8s_openapi::api::core::v1::Pod>::new("p").erase();
        controller::Error::ReconcilerFailed(e, Box::new(obj))
    }

    fn has(text: &str, line: &str) {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }

    #[test]
    fn reconciles_and_errors_are_counted_by_controller_and_label() {
        let m = Metrics::default();
        let text = m.encode();
        has(
            &text,
            "envbridge_operator_reconciles_total{controller=\"task\"} 0",
        );
        has(
            &text,
            "envbridge_operator_reconciles_total{controller=\"environment\"} 0",
        );
        assert!(!text.contains("reconcile_errors_total{"), "{text}");

        m.reconciled(TASK, &Answer::Ok(()));
        m.reconciled(TASK, &Answer::Err(failed(Error::LeaseLost)));
        m.reconciled(
            ENVIRONMENT,
            &Answer::Err(failed(Error::Pending {
                what: "tasks".into(),
                after: std::time::Duration::from_secs(1),
            })),
        );
        // Not reconciles: an object gone from the store, a watch error.
        let gone = ObjectRef::<k8s_openapi::api::core::v1::Pod>::new("p").erase();
        m.reconciled(
            TASK,
            &Answer::Err(controller::Error::ObjectNotFound(Box::new(gone))),
        );
        m.reconciled(
            TASK,
            &Answer::Err(controller::Error::QueueError(std::io::Error::other("w"))),
        );
        let text = m.encode();
        has(
            &text,
            "envbridge_operator_reconciles_total{controller=\"task\"} 2",
        );
        has(
            &text,
            "envbridge_operator_reconciles_total{controller=\"environment\"} 1",
        );
        has(
            &text,
            "envbridge_operator_reconcile_errors_total{controller=\"task\",error=\"lease_lost\"} 1",
        );
        has(
            &text,
            "envbridge_operator_reconcile_errors_total{controller=\"environment\",error=\"pending\"} 1",
        );
        has(&text, "# TYPE envbridge_operator_reconciles_total counter");
    }

    #[test]
    fn requests_leadership_followers_and_tasks_are_read_at_each_scrape() {
        use crate::launch::client::Observe;
        let requests = Arc::new(RequestCount::default());
        let m = Metrics::new(requests.clone());
        requests.sent(&http::Method::POST, "/api/v1/namespaces/a/pods", None);
        requests.sent(&http::Method::POST, "/api/v1/namespaces/b/pods", None);
        let status = "/apis/envbridge.dev/v1alpha1/namespaces/a/tasks/t/status";
        requests.sent(&http::Method::PATCH, status, None);

        // A standby: not leading, nothing followed, no task counts at all.
        let text = m.encode();
        has(&text, "envbridge_operator_leader 0");
        has(&text, "envbridge_operator_live_followers 0");
        assert!(!text.contains("envbridge_operator_tasks{"), "{text}");
        has(
            &text,
            "envbridge_operator_apiserver_requests_total{verb=\"create\",kind=\"pods\"} 2",
        );
        has(
            &text,
            "envbridge_operator_apiserver_requests_total{verb=\"patch\",kind=\"tasks/status\"} 1",
        );

        m.set_leading(true);
        let tasks = Sample::count_tasks([Some(State::Running), None, Some(State::Running)]);
        let attached = m.attach(Box::new(move || {
            Some(Sample {
                listed: true,
                live_followers: 2,
                tasks: tasks.clone(),
            })
        }));
        let text = m.encode();
        has(&text, "envbridge_operator_leader 1");
        has(&text, "# TYPE envbridge_operator_tasks gauge");
        has(&text, "envbridge_operator_live_followers 2");
        has(&text, "envbridge_operator_tasks{state=\"RUNNING\"} 2");
        has(&text, "envbridge_operator_tasks{state=\"DEPLOYING\"} 1");
        // Every task state shows, at 0 when no task is in it (a gauge that never goes stale).
        has(&text, "envbridge_operator_tasks{state=\"ERROR\"} 0");
        assert!(!text.contains("MIXED"), "an environment-only state: {text}");

        // The controllers stopped: back to what a standby reports.
        drop(attached);
        assert_eq!(m.sample(), None);
        assert!(!m.encode().contains("envbridge_operator_tasks{"));
    }

    #[test]
    fn a_stale_guard_does_not_detach_a_newer_sampler() {
        let m = Metrics::default();
        let first = m.attach(Box::new(|| Some(Sample::default())));
        let second = m.attach(Box::new(|| {
            Some(Sample {
                live_followers: 7,
                ..Sample::default()
            })
        }));
        drop(first);
        assert_eq!(m.sample().map(|s| s.live_followers), Some(7));
        drop(second);
        assert_eq!(m.sample(), None);
    }
}

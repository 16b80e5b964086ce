//! Watches over Environments and Tasks feeding the roster.
//!
//! Filtered on the server by the managed-by label, with kube-runtime's default backoff,
//! bookmarks (on by default) and a relist on 410 Gone (the watcher does it). An error never
//! ends a watch: it is logged, counted, and the watcher resumes. The initial list (and every
//! relist) is buffered until InitDone and then replaces the roster's view at once.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::convert;
use super::metrics::Metrics;
use crate::crd::{Environment, Task, labels};
use crate::roster::{EnvRecord, Roster, TaskRecord};

/// Whether each watch has completed its first list (the roster is then a true view).
#[derive(Default, Debug)]
pub struct Synced {
    pub environments: AtomicBool,
    pub tasks: AtomicBool,
}

impl Synced {
    pub fn all(&self) -> bool {
        self.environments.load(Ordering::Acquire) && self.tasks.load(Ordering::Acquire)
    }
}

/// How one kind of object maps onto the roster.
trait Feed: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static {
    type Rec: Send;
    const KIND: &'static str;
    fn record(r: &Roster, obj: &Self) -> Self::Rec;
    fn apply(r: &Roster, rec: Self::Rec);
    fn delete(r: &Roster, obj: &Self);
    fn reset(r: &Roster, recs: Vec<Self::Rec>);
    fn synced(s: &Synced) -> &AtomicBool;
}

impl Feed for Environment {
    type Rec = EnvRecord;
    const KIND: &'static str = "Environment";
    fn record(r: &Roster, obj: &Self) -> EnvRecord {
        convert::env_record(r, obj)
    }
    fn apply(r: &Roster, rec: EnvRecord) {
        r.apply_env(rec);
    }
    fn delete(r: &Roster, obj: &Self) {
        r.delete_env(&convert::env_key(obj));
    }
    fn reset(r: &Roster, recs: Vec<EnvRecord>) {
        r.reset_envs(recs);
    }
    fn synced(s: &Synced) -> &AtomicBool {
        &s.environments
    }
}

impl Feed for Task {
    type Rec = TaskRecord;
    const KIND: &'static str = "Task";
    fn record(r: &Roster, obj: &Self) -> TaskRecord {
        convert::task_record(r, obj)
    }
    fn apply(r: &Roster, rec: TaskRecord) {
        r.apply_task(rec);
    }
    fn delete(r: &Roster, obj: &Self) {
        r.delete_task(&convert::task_env_key(r, obj), &obj.name_any());
    }
    fn reset(r: &Roster, recs: Vec<TaskRecord>) {
        r.reset_tasks(recs);
    }
    fn synced(s: &Synced) -> &AtomicBool {
        &s.tasks
    }
}

/// The label selector every envbridge object carries.
pub fn selector() -> String {
    format!("{}={}", labels::MANAGED_BY, labels::MANAGER)
}

/// Runs both watches until `stop` is cancelled.
pub async fn run(
    client: kube::Client,
    namespace: Option<&str>,
    roster: Arc<Roster>,
    metrics: Metrics,
    synced: Arc<Synced>,
    stop: CancellationToken,
) {
    let (env_api, task_api) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let envs = feed::<Environment>(
        env_api,
        roster.clone(),
        metrics.clone(),
        synced.clone(),
        stop.clone(),
    );
    let tasks = feed::<Task>(task_api, roster, metrics, synced, stop);
    tokio::join!(envs, tasks);
}

fn watch_config() -> watcher::Config {
    // Timeout below common load-balancer idle timeouts; pages flatten the relist spike.
    watcher::Config::default()
        .labels(&selector())
        .timeout(240)
        .page_size(500)
}

async fn feed<K: Feed>(
    api: Api<K>,
    roster: Arc<Roster>,
    metrics: Metrics,
    synced: Arc<Synced>,
    stop: CancellationToken,
) {
    let kind = Metrics::kind(K::KIND);
    let mut stream = new_stream::<K>(&api, &metrics);
    let mut buffer: Vec<K::Rec> = Vec::new();
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => return,
            next = stream.next() => next,
        };
        let event = match next {
            Some(Ok(ev)) => ev,
            Some(Err(e)) => {
                // Retryable by design: the watcher backs off and relists; never end the feed.
                tracing::warn!(kind = K::KIND, error = %e, "watch error, resuming");
                metrics.watch_restarts.get_or_create(&kind).inc();
                continue;
            }
            None => {
                tracing::warn!(kind = K::KIND, "watch stream ended, restarting");
                metrics.watch_restarts.get_or_create(&kind).inc();
                tokio::time::sleep(Duration::from_secs(1)).await;
                stream = new_stream::<K>(&api, &metrics);
                continue;
            }
        };
        metrics.watch_events.get_or_create(&kind).inc();
        match event {
            Event::Init => buffer.clear(),
            Event::InitApply(obj) => buffer.push(K::record(&roster, &obj)),
            Event::InitDone => {
                let n = buffer.len();
                K::reset(&roster, std::mem::take(&mut buffer));
                K::synced(&synced).store(true, Ordering::Release);
                tracing::info!(kind = K::KIND, objects = n, "roster relisted");
            }
            Event::Apply(obj) => K::apply(&roster, K::record(&roster, &obj)),
            Event::Delete(obj) => K::delete(&roster, &obj),
        }
        let sizes = roster.sizes();
        metrics.roster_environments.set(sizes.environments as i64);
        metrics.roster_tasks.set(sizes.tasks as i64);
    }
}

type Stream<K> = futures::stream::BoxStream<'static, Result<Event<K>, watcher::Error>>;

fn new_stream<K: Feed>(api: &Api<K>, metrics: &Metrics) -> Stream<K> {
    let metrics = metrics.clone();
    watcher::watcher(api.clone(), watch_config())
        .modify(move |o: &mut K| {
            observe_lag(&metrics, o.meta());
            // managedFields can be half an object's size and the roster never reads them.
            o.meta_mut().managed_fields = None;
        })
        .backoff(crate::launch::watch_backoff::watch_backoff())
        .boxed()
}

/// Lag between an object's last write (the newest managedFields time, second resolution) and
/// its arrival here. Old objects seen again in a relist are not lag: only recent writes count.
fn observe_lag(metrics: &Metrics, meta: &ObjectMeta) {
    let newest = meta
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.time.as_ref())
        .map(|t| t.0)
        .max();
    if let Some(t) = newest {
        let lag = jiff::Timestamp::now().duration_since(t).as_secs_f64();
        if (0.0..30.0).contains(&lag) {
            metrics.event_lag.observe(lag);
        }
    }
}

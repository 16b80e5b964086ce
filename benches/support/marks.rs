//! When the operator benchmark's objects reached their milestones (first and last Task,
//! Pod, pod Running), from watches of the benchmark's own.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envbridge::crd::Task;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

/// When the operator's objects reached their milestones, from the watches of this process:
/// the simulators' pod watch, and a metadata-only Task watch (cheap for the apiserver).
#[derive(Default)]
pub struct Marks {
    pub t0: Option<Instant>,
    pub total: usize,
    pub marks: Vec<(&'static str, Duration)>,
    tasks: HashSet<String>,
    pods: HashSet<String>,
    running: HashSet<String>,
}

pub type SharedMarks = Arc<std::sync::Mutex<Marks>>;

impl Marks {
    fn mark(&mut self, what: &'static str) {
        if let Some(t0) = self.t0
            && !self.marks.iter().any(|(w, _)| *w == what)
        {
            self.marks.push((what, t0.elapsed()));
        }
    }

    fn task(&mut self, name: String) {
        self.tasks.insert(name);
        self.mark("first Task created");
        if self.tasks.len() >= self.total {
            self.mark("all Tasks created");
        }
    }

    fn pod(&mut self, name: String, running: bool) {
        self.pods.insert(name.clone());
        self.mark("first Pod created");
        if self.pods.len() >= self.total {
            self.mark("all Pods created");
        }
        if running {
            self.running.insert(name);
            self.mark("first pod Running");
            if self.running.len() >= self.total {
                self.mark("all pods Running");
            }
        }
    }
}

pub fn record(marks: &SharedMarks, f: impl FnOnce(&mut Marks)) {
    if let Ok(mut m) = marks.lock() {
        f(&mut m);
    }
}

/// Feeds `marks` with the Tasks of `ns` as they appear, until cancelled.
pub fn watch_tasks(client: Client, ns: String, marks: SharedMarks, stop: CancellationToken) {
    let api = Api::<kube::core::PartialObjectMeta<Task>>::namespaced(client, &ns);
    watch_until(api, stop, move |t| {
        record(&marks, |m| m.task(t.metadata.name.unwrap_or_default()))
    });
}

/// Feeds `marks` with the Pods of `ns` (created, Running) as they change, until cancelled.
pub fn watch_pods(client: Client, ns: String, marks: SharedMarks, stop: CancellationToken) {
    watch_until(Api::<Pod>::namespaced(client, &ns), stop, move |pod| {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        record(&marks, |m| m.pod(pod.name_any(), running))
    });
}

/// Calls `on` with every object `api` reports applied, until `stop` is cancelled.
fn watch_until<K>(api: Api<K>, stop: CancellationToken, on: impl Fn(K) + Send + 'static)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        let mut w = watcher(api, Default::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                n = w.next() => n,
            };
            if let Some(Ok(obj)) = next {
                on(obj);
            }
        }
    });
}

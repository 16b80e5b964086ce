//! Wiring: one watch per kind into reflector stores (managedFields never decoded), the two
//! controllers (their reconciles counted, their state sampled for `/metrics`), shutdown.
//! Leader election around them: `leader`.

use std::sync::Arc;
use std::time::Duration;

use dashmap::{DashMap, DashSet};
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, controller, watcher};

use crate::launch::watch_backoff::watch_backoff;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::context::Ctx;
use super::control_api::ControlClient;
use super::lean::{self, Lean};
use super::metrics::{self, Metrics, Sample, Sampler};
use super::stored_pod::StoredPod;
use super::stored_service::StoredService;
use super::trim;
use super::{OperatorArgs, Result, env_controller, task_controller};
use crate::crd::{Environment, Task, TaskSet, TaskTemplate, labels};

fn scoped<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A watch with backoff, managedFields never decoded ([`Lean`]) and `trim` applied (the store
/// keeps only what the operator reads), mirrored into a store; each event also given to
/// `feed` before the store takes it: once the store has listed (the gate reconciles wait
/// for), whatever `feed` fills has too.
fn reflect<K>(
    api: Api<Lean<K>>,
    cfg: watcher::Config,
    trim: fn(&mut K),
    feed: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> (
    Store<K>,
    impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, cfg)
            .map_ok(lean::unwrap)
            .backoff(watch_backoff())
            .modify(trim)
            .inspect(move |ev| {
                if let Ok(ev) = ev {
                    feed(ev);
                }
            }),
    );
    (reader, stream)
}

fn drain<S, T>(name: &'static str, s: S) -> tokio::task::JoinHandle<()>
where
    S: Stream<Item = watcher::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(async move {
        s.for_each(|r| {
            if let Err(e) = r {
                warn!(watch = name, error = %e, "watch error (retrying)");
            }
            std::future::ready(())
        })
        .await
    })
}

fn log_errors<T>(
    s: impl Stream<Item = watcher::Result<T>>,
    name: &'static str,
) -> impl Stream<Item = watcher::Result<T>> {
    s.inspect(move |r| {
        if let Err(e) = r {
            warn!(watch = name, error = %e, "watch error (retrying)");
        }
    })
}

/// Resolves once every store has its first complete list. One waiter per store: kube's
/// `Store::wait_until_ready` wakes a single waiter reliably, not hundreds of reconciles.
/// Even that wake-up was seen lost (the gate then opened only at the next re-poll, 10 s
/// later, delaying every first reconcile), so the waiter is re-polled every 100 ms.
async fn all_listed(stores: Vec<(&'static str, BoxFuture<'static, ()>)>) {
    const REPOLL: Duration = Duration::from_millis(100);
    const WARN_EVERY: u32 = 100; // 10 s
    for (name, mut fut) in stores {
        let mut polls = 0u32;
        while tokio::time::timeout(REPOLL, &mut fut).await.is_err() {
            polls += 1;
            if polls.is_multiple_of(WARN_EVERY) {
                warn!(store = name, "watch has not listed yet");
            }
        }
    }
}

fn listed<K>(store: &Store<K>) -> BoxFuture<'static, ()>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let store = store.clone();
    async move {
        let _ = store.wait_until_ready().await;
    }
    .boxed()
}

/// What `/metrics` and `/readyz` read of the running controllers (the context, not kept alive
/// by the reading).
fn sampler(ctx: &Arc<Ctx>) -> Sampler {
    let ctx = Arc::downgrade(ctx);
    Box::new(move || {
        let ctx = ctx.upgrade()?;
        let states = ctx.tasks.state();
        Some(Sample {
            listed: *ctx.listed.borrow(),
            live_followers: ctx.live.following(),
            tasks: Sample::count_tasks(
                states
                    .iter()
                    .map(|t| t.status.as_ref().and_then(|s| s.state)),
            ),
        })
    })
}

/// Runs both controllers until `shutdown` fires (no leader election: callers that need it use
/// `leader::run`); their reconciles are counted in `metrics`.
pub async fn run_controllers(
    client: Client,
    args: OperatorArgs,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
) -> Result<()> {
    let ns = args.namespace.clone();
    let ns = ns.as_deref();
    // A shard sees its own objects only (unsharded: those without the label), filtered by
    // the apiserver; Nodes and TaskTemplates are the cluster's, shared by every shard.
    let shard = crate::crd::shard::selector(args.shard.as_deref());
    let managed = watcher::Config::default()
        .labels(&format!(
            "{}={},{shard}",
            labels::MANAGED_BY,
            labels::MANAGER
        ))
        .any_semantic();
    let plain = watcher::Config::default().any_semantic();
    let sharded = watcher::Config::default().labels(&shard).any_semantic();

    let (tasks, task_stream) = reflect(
        scoped::<Lean<Task>>(&client, ns),
        managed.clone(),
        trim::task,
        |_| {},
    );
    let (pods, pod_stream) = reflect(
        scoped::<Lean<StoredPod>>(&client, ns),
        managed.clone(),
        trim::pod,
        |_| {},
    );
    let (services, svc_stream) = reflect(
        scoped::<Lean<StoredService>>(&client, ns),
        managed.clone(),
        trim::service,
        |_| {},
    );
    let (task_sets, set_stream) = reflect(
        scoped::<Lean<TaskSet>>(&client, ns),
        sharded.clone(),
        trim::keep,
        |_| {},
    );
    // The Node watch feeds the index a pod's node is looked up in (the store: the listed gate).
    let node_index: Arc<super::nodes::NodeIndex> = Arc::default();
    let ix = node_index.clone();
    let (nodes, node_stream) = reflect(
        Api::<Lean<Node>>::all(client.clone()),
        plain.clone(),
        trim::node,
        move |ev| ix.observe(ev),
    );
    let (templates, tmpl_stream) = reflect(
        Api::<Lean<TaskTemplate>>::all(client.clone()),
        plain.clone(),
        trim::keep,
        |_| {},
    );
    let background = [
        drain("nodes", node_stream),
        drain("tasktemplates", tmpl_stream),
    ];

    let reporter = Reporter {
        controller: super::FIELD_MANAGER.into(),
        instance: args
            .lease
            .identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok()),
    };
    let (listed_tx, listed_rx) = tokio::sync::watch::channel(false);
    let gate = all_listed(vec![
        ("tasks", listed(&tasks)),
        ("pods", listed(&pods)),
        ("services", listed(&services)),
        ("tasksets", listed(&task_sets)),
        ("nodes", listed(&nodes)),
        ("tasktemplates", listed(&templates)),
    ]);
    let gate = tokio::spawn(async move {
        gate.await;
        let _ = listed_tx.send(true);
    });
    // A follower that sees a task change by itself, or a transition call that ends, wakes
    // that task's reconcile.
    let (wake_tx, wake_rx) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<Task>>();
    // ENVBRIDGE_CONTROL_ALLOW_REMOTE is read here, once per start (docs/operator.md).
    let control = ControlClient::from_env();
    let ctx = Arc::new(Ctx {
        transitions: super::transition_calls::TransitionCalls::new(wake_tx.clone()),
        live: Arc::new(super::live::Live::new(wake_tx, control.clone())),
        control,
        calls: Arc::default(),
        listed: listed_rx,
        recorder: Recorder::new(client.clone(), reporter),
        pod_settings: args.pod_settings(),
        client: client.clone(),
        args: args.clone(),
        tasks: tasks.clone(),
        task_index: Arc::default(),
        pods,
        services,
        node_index,
        templates,
        task_sets,
        verified: DashSet::new(),
        answered: DashMap::new(),
        status_written: DashMap::new(),
        set_hashes: DashMap::new(),
        requested: DashMap::new(),
    });
    let _sampled = metrics.attach(sampler(&ctx));

    let task_cfg = controller::Config::default().concurrency(args.task_concurrency);
    // No debounce: a Task's answer reaches its Environment's reconcile at once; progress
    // writes are coalesced there instead (`status_pace`), never the outcome.
    let env_cfg = controller::Config::default().concurrency(args.env_concurrency);

    // One Task watch serves both controllers: each Task event also asks for a reconcile of
    // its Environment (instead of a second watch of every Task).
    let (env_tx, env_rx) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<Environment>>();
    let index = ctx.task_index.clone();
    let task_stream = log_errors(task_stream, "tasks").inspect(move |ev| {
        if let Ok(ev) = ev {
            index.observe(ev);
        }
        let one = |t: &Task| {
            if let Some(ns) = t.namespace() {
                let _ = env_tx.send(ObjectRef::new(&t.spec.environment).within(&ns));
            }
        };
        if let Ok(
            watcher::Event::Apply(t) | watcher::Event::Delete(t) | watcher::Event::InitApply(t),
        ) = ev
        {
            one(t);
        }
    });
    let env_triggers = tokio_stream::wrappers::UnboundedReceiverStream::new(env_rx);

    let stop = shutdown.clone();
    let m = metrics.clone();
    let task_ctl = controller::Controller::for_stream(task_stream.applied_objects(), tasks)
        .owns_stream(log_errors(pod_stream, "pods").touched_objects())
        .owns_stream(log_errors(svc_stream, "services").touched_objects())
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            wake_rx,
        ))
        .with_config(task_cfg)
        .trigger_backoff(watch_backoff())
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(
            task_controller::reconcile,
            task_controller::error_policy,
            ctx.clone(),
        )
        .for_each(move |r| {
            m.reconciled(metrics::TASK, &r);
            if let Err(e) = r {
                tracing::debug!(error = %e, "task reconcile");
            }
            std::future::ready(())
        });

    let stop = shutdown.clone();
    let m = metrics.clone();
    let env_ctl = controller::Controller::new(scoped::<Environment>(&client, ns), sharded)
        .reconcile_on(env_triggers)
        .watches_stream(
            log_errors(set_stream, "tasksets").applied_objects(),
            |set: TaskSet| {
                let ns = set.namespace()?;
                Some(ObjectRef::<Environment>::new(&set.spec.environment).within(&ns))
            },
        )
        .with_config(env_cfg)
        .trigger_backoff(watch_backoff())
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(
            env_controller::reconcile,
            env_controller::error_policy,
            ctx.clone(),
        )
        .for_each(move |r| {
            m.reconciled(metrics::ENVIRONMENT, &r);
            if let Err(e) = r {
                tracing::debug!(error = %e, "environment reconcile");
            }
            std::future::ready(())
        });

    info!(
        namespace = ns.unwrap_or("<all>"),
        shard = args.shard.as_deref().unwrap_or("<none>"),
        control_allow_remote = ctx.control.allow_remote(),
        "operator controllers running"
    );
    futures::join!(task_ctl, env_ctl);
    ctx.transitions.wait_idle().await;
    gate.abort();
    for h in background {
        h.abort();
    }
    info!("operator controllers stopped");
    Ok(())
}

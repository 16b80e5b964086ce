//! A simulated cluster side for the daemon tests, standing in for the operator where a test
//! needs exact control (delays, failures): it reads Environments and their TaskSets from the
//! REAL apiserver, creates the Task objects (owned by the Environment), and answers
//! transitions by writing Task and Environment status, as the operator does (the Environment's
//! with the operator's own aggregation).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envbridge::crd::{Environment, Task, TaskSet, TaskSpec, labels};
use envbridge::operator::aggregate::aggregate;
use envbridge::plan::TaskRef;
use envbridge::state::{Event, State};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub struct SimConfig {
    /// (task name, event) -> error message: that task fails that event.
    pub fail: std::collections::HashMap<(String, Event), String>,
    /// Pause after each task's transition (spreads a transition over time).
    pub step_delay: Duration,
}

pub struct Sim {
    pub cfg: Arc<Mutex<SimConfig>>,
    stop: CancellationToken,
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Sim {
    pub fn start(client: Client, ns: &str, cfg: SimConfig) -> Sim {
        let cfg = Arc::new(Mutex::new(cfg));
        let stop = CancellationToken::new();
        let (c, s, n) = (cfg.clone(), stop.clone(), ns.to_string());
        tokio::spawn(async move {
            let mut created = BTreeSet::new();
            while !s.is_cancelled() {
                if let Err(e) = round(&client, &n, &c, &s, &mut created).await {
                    eprintln!("sim: {e}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Sim { cfg, stop }
    }

    pub fn fail(&self, task: &str, event: Event, message: &str) {
        self.cfg
            .lock()
            .expect("sim config")
            .fail
            .insert((task.to_string(), event), message.to_string());
    }
}

fn managed(env: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
        (labels::ENVIRONMENT.to_string(), env.to_string()),
    ])
}

async fn round(
    client: &Client,
    ns: &str,
    cfg: &Arc<Mutex<SimConfig>>,
    stop: &CancellationToken,
    created: &mut BTreeSet<String>,
) -> Result<(), kube::Error> {
    let envs: Api<Environment> = Api::namespaced(client.clone(), ns);
    let tasks: Api<Task> = Api::namespaced(client.clone(), ns);
    let sets: Api<TaskSet> = Api::namespaced(client.clone(), ns);
    for env in envs.list(&ListParams::default()).await?.items {
        if env.metadata.deletion_timestamp.is_some() || stop.is_cancelled() {
            continue;
        }
        let name = env.name_any();
        // Reads across kinds are not one snapshot: a set named by the Environment read here
        // may be gone (re-packed by a kill), so an incomplete view is not acted on.
        let mut refs: Vec<TaskRef> = Vec::new();
        let mut complete = true;
        for r in &env.spec.task_sets {
            match sets.get_opt(&r.name).await? {
                Some(ts) => refs.extend(ts.spec.tasks),
                None => complete = false,
            }
        }
        if !complete {
            continue;
        }
        let uid = env.uid().unwrap_or_default();
        let by_env = ListParams::default().labels(&format!("{}={}", labels::ENVIRONMENT, name));
        let existing: BTreeMap<String, Task> = tasks
            .list(&by_env)
            .await?
            .items
            .into_iter()
            .map(|t| (t.name_any(), t))
            .collect();
        let wanted: BTreeSet<&str> = refs.iter().map(|t| t.name.as_str()).collect();
        // Tasks no longer in the environment's sets (killed) are deleted.
        for n in existing.keys().filter(|n| !wanted.contains(n.as_str())) {
            let _ = tasks.delete(n, &DeleteParams::background()).await;
        }
        let owner = OwnerReference {
            api_version: Environment::api_version(&()).to_string(),
            kind: Environment::kind(&()).to_string(),
            name: name.clone(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        // As the operator: Tasks are created once, so a killed task stays gone even when this
        // round read the Environment from before the kill.
        let missing: Vec<&TaskRef> = if created.contains(&uid) {
            Vec::new()
        } else {
            refs.iter()
                .filter(|t| !existing.contains_key(&t.name))
                .collect()
        };
        for t in missing {
            let mut task = Task::new(
                &t.name,
                TaskSpec {
                    environment: name.clone(),
                    task: t.clone(),
                    transition: None,
                },
            );
            task.metadata.labels = Some(managed(&name));
            task.metadata.owner_references = Some(vec![owner.clone()]);
            match tasks.create(&PostParams::default(), &task).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(e),
            }
            let status = json!({"status": {
                "state": State::Standby, "podPhase": "Running", "podIP": format!("127.0.0.{}", 10 + t.control_port % 200),
                "nodeName": format!("{}.cluster.local", t.node),
            }});
            tasks
                .patch_status(&t.name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
        }
        created.insert(uid);
        let Some(tr) = env.spec.transition.clone() else {
            publish(&envs, &tasks, &env, &by_env).await?;
            continue;
        };
        for t in &refs {
            if stop.is_cancelled() {
                return Ok(());
            }
            let acted = existing
                .get(&t.name)
                .and_then(|x| x.status.as_ref())
                .and_then(|s| s.transition.as_ref())
                .is_some_and(|x| x.id == tr.id);
            if acted {
                continue;
            }
            tasks
                .patch(
                    &t.name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"transition": tr}})),
                )
                .await?;
            let (delay, failure) = {
                let c = cfg.lock().expect("sim config");
                (
                    c.step_delay,
                    c.fail.get(&(t.name.clone(), tr.event)).cloned(),
                )
            };
            tokio::time::sleep(delay).await;
            let status = match &failure {
                Some(msg) => json!({"status": {"state": State::Error, "message": msg,
                    "transition": {"id": tr.id, "event": tr.event, "phase": "Failed", "message": msg}}}),
                None => json!({"status": {"state": tr.event.target(), "message": null,
                    "transition": {"id": tr.id, "event": tr.event, "phase": "Succeeded"}}}),
            };
            tasks
                .patch_status(&t.name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
            // As the operator reconciles on every Task change: a failure shows at once.
            publish(&envs, &tasks, &env, &by_env).await?;
        }
        publish(&envs, &tasks, &env, &by_env).await?;
    }
    Ok(())
}

/// Writes the Environment's status from its Tasks with the operator's own aggregation, the
/// one place that decides a transition's outcome (the daemon only reads it).
async fn publish(
    envs: &Api<Environment>,
    tasks: &Api<Task>,
    env: &Environment,
    by_env: &ListParams,
) -> Result<(), kube::Error> {
    let listed = tasks.list(by_env).await?.items;
    let mine: Vec<&Task> = listed.iter().collect();
    let agg = aggregate(
        env.spec.desired_state,
        env.spec.transition.as_ref(),
        &mine,
        env.spec.tasks as usize,
    );
    let some = |n: usize| (n > 0).then_some(n as u32);
    let unchanged = env.status.as_ref().is_some_and(|s| {
        s.state == Some(agg.state)
            && s.counts == agg.counts
            && s.ready.as_deref() == Some(agg.ready.as_str())
            && s.failing_tasks == agg.failing_tasks
            && s.failing_count == some(agg.failing_count)
            && s.failing_critical == some(agg.failing_critical)
            && s.transition == agg.transition
    });
    if unchanged {
        return Ok(());
    }
    let status = json!({"status": {
        "state": agg.state,
        "counts": agg.counts,
        "ready": agg.ready,
        "failingTasks": agg.failing_tasks,
        "failingCount": some(agg.failing_count),
        "failingCritical": some(agg.failing_critical),
        "transition": agg.transition,
    }});
    envs.patch_status(
        &env.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&status),
    )
    .await?;
    Ok(())
}

//! Which containers `envbridge logs ENV [TASK]` reads: the Environment (by id or name, in one
//! namespace or all), its Tasks (label `envbridge.dev/environment` and `spec.environment`),
//! and each Task's Pod (same name and namespace) with the container to read. Read-only.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::crd::{Environment, Task, labels};
use crate::model::label::label_value;

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("environment {id:?} not found ({where_})")]
    EnvNotFound { id: String, where_: String },
    #[error("environment {id:?} is ambiguous: {candidates}; name it as NAMESPACE/NAME")]
    Ambiguous { id: String, candidates: String },
    #[error("environment {env} has no tasks (yet)")]
    NoTasks { env: String },
    #[error("task {task:?} not found in environment {env} (its tasks: {known})")]
    TaskNotFound {
        task: String,
        env: String,
        known: String,
    },
    #[error("task {task}: {reason}")]
    NotStarted { task: String, reason: String },
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> TargetError {
    let what = what.into();
    move |source| TargetError::Kube { what, source }
}

/// One container to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogTarget {
    /// The task's name (its TaskRef name), used as the line prefix.
    pub task: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// The containers to read, and the tasks whose container cannot be read yet (with why).
#[derive(Debug, Default)]
pub struct Targets {
    pub ready: Vec<LogTarget>,
    pub not_started: Vec<TargetError>,
}

/// The Environment `id` names: `NAMESPACE/NAME`, or a name or `spec.id` looked up in
/// `namespace` (all namespaces when None).
pub async fn find_environment(
    client: &Client,
    id: &str,
    namespace: Option<&str>,
) -> Result<Environment, TargetError> {
    if let Some((ns, name)) = id.split_once('/') {
        let api: Api<Environment> = Api::namespaced(client.clone(), ns);
        return api
            .get_opt(name)
            .await
            .map_err(kube_err(format!("get environment {id}")))?
            .ok_or_else(|| TargetError::EnvNotFound {
                id: id.into(),
                where_: format!("namespace {ns}"),
            });
    }
    let api: Api<Environment> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(kube_err("list environments"))?;
    let mut found: Vec<Environment> = list
        .items
        .into_iter()
        .filter(|e| e.name_any() == id || e.spec.id == id)
        .collect();
    match found.len() {
        0 => Err(TargetError::EnvNotFound {
            id: id.into(),
            where_: match namespace {
                Some(ns) => format!("namespace {ns}, by name or id"),
                None => "any namespace, by name or id".into(),
            },
        }),
        1 => Ok(found.remove(0)),
        _ => Err(TargetError::Ambiguous {
            id: id.into(),
            candidates: found
                .iter()
                .map(|e| format!("{}/{}", e.namespace().unwrap_or_default(), e.name_any()))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The task containers of `env` (only `task` when given: by task name or Task object name).
pub async fn find_targets(
    client: &Client,
    env: &Environment,
    task: Option<&str>,
) -> Result<Targets, TargetError> {
    let ns = env.namespace().unwrap_or_default();
    let env_name = env.name_any();
    let tasks_api: Api<Task> = Api::namespaced(client.clone(), &ns);
    let selector = format!("{}={}", labels::ENVIRONMENT, label_value(&env_name));
    let mut tasks: Vec<Task> = tasks_api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_err(format!(
            "list tasks of environment {ns}/{env_name}"
        )))?
        .items
        .into_iter()
        .filter(|t| t.spec.environment == env_name)
        .collect();
    tasks.sort_by(|a, b| a.spec.task.name.cmp(&b.spec.task.name));
    if tasks.is_empty() {
        return Err(TargetError::NoTasks {
            env: format!("{ns}/{env_name}"),
        });
    }
    if let Some(want) = task {
        let known = tasks
            .iter()
            .map(|t| t.spec.task.name.clone())
            .collect::<Vec<_>>();
        tasks.retain(|t| t.spec.task.name == want || t.name_any() == want);
        if tasks.is_empty() {
            return Err(TargetError::TaskNotFound {
                task: want.into(),
                env: format!("{ns}/{env_name}"),
                known: abbreviate(&known, 10),
            });
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut out = Targets::default();
    for t in tasks {
        let pod_name = t.name_any();
        let pod = pods
            .get_opt(&pod_name)
            .await
            .map_err(kube_err(format!("get pod {ns}/{pod_name}")))?;
        let name = t.spec.task.name.clone();
        match pod.as_ref().map(readable) {
            Some(Ok(container)) => out.ready.push(LogTarget {
                task: name,
                namespace: ns.clone(),
                pod: pod_name,
                container,
            }),
            Some(Err(reason)) => out
                .not_started
                .push(TargetError::NotStarted { task: name, reason }),
            None => out.not_started.push(TargetError::NotStarted {
                task: name,
                reason: format!("no pod yet (pod {ns}/{pod_name} does not exist)"),
            }),
        }
    }
    Ok(out)
}

fn abbreviate(names: &[String], max: usize) -> String {
    let mut s = names
        .iter()
        .take(max)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > max {
        s.push_str(&format!(", ... ({} in all)", names.len()));
    }
    s
}

/// The container to read from `pod`, or why there is no log yet (not scheduled, or the
/// container has not started).
pub fn readable(pod: &Pod) -> Result<String, String> {
    let name = pod.name_any();
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| format!("pod {name} has no spec"))?;
    let container = pod
        .annotations()
        .get("kubectl.kubernetes.io/default-container")
        .cloned()
        .or_else(|| spec.containers.first().map(|c| c.name.clone()))
        .ok_or_else(|| format!("pod {name} has no container"))?;
    let status = pod.status.as_ref();
    if spec.node_name.is_none() {
        let why = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
            .and_then(|c| c.message.clone())
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        return Err(format!("pod {name} is not scheduled yet{why}"));
    }
    let state = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container))
        .and_then(|c| c.state.clone());
    match state {
        Some(s) if s.running.is_some() || s.terminated.is_some() => Ok(container),
        Some(s) => {
            let why = s
                .waiting
                .and_then(|w| w.reason)
                .map(|r| format!(" ({r})"))
                .unwrap_or_default();
            Err(format!(
                "container {container} of pod {name} has not started yet{why}"
            ))
        }
        None => Err(format!(
            "container {container} of pod {name} has not started yet"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: Option<&str>, state: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "e1-readout-flp001"},
            "spec": {"nodeName": node, "containers": [{"name": "task"}, {"name": "side"}]},
            "status": {
                "conditions": [{"type": "PodScheduled", "status": "False",
                                "message": "0/4 nodes are available"}],
                "containerStatuses": [{
                    "name": "task", "image": "x", "imageID": "", "ready": false,
                    "restartCount": 0, "state": state,
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_is_readable_once_its_container_started() {
        let running = serde_json::json!({"running": {}});
        assert_eq!(
            readable(&pod(Some("flp001"), running.clone())),
            Ok("task".into())
        );
        let ended = serde_json::json!({"terminated": {"exitCode": 1}});
        assert_eq!(readable(&pod(Some("flp001"), ended)), Ok("task".into()));

        let err = readable(&pod(None, running)).unwrap_err();
        assert_eq!(
            err,
            "pod e1-readout-flp001 is not scheduled yet: 0/4 nodes are available"
        );
        let waiting = serde_json::json!({"waiting": {"reason": "ContainerCreating"}});
        let err = readable(&pod(Some("flp001"), waiting)).unwrap_err();
        assert_eq!(
            err,
            "container task of pod e1-readout-flp001 has not started yet (ContainerCreating)"
        );
    }

    #[test]
    fn long_task_lists_are_cut() {
        let names: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
        assert_eq!(abbreviate(&names[..2], 10), "t0, t1");
        assert!(abbreviate(&names, 10).ends_with("t9, ... (12 in all)"));
    }
}

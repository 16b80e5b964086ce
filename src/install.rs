//! Installing what a cluster needs before environments can run: the CRDs and the TaskTemplates.
//!
//! Server-side apply throughout: the TaskTemplate CRD embeds the PodSpec schema (~0.5 MB), too
//! large for client-side apply's last-applied annotation.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, CustomResourceExt};

use crate::crd::{Environment, Task, TaskSet, TaskTemplate};

const FIELD_MANAGER: &str = "envbridge-install";

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("applying {what}: {source}")]
    Apply {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("CRD {0} was not established within {1:?}")]
    NotEstablished(String, Duration),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a TaskTemplate: {message}")]
    Parse { path: PathBuf, message: String },
}

/// Apply every envbridge CRD and wait until the apiserver serves them.
pub async fn crds(client: &Client) -> Result<(), InstallError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let all = [
        Environment::crd(),
        TaskSet::crd(),
        Task::crd(),
        TaskTemplate::crd(),
    ];
    for crd in &all {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(crd))
            .await
            .map_err(|source| InstallError::Apply {
                what: format!("CRD {name}"),
                source,
            })?;
    }
    let limit = Duration::from_secs(30);
    for crd in &all {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        match tokio::time::timeout(limit, established).await {
            Ok(Ok(_)) => {}
            _ => return Err(InstallError::NotEstablished(name, limit)),
        }
    }
    Ok(())
}

/// Read every TaskTemplate in `dir` (`*.yaml`, several documents per file allowed; the
/// directory's kustomization.yaml, which lists them for `kubectl apply -k`, is not one).
pub fn read_task_templates(dir: &Path) -> Result<Vec<TaskTemplate>, InstallError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| InstallError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| InstallError::Read {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .filter(|p| p.file_stem().is_none_or(|s| s != "kustomization"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let text = read(&path)?;
        let docs: Vec<TaskTemplate> =
            serde_saphyr::from_multiple(&text).map_err(|e| InstallError::Parse {
                path: path.clone(),
                message: e.to_string(),
            })?;
        out.extend(docs);
    }
    Ok(out)
}

/// Apply the TaskTemplates found in `dir`; returns their names.
pub async fn task_templates(client: &Client, dir: &Path) -> Result<Vec<String>, InstallError> {
    let api: Api<TaskTemplate> = Api::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for tt in read_task_templates(dir)? {
        let name = tt.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(&tt))
            .await
            .map_err(|source| InstallError::Apply {
                what: format!("TaskTemplate {name}"),
                source,
            })?;
        names.push(name);
    }
    Ok(names)
}

//! Setup shared by the cluster benchmarks (daemon, operator): size knobs, namespaces, peak
//! RSS of a child process. Each bench includes it with `mod support;`.

#![allow(dead_code)] // each bench uses its own subset

pub mod sims;
pub mod tasks;

use std::path::Path;

use envbridge::crd::TaskTemplate;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

pub type Res<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A size knob from the environment (`BENCH_NODES=50`), else `default`.
pub fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fresh namespace labelled as a benchmark's (so that leftovers are easy to find).
pub async fn create_ns(admin: &Client, name: &str) -> Res {
    let ns = envbridge::dev::fixtures::labelled_namespace(name, "envbridge.dev/bench");
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

/// Deletes a namespace this benchmark created (in the background; gone already is fine).
pub async fn delete_ns(admin: &Client, name: &str) {
    let _ = Api::<Namespace>::all(admin.clone())
        .delete(name, &DeleteParams::background())
        .await;
}

/// The CRDs, and the TaskTemplates of `manifests/task-templates/<class>.yaml` for `classes`.
pub async fn install(admin: &Client, classes: &[&str]) -> Res {
    envbridge::install::crds(admin).await?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/task-templates");
    for class in classes {
        let path = root.join(format!("{class}.yaml"));
        envbridge::dev::fixtures::apply_file(admin, &path, "envbridge-bench").await?;
    }
    Ok(())
}

/// Applies one TaskTemplate object (a bench's own, not from a file).
pub async fn apply_template(admin: &Client, tt: &TaskTemplate) -> Res {
    let name = tt.metadata.name.clone().unwrap_or_default();
    Api::<TaskTemplate>::all(admin.clone())
        .patch(
            &name,
            &PatchParams::apply("envbridge-bench").force(),
            &Patch::Apply(tt),
        )
        .await?;
    Ok(())
}

/// Peak resident set (VmHWM) of a process, KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

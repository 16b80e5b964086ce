//! Setup shared by the cluster benchmarks (daemon, operator, live, realnode): size knobs,
//! namespaces and their cleanup, child processes and their peak RSS. Each bench includes it
//! with `mod support;`.

#![allow(dead_code)] // each bench uses its own subset

pub mod costs;
pub mod drive;
pub mod floor;
pub mod marks;
pub mod nodemem;
pub mod operator_proc;
pub mod plane;
pub mod pods;
pub mod sims;
pub mod stack;
pub mod tasks;

use std::path::Path;
use std::time::{Duration, Instant};

use envbridge::crd::{Environment, Task, TaskTemplate};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Res<T = ()> = Result<T, Error>;

/// A size knob from the environment (`BENCH_NODES=50`), else `default`.
pub fn env_num(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("{name}={v:?}: not a whole number of 0 or more");
            std::process::exit(2)
        }),
    }
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
    status_kib(pid, "VmHWM:")
}

/// Resident set now (VmRSS) of a process, KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// How many of the kinds Environment, Task, Pod and Service still have an object in `ns`
/// (0: none left; one list of at most one item per kind).
pub async fn objects_left(admin: &Client, ns: &str) -> Res<usize> {
    let lp = ListParams::default().limit(1);
    Ok(Api::<Environment>::namespaced(admin.clone(), ns)
        .list(&lp)
        .await?
        .items
        .len()
        + Api::<Task>::namespaced(admin.clone(), ns)
            .list(&lp)
            .await?
            .items
            .len()
        + Api::<Pod>::namespaced(admin.clone(), ns)
            .list(&lp)
            .await?
            .items
            .len()
        + Api::<Service>::namespaced(admin.clone(), ns)
            .list(&lp)
            .await?
            .items
            .len())
}

/// Waits (polling every 100 ms) until `ns` holds no Environment, Task, Pod or Service.
pub async fn wait_gone(admin: &Client, ns: &str, within: Duration) -> Res {
    let deadline = Instant::now() + within;
    while objects_left(admin, ns).await? > 0 {
        if Instant::now() > deadline {
            return Err(format!("objects left in {ns} after {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// First half of a cleanup on any path, while the operator still runs: deletes every
/// Environment of `ns` and waits (at most `within`) for the operator to remove their Tasks.
pub async fn delete_environments(admin: &Client, ns: &str, within: Duration) {
    let envs: Api<Environment> = Api::namespaced(admin.clone(), ns);
    let _ = envs
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let _ = wait_gone(admin, ns, within).await;
}

/// Second half, once the operator is stopped: drops the finalizers of what is left (an
/// operator that died cannot remove them, and the namespace would never go), deletes the
/// namespace and waits (at most `within`) until it is gone.
pub async fn purge_namespace(admin: &Client, ns: &str, within: Duration) -> Res {
    let strip = serde_json::json!({"metadata": {"finalizers": null}});
    let pp = PatchParams::default();
    let envs: Api<Environment> = Api::namespaced(admin.clone(), ns);
    let tasks: Api<Task> = Api::namespaced(admin.clone(), ns);
    for e in envs.list(&ListParams::default()).await?.items {
        let _ = envs.patch(&e.name_any(), &pp, &Patch::Merge(&strip)).await;
    }
    for t in tasks.list(&ListParams::default()).await?.items {
        let _ = tasks.patch(&t.name_any(), &pp, &Patch::Merge(&strip)).await;
    }
    delete_ns(admin, ns).await;
    let nss: Api<Namespace> = Api::all(admin.clone());
    let deadline = Instant::now() + within;
    while nss.get_opt(ns).await?.is_some() {
        if Instant::now() > deadline {
            return Err(format!("namespace {ns} still there after {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// `envbridge ARGS` (the bench's own build) as a child process, output to `log` (at the
/// level BENCH_CHILD_LOG, default info): in its own
/// process group (a Ctrl-C at the terminal reaches only the benchmark, which then stops it
/// in order), and sent SIGTERM if the benchmark dies (PR_SET_PDEATHSIG) or drops it.
pub fn spawn_envbridge(args: &[&str], kubeconfig: &Path, log: &Path) -> Res<tokio::process::Child> {
    let level = std::env::var("BENCH_CHILD_LOG").unwrap_or_else(|_| "info".into());
    spawn_envbridge_logging(args, kubeconfig, log, &level)
}

/// [`spawn_envbridge`] with the child's `RUST_LOG` given.
pub fn spawn_envbridge_logging(
    args: &[&str],
    kubeconfig: &Path,
    log: &Path,
    rust_log: &str,
) -> Res<tokio::process::Child> {
    let out = std::fs::File::create(log)?;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_envbridge"));
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", rust_log)
        .stdin(std::process::Stdio::null())
        .stderr(out.try_clone()?)
        .stdout(out)
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: prctl(2) only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    Ok(cmd.spawn()?)
}

/// SIGTERM to a child this benchmark started, SIGKILL after `grace`; reaped either way.
pub async fn stop_child(child: &mut tokio::process::Child, grace: Duration) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) of our own child, by its pid.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// A free loopback port's address, for a child's listener.
pub fn free_loopback() -> Res<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok(format!("127.0.0.1:{port}"))
}

/// The whole HTTP/1.0 answer (status line, headers, body) of `GET path` at `addr`; empty
/// while nothing listens there.
pub async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut out = String::new();
    if s.write_all(req.as_bytes()).await.is_err() {
        return out;
    }
    let _ = s.read_to_string(&mut out).await;
    out
}

/// Milliseconds, as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p`-th percentile (0..=100) of `v`, nearest rank.
pub fn pct(v: &[Duration], p: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    if s.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

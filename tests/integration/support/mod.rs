//! Shared harness of the integration tests.
//!
//! - [`cluster`] makes sure the local control plane runs (starting it if none does; a file
//!   lock makes concurrent test processes start it once) and PANICS with the reason when it
//!   cannot: cluster tests are never skipped.
//! - [`TestNamespace::new`] gives a test a fresh namespace with a random suffix and a
//!   kube::Client; the namespace is deleted when the value is dropped (also on panic).

#![allow(dead_code)]

pub mod refusal;

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envbridge::dev::ClusterInfo;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use tokio::sync::OnceCell;

/// Simulated nodes every test may rely on (flp001 .. flp004).
pub const NODES: u32 = 4;

static CLUSTER: OnceCell<ClusterInfo> = OnceCell::const_new();

/// The running control plane, started if needed. Panics with the reason on failure.
pub async fn cluster() -> ClusterInfo {
    CLUSTER
        .get_or_init(|| async {
            match envbridge::dev::ensure_up(NODES).await {
                Ok(info) => info,
                Err(e) => panic!("the local control plane cannot start: {e}"),
            }
        })
        .await
        .clone()
}

/// Real nodes every real-node test may rely on (real001 .. real003; real003 is the one the
/// node-loss test kills, so the others never see it go).
pub const REAL_NODES: u32 = 3;

static REAL: OnceCell<ClusterInfo> = OnceCell::const_new();

/// The running control plane with [`REAL_NODES`] real nodes too (a kubelet and a containerd
/// each, running the images of this build's envbridge), started if needed. Panics with the
/// reason on failure.
pub async fn real_cluster() -> ClusterInfo {
    REAL.get_or_init(|| async {
        cluster().await;
        let spec = envbridge::dev::UpSpec {
            nodes: NODES,
            real_nodes: REAL_NODES,
            exe: Some(env!("CARGO_BIN_EXE_envbridge").into()),
            ..Default::default()
        };
        match envbridge::dev::ensure_up_with(&spec).await {
            Ok(info) => info,
            Err(e) => panic!("the local control plane's real nodes cannot start: {e}"),
        }
    })
    .await
    .clone()
}

/// A new kube client bound to the calling test's runtime.
pub async fn client() -> Client {
    let info = cluster().await;
    envbridge::dev::client_for(&info.kubeconfig)
        .await
        .unwrap_or_else(|e| panic!("no client for {}: {e}", info.kubeconfig.display()))
}

/// A short random lowercase suffix (no extra dependency: std's random hasher keys).
pub fn random_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    format!("{:08x}", h.finish() as u32)
}

/// A namespace owned by one test.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
    pub info: ClusterInfo,
}

impl TestNamespace {
    /// Create `<prefix>-<random>` (prefix is shortened to keep the name valid).
    pub async fn new(prefix: &str) -> TestNamespace {
        let info = cluster().await;
        let client = client().await;
        let prefix: String = prefix
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let name = format!("{}-{}", prefix.trim_matches('-'), random_suffix());
        let api: Api<Namespace> = Api::all(client.clone());
        let ns = envbridge::dev::fixtures::labelled_namespace(&name, "envbridge.dev/test");
        api.create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        TestNamespace { name, client, info }
    }

    /// A namespaced Api for this test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        cleanup_in_drop(self.info.kubeconfig.clone(), |client| async move {
            let api: Api<Namespace> = Api::all(client);
            let _ = api.delete(&name, &DeleteParams::background()).await;
        });
    }
}

/// Runs a best-effort cleanup from a `Drop`: on a thread with its own runtime and client,
/// because the test's runtime may be single-threaded and blocked in that drop. Waits for it.
pub fn cleanup_in_drop<F, Fut>(kubeconfig: std::path::PathBuf, cleanup: F)
where
    F: FnOnce(kube::Client) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            if let Ok(client) = envbridge::dev::client_for(&kubeconfig).await {
                cleanup(client).await;
            }
        });
    })
    .join();
}

/// Poll `probe` until it yields Some, or panic after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

//! A watcher that reads nothing is cut off by the plane's real apiserver, and the apiserver's
//! log names it by its selector (the plane runs it with `--vmodule=cache_watcher=1`), which
//! `dev::cut_watchers` reads back: how a benchmark tells kwok's cut-off watch from another's.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use envbridge::dev::cut_watchers::LogMark;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams, WatchParams};

use crate::support::{self, TestNamespace};

/// Enough to fill the socket's buffers (the loopback receive buffer grows to 32 MiB here)
/// and then the watcher's own queue; the loop stops at the first cut-off it sees.
const OBJECTS_MAX: usize = 200;
const OBJECT_BYTES: usize = 512 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_reads_nothing_is_cut_off_and_named_by_its_selector() {
    let ns = TestNamespace::new("dev-cut-watcher").await;
    let mark = LogMark::now(ns.info.apiserver_log());
    let key = "envbridge.dev/cut-off-test";
    let value = support::random_suffix();
    let selector = format!("{key}={value}");
    let api: Api<ConfigMap> = ns.api();
    // Opened, then never read: the apiserver's writes to it stop once the socket is full.
    let unread = api
        .watch(&WatchParams::default().labels(&selector).timeout(290), "0")
        .await
        .expect("watch");

    let blob = "x".repeat(OBJECT_BYTES);
    let named = |cut: &[(String, usize)]| {
        cut.iter()
            .find(|(w, _)| w.starts_with("configmaps ") && w.contains(&selector))
            .cloned()
    };
    let mut found = None;
    let mut created = 0;
    while created < OBJECTS_MAX && found.is_none() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("blob-{created}")),
                labels: Some(BTreeMap::from([(key.to_string(), value.clone())])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([("blob".to_string(), blob.clone())])),
            ..Default::default()
        };
        api.create(&PostParams::default(), &cm)
            .await
            .unwrap_or_else(|e| panic!("creating ConfigMap blob-{created}: {e}"));
        created += 1;
        if created % 8 == 0 {
            found = named(&mark.cut_since());
        }
    }
    // The cut-off comes once the watcher's queue has waited its time budget out.
    let deadline = Instant::now() + Duration::from_secs(30);
    while found.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        found = named(&mark.cut_since());
    }
    drop(unread);
    let (watcher, times) = found.unwrap_or_else(|| {
        panic!(
            "no cut-off of the watcher {selector:?} in {} after {created} objects of {} KiB \
             (a plane started before --vmodule=cache_watcher=1? `envbridge dev down`); \
             cut-offs logged: {:?}",
            ns.info.apiserver_log().display(),
            OBJECT_BYTES / 1024,
            mark.cut_since()
        )
    });
    assert!(
        watcher.contains(&format!("key: \"/configmaps/{}/", ns.name)),
        "the watcher is not named by its key: {watcher}"
    );
    assert_eq!(times, 1, "one watch, cut off once: {watcher}");
}

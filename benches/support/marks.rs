//! When the operator benchmark's objects were created (first and last Task and Pod), read
//! from their creation timestamps once the create is over. Watches of the benchmark's own
//! would have it sooner and finer, but the apiserver would send them every Task and Pod
//! write: load the operator's create would be timed with and the floor's would not.

use std::time::{Duration, SystemTime};

use envbridge::crd::Task;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use super::Res;

/// The first and last creation of the Tasks and Pods in `ns`, as offsets from `t0` (whole
/// seconds: the apiserver's timestamps have no finer grain).
pub async fn creation_marks(
    client: &Client,
    ns: &str,
    t0: SystemTime,
) -> Res<Vec<(&'static str, Duration)>> {
    let (first_task, last_task) = span::<Task>(client, ns, t0).await?;
    let (first_pod, last_pod) = span::<Pod>(client, ns, t0).await?;
    Ok(vec![
        ("first Task created", first_task),
        ("first Pod created", first_pod),
        ("all Tasks created", last_task),
        ("all Pods created", last_pod),
    ])
}

/// The earliest and latest creation timestamp of the `K`s in `ns`, after `t0`.
async fn span<K>(client: &Client, ns: &str, t0: SystemTime) -> Res<(Duration, Duration)>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + DeserializeOwned,
    K: std::fmt::Debug,
    <K as Resource>::DynamicType: Default,
{
    let list = Api::<K>::namespaced(client.clone(), ns)
        .list_metadata(&ListParams::default())
        .await?;
    let offsets: Vec<Duration> = list
        .items
        .iter()
        .filter_map(|o| o.metadata.creation_timestamp.as_ref())
        .map(|t| {
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(t.0.as_second().max(0) as u64);
            at.duration_since(t0).unwrap_or_default()
        })
        .collect();
    let first = offsets.iter().min().copied().unwrap_or_default();
    let last = offsets.iter().max().copied().unwrap_or_default();
    Ok((first, last))
}

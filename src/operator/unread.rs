//! Writes whose reply the operator does not read: each returns the object written (a whole
//! Task, Pod or Service), which `kube::Api` decodes (a delete's twice: as a JSON value, then
//! as the type) and the caller drops; the watch brings the same object to the stores anyway.
//! At 2,000 tasks that decoding was 5-10% of the operator's CPU in a step. The same requests
//! as `Api`'s; a 4xx/5xx reply is `kube::Error::Api` with its Status, as from `Api`.

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde::Serialize;

/// `Api::create`, the reply unread.
pub async fn create<K: Resource + Clone + Serialize>(
    api: &Api<K>,
    pp: &PostParams,
    obj: &K,
) -> kube::Result<()> {
    let body = serde_json::to_vec(obj).map_err(kube::Error::SerdeError)?;
    let req = request(api).create(pp, body);
    send(api, req).await
}

/// `Api::patch`, the reply unread.
pub async fn patch<K: Resource + Clone, P: Serialize + std::fmt::Debug>(
    api: &Api<K>,
    name: &str,
    pp: &PatchParams,
    patch: &Patch<P>,
) -> kube::Result<()> {
    let req = request(api).patch(name, pp, patch);
    send(api, req).await
}

/// `Api::patch_status`, the reply unread.
pub async fn patch_status<K: Resource + Clone, P: Serialize + std::fmt::Debug>(
    api: &Api<K>,
    name: &str,
    pp: &PatchParams,
    patch: &Patch<P>,
) -> kube::Result<()> {
    let req = request(api).patch_subresource("status", name, pp, patch);
    send(api, req).await
}

/// `Api::delete`, the reply unread.
pub async fn delete<K: Resource + Clone>(
    api: &Api<K>,
    name: &str,
    dp: &DeleteParams,
) -> kube::Result<()> {
    let req = request(api).delete(name, dp);
    send(api, req).await
}

fn request<K: Resource + Clone>(api: &Api<K>) -> kube::core::Request {
    kube::core::Request::new(api.resource_url())
}

async fn send<K: Resource + Clone>(
    api: &Api<K>,
    req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> kube::Result<()> {
    let req = req.map_err(kube::Error::BuildRequest)?;
    api.clone().into_client().request_text(req).await.map(drop)
}

//! Counts the requests the operator sends to the apiserver (reported at shutdown; the
//! benchmark reads it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kube::client::ClientBuilder;
use kube::{Client, Config};

/// Requests sent through clients built with [`counting_client`], by method.
#[derive(Debug, Default)]
pub struct RequestCount {
    pub get: AtomicU64,
    pub write: AtomicU64,
}

impl RequestCount {
    pub fn total(&self) -> u64 {
        self.get.load(Ordering::Relaxed) + self.write.load(Ordering::Relaxed)
    }
}

/// A client whose every request (watches and lists included) is counted in `count`.
pub fn counting_client(config: Config, count: Arc<RequestCount>) -> Result<Client, kube::Error> {
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        let slot = if req.method() == http::Method::GET {
            &count.get
        } else {
            &count.write
        };
        slot.fetch_add(1, Ordering::Relaxed);
        req
    });
    Ok(ClientBuilder::try_from(config)?.with_layer(&layer).build())
}

//! The daemon's apiserver client: kube's default stack (which retries 429 with the server's
//! Retry-After, and 503/504, with backoff) plus a layer that counts requests for metrics.

use std::task::{Context, Poll};

use kube::client::ClientBuilder;
use prometheus_client::metrics::counter::Counter;

/// Counts every request sent through it.
#[derive(Clone)]
pub struct CountLayer(pub Counter);

#[derive(Clone)]
pub struct Count<S> {
    inner: S,
    n: Counter,
}

impl<S> tower::Layer<S> for CountLayer {
    type Service = Count<S>;
    fn layer(&self, inner: S) -> Count<S> {
        Count {
            inner,
            n: self.0.clone(),
        }
    }
}

impl<S, R> tower::Service<R> for Count<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }
    fn call(&mut self, req: R) -> Self::Future {
        self.n.inc();
        self.inner.call(req)
    }
}

/// A client from `config` whose requests are counted in `counter`.
pub fn counted(mut config: kube::Config, counter: Counter) -> Result<kube::Client, kube::Error> {
    // Throttling is honoured (Retry-After), never turned into a failure.
    config.default_retry = true;
    let builder = ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(&CountLayer(counter)).build())
}

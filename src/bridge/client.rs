//! The daemon's apiserver client: kube's default stack plus a layer that counts requests for
//! metrics. Its retry layer (kube-client 5 `RetryPolicy::server_retry`) re-sends a request
//! answered 429 (and 503/504) up to 15 times, waiting the longer of the server's Retry-After
//! and an exponential backoff (5 ms doubling). API Priority and Fairness always sends
//! Retry-After with its 429s; the integration test
//! `apiserver_throttling_is_retried_not_turned_into_a_failure` has the real apiserver reject
//! the daemon's requests and checks that the operation still succeeds.

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

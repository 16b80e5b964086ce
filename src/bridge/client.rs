//! The daemon's apiserver client: kube's default stack with its retry moved outwards (to count
//! what it retries) plus a layer that counts requests for metrics. The retry is kube-client 5's
//! `RetryPolicy::server_retry`: a request answered 429 (and 503/504) is re-sent up to 15
//! times, after the longer of the server's Retry-After and an exponential backoff (5 ms
//! doubling). API Priority and Fairness always sends
//! Retry-After with its 429s; the integration test
//! `apiserver_throttling_is_retried_not_turned_into_a_failure` has the real apiserver reject
//! the daemon's requests and checks that the operation still succeeds.

use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder};
use prometheus_client::metrics::counter::Counter;
use tower::BoxError;
use tower::buffer::BufferLayer;
use tower::retry::{Policy, RetryLayer};

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

/// kube's retry policy (the one its default stack uses), counting the 429 answers it retries:
/// kube's own layer sits where no outer layer sees them.
#[derive(Clone)]
pub struct CountThrottled {
    inner: RetryPolicy,
    throttled: Counter,
}

impl CountThrottled {
    pub fn new(throttled: Counter) -> Self {
        CountThrottled {
            inner: RetryPolicy::server_retry(),
            throttled,
        }
    }
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for CountThrottled {
    type Future = <RetryPolicy as Policy<Request<Body>, Response<Res>, BoxError>>::Future;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        if let Ok(res) = result
            && res.status() == StatusCode::TOO_MANY_REQUESTS
        {
            self.throttled.inc();
        }
        self.inner.retry(req, result)
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        Policy::<Request<Body>, Response<Res>, BoxError>::clone_request(&mut self.inner, req)
    }
}

/// A client from `config` whose requests are counted in `requests` and whose throttled
/// answers (429, then retried) in `throttled`.
pub fn counted(
    mut config: kube::Config,
    requests: Counter,
    throttled: Counter,
) -> Result<kube::Client, kube::Error> {
    // The same retry as kube's default (throttling is honoured, Retry-After, never turned
    // into a failure), moved out here so that the 429s it absorbs are counted. Retry needs a
    // clonable service: a buffer in front of the boxed stack.
    config.default_retry = false;
    let builder = ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RetryLayer::new(CountThrottled::new(throttled)))
        .with_layer(&CountLayer(requests))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: StatusCode, retry_after: Option<&str>) -> Result<Response<()>, BoxError> {
        let mut b = Response::builder().status(status);
        if let Some(s) = retry_after {
            b = b.header("Retry-After", s);
        }
        Ok(b.body(()).expect("response"))
    }

    #[tokio::test]
    async fn throttled_answers_are_counted_and_retried_after_retry_after() {
        let throttled = Counter::default();
        let mut policy = CountThrottled::new(throttled.clone());
        let mut req = Request::get("/api").body(Body::empty()).expect("request");
        assert!(
            Policy::<_, Response<()>, BoxError>::clone_request(&mut policy, &req).is_some(),
            "a request without a streaming body can be re-sent"
        );
        let start = tokio::time::Instant::now();
        let wait = policy
            .retry(
                &mut req,
                &mut answer(StatusCode::TOO_MANY_REQUESTS, Some("1")),
            )
            .expect("a 429 is retried");
        wait.await;
        // Not the 5 ms of the first backoff step: the server's delay.
        assert!(
            start.elapsed() >= std::time::Duration::from_secs(1),
            "Retry-After honoured"
        );
        assert_eq!(throttled.get(), 1);
        // 503 is retried but is not throttling; success and client errors are final.
        assert!(
            policy
                .retry(&mut req, &mut answer(StatusCode::SERVICE_UNAVAILABLE, None))
                .is_some()
        );
        assert!(
            policy
                .retry(&mut req, &mut answer(StatusCode::OK, None))
                .is_none()
        );
        assert!(
            policy
                .retry(&mut req, &mut answer(StatusCode::FORBIDDEN, None))
                .is_none()
        );
        assert_eq!(throttled.get(), 1);
    }
}

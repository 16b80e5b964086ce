//! The apiserver client every envbridge process builds: kube's default stack with its retry
//! moved outwards, so that the throttled answers it absorbs can be counted, and an [`Observe`]r
//! that sees every request (the daemon's metrics, the operator's per-kind counts). The retry is
//! kube-client 5's `RetryPolicy::server_retry`: a request answered 429 (and 503/504) is re-sent
//! up to 15 times, after the longer of the server's Retry-After and an exponential backoff
//! (5 ms doubling). API Priority and Fairness always sends Retry-After with its 429s; the
//! integration test `apiserver_throttling_is_retried_not_turned_into_a_failure` has the real
//! apiserver reject the daemon's requests and checks that the operation still succeeds.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder};
use prometheus_client::metrics::counter::Counter;
use tower::BoxError;
use tower::buffer::BufferLayer;
use tower::retry::{Policy, RetryLayer};

use super::in_flight::{IN_FLIGHT, InFlightLayer};

/// What a process learns of its apiserver traffic.
pub trait Observe: Send + Sync + 'static {
    /// One request about to be sent (once, however often the retry re-sends it).
    fn sent(&self, method: &http::Method, path: &str, query: Option<&str>);
    /// One 429 answer, about to be retried.
    fn throttled(&self);
}

/// Two Prometheus counters: requests sent and throttled answers (the daemon's metrics).
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub requests: Counter,
    pub throttled: Counter,
}

impl Observe for Counters {
    fn sent(&self, _: &http::Method, _: &str, _: Option<&str>) {
        self.requests.inc();
    }
    fn throttled(&self) {
        self.throttled.inc();
    }
}

/// Shows every request passing through it to the observer.
#[derive(Clone)]
struct ObserveLayer(Arc<dyn Observe>);

#[derive(Clone)]
struct Observed<S> {
    inner: S,
    observer: Arc<dyn Observe>,
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observed<S>;
    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            observer: self.0.clone(),
        }
    }
}

impl<S, B> tower::Service<Request<B>> for Observed<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }
    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.observer
            .sent(req.method(), req.uri().path(), req.uri().query());
        self.inner.call(req)
    }
}

/// kube's retry policy (the one its default stack uses), telling the observer of the 429
/// answers it retries: kube's own layer sits where no outer layer sees them.
#[derive(Clone)]
struct SeeThrottled {
    inner: RetryPolicy,
    observer: Arc<dyn Observe>,
}

impl SeeThrottled {
    fn new(observer: Arc<dyn Observe>) -> Self {
        SeeThrottled {
            inner: RetryPolicy::server_retry(),
            observer,
        }
    }
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for SeeThrottled {
    type Future = <RetryPolicy as Policy<Request<Body>, Response<Res>, BoxError>>::Future;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        if let Ok(res) = result
            && res.status() == StatusCode::TOO_MANY_REQUESTS
        {
            self.observer.throttled();
        }
        self.inner.retry(req, result)
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        Policy::<Request<Body>, Response<Res>, BoxError>::clone_request(&mut self.inner, req)
    }
}

/// A client from `config` whose requests and throttled answers (429, then retried) the
/// observer sees, with at most `in_flight` requests in flight at once ([`InFlightLayer`]).
pub fn observed(
    mut config: kube::Config,
    observer: Arc<dyn Observe>,
    in_flight: usize,
) -> Result<kube::Client, kube::Error> {
    // The same retry as kube's default (throttling is honoured, Retry-After, never turned
    // into a failure), moved out here so that the 429s it absorbs are seen. Retry needs a
    // clonable service: a buffer in front of the boxed stack. Between them, the bound on
    // requests in flight (one connection each).
    config.default_retry = false;
    let builder = ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&InFlightLayer::new(in_flight))
        .with_layer(&RetryLayer::new(SeeThrottled::new(observer.clone())))
        .with_layer(&ObserveLayer(observer))
        .build())
}

/// [`observed`] by two counters: requests sent, throttled answers.
pub fn counted(
    config: kube::Config,
    requests: Counter,
    throttled: Counter,
) -> Result<kube::Client, kube::Error> {
    observed(
        config,
        Arc::new(Counters {
            requests,
            throttled,
        }),
        IN_FLIGHT,
    )
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
        let counters = Counters::default();
        let throttled = counters.throttled.clone();
        let mut policy = SeeThrottled::new(Arc::new(counters));
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

//! At most so many apiserver requests in flight at once.
//!
//! kube's stack speaks HTTP/1.1: a request in flight holds a TLS connection of its own until
//! its answer is read to the end, and the pool keeps every connection it ever opened.
//! Unbounded, the operator opened 330 of them for 2,000 tasks (docs/benchmarks.md). Here
//! each request waits for a place in a task of its own, and that task reads the whole answer
//! before it gives the place back: connections stay within the places, plus one per watch
//! (and followed log), which are long-lived, stream their answer, and take no place.
//!
//! Why spawned, not tower's `ConcurrencyLimit`: that one takes its place when the request is
//! handed out and gives it back when the caller polls the answer to its end. A caller that
//! keeps answers unpolled for a while (a `buffer_unordered` of writes while a `select!` arm
//! writes the progress) then holds places that nobody frees, and with the limit equal to its
//! width every client's request waits forever (the operator stalled that way at ~520
//! requests). Here an answer is read whether or not its caller is polling.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Either, Full};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower::{BoxError, Service, ServiceExt};

/// Requests in flight at once, at most, in one process (watches aside).
pub const IN_FLIGHT: usize = 64;

#[derive(Clone)]
pub struct InFlightLayer(Arc<Semaphore>);

impl InFlightLayer {
    pub fn new(places: usize) -> Self {
        InFlightLayer(Arc::new(Semaphore::new(
            places.clamp(1, Semaphore::MAX_PERMITS),
        )))
    }
}

impl<S> tower::Layer<S> for InFlightLayer {
    type Service = InFlight<S>;
    fn layer(&self, inner: S) -> InFlight<S> {
        InFlight {
            inner,
            places: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct InFlight<S> {
    inner: S,
    places: Arc<Semaphore>,
}

/// An answer read whole (`Left`), or a long-lived one streaming (`Right`).
pub type Answer<B> = Response<Either<Full<Bytes>, B>>;

impl<S, ReqB, B> Service<Request<ReqB>> for InFlight<S>
where
    S: Service<Request<ReqB>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ReqB: Send + 'static,
{
    type Response = Answer<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Answer<B>, BoxError>> + Send>>;

    /// Always ready: the wait for a place (and for the inner service) is the request's own.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let inner = self.inner.clone();
        let places = (!long_lived(req.uri().query())).then(|| self.places.clone());
        let sent = Sent(tokio::spawn(async move {
            let Some(places) = places else {
                let res = inner.oneshot(req).await.map_err(Into::into)?;
                return Ok(res.map(Either::Right));
            };
            let _place = places.acquire_owned().await?;
            let (parts, body) = inner.oneshot(req).await.map_err(Into::into)?.into_parts();
            let whole = body.collect().await.map_err(Into::into)?.to_bytes();
            Ok(Response::from_parts(parts, Either::Left(Full::new(whole))))
        }));
        Box::pin(sent.wait())
    }
}

/// A watch or a followed log: its answer streams for as long as it lasts.
fn long_lived(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "follow=true" | "follow=1"))
    })
}

/// The spawned request; dropping it (the caller gave up) cancels the request.
struct Sent<T>(JoinHandle<Result<T, BoxError>>);

impl<T> Sent<T> {
    async fn wait(mut self) -> Result<T, BoxError> {
        (&mut self.0).await?
    }
}

impl<T> Drop for Sent<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;
    use tower::Layer;

    /// A service that answers after `delay`, its body after `body_delay` more, counting the
    /// most requests it held at once (until their body was read).
    #[derive(Clone, Default)]
    struct Slow {
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        delay: Duration,
        body_delay: Duration,
    }

    type SlowBody = http_body_util::StreamBody<
        futures::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, BoxError>>,
    >;

    impl Service<Request<()>> for Slow {
        type Response = Response<SlowBody>;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: Request<()>) -> Self::Future {
            let (now, most) = (self.now.clone(), self.most.clone());
            let (delay, body_delay) = (self.delay, self.body_delay);
            let path = req.uri().path().to_string();
            Box::pin(async move {
                let n = now.fetch_add(1, Relaxed) + 1;
                most.fetch_max(n, Relaxed);
                tokio::time::sleep(delay).await;
                let body = futures::stream::once(async move {
                    tokio::time::sleep(body_delay).await;
                    now.fetch_sub(1, Relaxed);
                    Ok(http_body::Frame::data(Bytes::from(path)))
                })
                .boxed();
                Ok(Response::new(http_body_util::StreamBody::new(body)))
            })
        }
    }

    fn slow(delay: Duration, body_delay: Duration) -> Slow {
        Slow {
            delay,
            body_delay,
            ..Slow::default()
        }
    }

    fn get(path: &str) -> Request<()> {
        Request::get(path).body(()).expect("request")
    }

    async fn text<B: http_body::Body<Data = Bytes>>(res: Response<B>) -> String
    where
        B::Error: std::fmt::Debug,
    {
        let bytes = res.into_body().collect().await.expect("body").to_bytes();
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    #[tokio::test]
    async fn no_more_requests_than_places_are_in_flight_bodies_included() {
        let inner = slow(Duration::from_millis(10), Duration::from_millis(10));
        let most = inner.most.clone();
        let svc = InFlightLayer::new(8).layer(inner);
        let answers: Vec<String> = futures::stream::iter(0..64)
            .map(|i| svc.clone().oneshot(get(&format!("/r/{i}"))))
            .buffer_unordered(64)
            .then(|r| text(r.expect("answered")))
            .collect()
            .await;
        assert_eq!(answers.len(), 64, "every request answered");
        assert!(answers.iter().all(|a| a.starts_with("/r/")), "{answers:?}");
        let most = most.load(Relaxed);
        assert!(most <= 8, "{most} requests (and bodies) held at once");
        assert!(most >= 4, "the places are used, not a trickle: {most}");
    }

    /// The pattern that stalled tower's limit: as many writes in flight as places, left
    /// unpolled while another request is awaited (a `select!` arm firing first).
    #[tokio::test]
    async fn answers_left_unpolled_do_not_hold_places() {
        let svc = InFlightLayer::new(4).layer(slow(Duration::from_millis(50), Duration::ZERO));
        let mut writes = futures::stream::iter(0..8)
            .map(|i| svc.clone().oneshot(get(&format!("/w/{i}"))))
            .buffer_unordered(4);
        // Four writes sent, none answered yet.
        assert!(
            tokio::time::timeout(Duration::from_millis(5), writes.next())
                .await
                .is_err()
        );
        let other = tokio::time::timeout(Duration::from_secs(10), svc.clone().oneshot(get("/o")))
            .await
            .expect("the other request is not starved by unpolled answers");
        assert_eq!(text(other.expect("answered")).await, "/o");
        assert_eq!(writes.count().await, 8);
    }

    #[tokio::test]
    async fn a_watch_takes_no_place_and_streams() {
        let svc = InFlightLayer::new(1).layer(slow(Duration::ZERO, Duration::from_secs(3600)));
        let watch = tokio::time::timeout(
            Duration::from_secs(10),
            svc.clone()
                .oneshot(get("/api/v1/pods?watch=true&resourceVersion=1")),
        )
        .await
        .expect("a watch's headers come before its body")
        .expect("answered");
        // Its body is still streaming; a request still finds the one place free.
        let quick = InFlight {
            inner: slow(Duration::ZERO, Duration::ZERO),
            places: svc.places.clone(),
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), quick.oneshot(get("/q")))
            .await
            .expect("the watch holds no place");
        assert_eq!(text(answer.expect("answered")).await, "/q");
        drop(watch);
    }

    #[tokio::test]
    async fn a_dropped_request_gives_its_place_back() {
        let svc = InFlightLayer::new(1).layer(slow(Duration::from_secs(3600), Duration::ZERO));
        let hung = svc.clone().oneshot(get("/h"));
        // Started, then given up on.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), hung)
                .await
                .is_err()
        );
        let quick = InFlight {
            inner: slow(Duration::from_millis(1), Duration::ZERO),
            places: svc.places.clone(),
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), quick.oneshot(get("/q")))
            .await
            .expect("the place was given back");
        assert_eq!(text(answer.expect("answered")).await, "/q");
    }

    #[test]
    fn watches_and_followed_logs_are_long_lived() {
        assert!(long_lived(Some("watch=true&resourceVersion=5")));
        assert!(long_lived(Some("labelSelector=a%3Db&watch=1")));
        assert!(long_lived(Some("follow=true&container=task")));
        assert!(!long_lived(Some("labelSelector=watch%3Dtrue")));
        assert!(!long_lived(Some("limit=500")));
        assert!(!long_lived(None));
    }
}

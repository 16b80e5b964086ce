//! At most so many apiserver requests waiting for their answer at once.
//!
//! kube's stack speaks HTTP/1.1: a request in flight holds a TLS connection of its own, and
//! the pool keeps every connection it ever opened. Unbounded, the operator opened 330 of
//! them for 2,000 tasks (docs/benchmarks.md). Each request here waits for a place in its own
//! spawned task, and gives the place back as soon as its answer's headers arrive: a watch or
//! a log stream then holds its connection, not a place.
//!
//! Why spawned, not tower's `ConcurrencyLimit`: that one takes its place when the request is
//! handed out and gives it back when the caller polls the answer to its end. A caller that
//! keeps answers unpolled for a while (a `buffer_unordered` of writes while a `select!` arm
//! writes the progress) then holds places that nobody frees, and with the limit equal to its
//! width every client's request waits forever (the operator stalled that way at ~520
//! requests). Here an answer arrives whether or not its caller is polling.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower::{BoxError, Service, ServiceExt};

/// Requests waiting for their answer's headers at once, at most, in one process.
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

impl<S, Req> Service<Req> for InFlight<S>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    /// Always ready: the wait for a place (and for the inner service) is the request's own.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let inner = self.inner.clone();
        let places = self.places.clone();
        let sent = Sent(tokio::spawn(async move {
            let _place = places.acquire_owned().await?;
            inner.oneshot(req).await.map_err(Into::into)
        }));
        Box::pin(sent.wait())
    }
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

    /// A service that answers after `delay`, counting the most requests it held at once.
    #[derive(Clone, Default)]
    struct Slow {
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        delay: Duration,
    }

    impl Service<u32> for Slow {
        type Response = u32;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<u32, BoxError>> + Send>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: u32) -> Self::Future {
            let (now, most, delay) = (self.now.clone(), self.most.clone(), self.delay);
            Box::pin(async move {
                let n = now.fetch_add(1, Relaxed) + 1;
                most.fetch_max(n, Relaxed);
                tokio::time::sleep(delay).await;
                now.fetch_sub(1, Relaxed);
                Ok(req)
            })
        }
    }

    fn slow(delay: Duration) -> Slow {
        Slow {
            delay,
            ..Slow::default()
        }
    }

    #[tokio::test]
    async fn no_more_requests_than_places_reach_the_inner_service() {
        let inner = slow(Duration::from_millis(20));
        let most = inner.most.clone();
        let svc = InFlightLayer::new(8).layer(inner);
        let answers: Vec<u32> = futures::stream::iter(0..64u32)
            .map(|i| svc.clone().oneshot(i))
            .buffer_unordered(64)
            .map(|r| r.expect("answered"))
            .collect()
            .await;
        assert_eq!(answers.len(), 64, "every request answered");
        let most = most.load(Relaxed);
        assert!(most <= 8, "{most} requests held at once");
        assert!(most >= 4, "the places are used, not a trickle: {most}");
    }

    /// The pattern that stalled tower's limit: as many writes in flight as places, left
    /// unpolled while another request is awaited (a `select!` arm firing first).
    #[tokio::test]
    async fn answers_left_unpolled_do_not_hold_places() {
        let svc = InFlightLayer::new(4).layer(slow(Duration::from_millis(50)));
        let mut writes = futures::stream::iter(0..8u32)
            .map(|i| svc.clone().oneshot(i))
            .buffer_unordered(4);
        // Four writes sent, none answered yet.
        assert!(
            tokio::time::timeout(Duration::from_millis(5), writes.next())
                .await
                .is_err()
        );
        let other = tokio::time::timeout(Duration::from_secs(10), svc.clone().oneshot(99))
            .await
            .expect("the other request is not starved by unpolled answers");
        assert_eq!(other.expect("answered"), 99);
        assert_eq!(writes.count().await, 8);
    }

    #[tokio::test]
    async fn a_dropped_request_gives_its_place_back() {
        let svc = InFlightLayer::new(1).layer(slow(Duration::from_secs(3600)));
        let hung = svc.clone().oneshot(1);
        // Started, then given up on.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), hung)
                .await
                .is_err()
        );
        let quick = InFlight {
            inner: slow(Duration::from_millis(1)),
            places: svc.places.clone(),
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), quick.oneshot(2))
            .await
            .expect("the place was given back");
        assert_eq!(answer.expect("answered"), 2);
    }
}

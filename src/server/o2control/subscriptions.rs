//! Subscribe's streams by subscription id, as the anchor pairs them: a client picks an id,
//! calls Subscribe with it and then NewAutoEnvironment with the same id; the automatic
//! environment's events go to that stream, which ends when the environment is done.
//!
//! Either call may arrive first (the client does not wait for Subscribe's answer before it
//! creates), so whichever comes first makes the slot. A slot holds a bounded channel: the
//! subscriber takes its receiving end, the automatic environment its sending end, and the
//! stream ends when that sender is dropped. Slots are bounded in number and in id length;
//! one whose subscriber went away is removed with it, one whose environment finished with
//! nobody listening is removed after a grace period (a late subscriber still reads it).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::sync::mpsc;
use tonic::Status;

use super::pb::events as ev;

/// At most this many subscription ids at once (each a bounded channel).
pub const MAX_SLOTS: usize = 256;
/// Events buffered per subscription; beyond, events are dropped (and counted in the log).
/// With [`MAX_SLOTS`], what unread subscriptions can hold stays in the tens of MB.
const BUFFER: usize = 1024;
/// A subscription id's longest form (the anchor's clients use 20-character xids).
pub const MAX_ID: usize = 128;
/// How long a finished environment's events wait for a subscriber that never came.
const GRACE: Duration = Duration::from_secs(60);

struct Slot {
    /// The sending end until an automatic environment takes it.
    tx: Option<mpsc::Sender<ev::Event>>,
    /// The receiving end until a subscriber takes it.
    rx: Option<mpsc::Receiver<ev::Event>>,
    /// Which subscriber holds the receiving end (so that an old one's goodbye removes
    /// nothing newer).
    generation: u64,
    /// When the automatic environment finished (its sender was dropped).
    finished: Option<Instant>,
}

#[derive(Default)]
pub struct Subscriptions {
    slots: Mutex<HashMap<String, Slot>>,
    next_generation: std::sync::atomic::AtomicU64,
}

fn check_id(id: &str, rpc: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{rpc}: id is required (the subscription id Subscribe and NewAutoEnvironment share)"
        )));
    }
    if id.len() > MAX_ID {
        return Err(Status::invalid_argument(format!(
            "{rpc}: id is {} bytes, at most {MAX_ID}",
            id.len()
        )));
    }
    Ok(())
}

impl Subscriptions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot for `id`, made if there is none (within the bound).
    fn slot<'a>(
        slots: &'a mut HashMap<String, Slot>,
        id: &str,
        rpc: &str,
    ) -> Result<&'a mut Slot, Status> {
        let now = Instant::now();
        slots.retain(|_, s| !(s.rx.is_some() && s.finished.is_some_and(|f| now - f > GRACE)));
        if !slots.contains_key(id) && slots.len() >= MAX_SLOTS {
            return Err(Status::resource_exhausted(format!(
                "{rpc}: {MAX_SLOTS} subscriptions are open; close one first"
            )));
        }
        Ok(slots.entry(id.to_string()).or_insert_with(|| {
            let (tx, rx) = mpsc::channel(BUFFER);
            Slot {
                tx: Some(tx),
                rx: Some(rx),
                generation: 0,
                finished: None,
            }
        }))
    }

    /// Subscribe: the stream of subscription `id`'s events (it ends when its automatic
    /// environment is done). One subscriber per id.
    pub fn subscribe(self: &Arc<Self>, id: &str) -> Result<EventStream, Status> {
        check_id(id, "Subscribe")?;
        let mut slots = self.lock();
        let slot = Self::slot(&mut slots, id, "Subscribe")?;
        let rx = slot.rx.take().ok_or_else(|| {
            Status::already_exists(format!(
                "Subscribe: subscription {id:?} already has a subscriber"
            ))
        })?;
        let generation = 1 + self
            .next_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        slot.generation = generation;
        Ok(EventStream {
            rx,
            id: id.to_string(),
            generation,
            subs: Arc::downgrade(self),
        })
    }

    /// NewAutoEnvironment: where subscription `id`'s events go. One environment per id.
    pub fn bind(self: &Arc<Self>, id: &str) -> Result<Sink, Status> {
        check_id(id, "NewAutoEnvironment")?;
        let mut slots = self.lock();
        let slot = Self::slot(&mut slots, id, "NewAutoEnvironment")?;
        let tx = slot.tx.take().ok_or_else(|| {
            Status::already_exists(format!(
                "NewAutoEnvironment: subscription {id:?} already has an environment"
            ))
        })?;
        Ok(Sink {
            tx: Some(tx),
            id: id.to_string(),
            dropped: 0,
            subs: Arc::downgrade(self),
        })
    }

    /// How many subscription ids are open.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn subscriber_gone(&self, id: &str, generation: u64) {
        let mut slots = self.lock();
        if slots.get(id).is_some_and(|s| s.generation == generation) {
            slots.remove(id);
        }
    }

    fn sender_gone(&self, id: &str) {
        let mut slots = self.lock();
        if let Some(s) = slots.get_mut(id) {
            if s.rx.is_none() {
                // The subscriber holds the receiver and sees the end: its goodbye removes it.
                return;
            }
            s.finished = Some(Instant::now());
        }
    }
}

/// The sending end of one subscription: an automatic environment's events.
pub struct Sink {
    tx: Option<mpsc::Sender<ev::Event>>,
    id: String,
    dropped: u64,
    subs: std::sync::Weak<Subscriptions>,
}

impl Sink {
    /// Sends one event without waiting: a subscriber that does not read loses events
    /// beyond the buffer (counted and logged), never blocks the environment.
    pub fn send(&mut self, event: ev::Event) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped += 1;
                if self.dropped == 1 {
                    tracing::warn!(subscription = %self.id, "Subscribe: the subscriber does not read; events are dropped");
                }
            }
            // The subscriber went away: nobody to tell.
            Err(mpsc::error::TrySendError::Closed(_)) => self.tx = None,
        }
    }

    /// A future that resolves once nobody can read this subscription any more (at once
    /// when nobody could already). It holds no sending end: the stream still ends when the
    /// sink is dropped.
    pub fn closed_signal(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let tx = self.tx.as_ref().map(|t| t.downgrade());
        async move {
            if let Some(tx) = tx.and_then(|t| t.upgrade()) {
                // A weak handle would not notice; an upgraded one keeps the channel open only
                // while this waits, which ends with the subscriber.
                tx.closed().await
            }
        }
    }

    pub fn send_all(&mut self, events: impl IntoIterator<Item = ev::Event>) {
        for e in events {
            self.send(e);
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.tx = None;
        if self.dropped > 0 {
            tracing::warn!(subscription = %self.id, dropped = self.dropped, "Subscribe: events dropped for a subscriber that did not read");
        }
        if let Some(subs) = self.subs.upgrade() {
            subs.sender_gone(&self.id);
        }
    }
}

/// What Subscribe answers: the subscription's events until its environment is done.
pub struct EventStream {
    rx: mpsc::Receiver<ev::Event>,
    id: String,
    generation: u64,
    subs: std::sync::Weak<Subscriptions>,
}

impl Stream for EventStream {
    type Item = Result<ev::Event, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|e| e.map(Ok))
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if let Some(subs) = self.subs.upgrade() {
            subs.subscriber_gone(&self.id, self.generation);
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::server::o2control::events::stamped;

    fn meta(msg: &str) -> ev::Event {
        stamped(ev::event::Payload::FrameworkEvent(
            ev::EvMetaEventFrameworkEvent {
                framework_id: String::new(),
                message: msg.into(),
            },
        ))
    }

    fn message(e: &ev::Event) -> &str {
        match e.payload.as_ref() {
            Some(ev::event::Payload::FrameworkEvent(f)) => &f.message,
            _ => panic!("{e:?}"),
        }
    }

    #[tokio::test]
    async fn either_side_may_come_first_and_the_stream_ends_with_the_environment() {
        let subs = Arc::new(Subscriptions::default());
        // Subscribe first.
        let mut stream = subs.subscribe("a").unwrap();
        let mut sink = subs.bind("a").unwrap();
        sink.send(meta("one"));
        drop(sink);
        assert_eq!(message(&stream.next().await.unwrap().unwrap()), "one");
        assert!(
            stream.next().await.is_none(),
            "the end of the environment ends the stream"
        );
        drop(stream);
        assert!(subs.is_empty(), "a finished subscription leaves nothing");

        // The environment first: what it said waits for the subscriber.
        let mut sink = subs.bind("b").unwrap();
        sink.send(meta("early"));
        drop(sink);
        let mut stream = subs.subscribe("b").unwrap();
        assert_eq!(message(&stream.next().await.unwrap().unwrap()), "early");
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn one_subscriber_and_one_environment_per_id_within_bounds() {
        let subs = Arc::new(Subscriptions::default());
        let _s = subs.subscribe("a").unwrap();
        let e = subs.subscribe("a").err().unwrap();
        assert_eq!(e.code(), tonic::Code::AlreadyExists);
        let _k = subs.bind("a").unwrap();
        assert_eq!(
            subs.bind("a").err().unwrap().code(),
            tonic::Code::AlreadyExists
        );
        assert_eq!(
            subs.subscribe("").err().unwrap().code(),
            tonic::Code::InvalidArgument
        );
        let long = "x".repeat(MAX_ID + 1);
        assert_eq!(
            subs.bind(&long).err().unwrap().code(),
            tonic::Code::InvalidArgument
        );
        let mut held = vec![];
        for i in 1..MAX_SLOTS {
            held.push(subs.subscribe(&format!("s{i}")).unwrap());
        }
        let e = subs.subscribe("one-too-many").err().unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        held.clear();
        assert_eq!(subs.len(), 1, "gone subscribers free their ids");
    }

    #[tokio::test]
    async fn a_subscriber_that_does_not_read_never_blocks_the_sender() {
        let subs = Arc::new(Subscriptions::default());
        let _stream = subs.subscribe("slow").unwrap();
        let mut sink = subs.bind("slow").unwrap();
        for i in 0..(BUFFER + 10) {
            sink.send(meta(&i.to_string()));
        }
        assert_eq!(sink.dropped, 10);
    }
}

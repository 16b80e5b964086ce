//! Places for live streams: at most [`MAX_STREAMS`] over all sessions, and at most
//! [`PER_SESSION`] for one session, so that one browser (or one script holding a session
//! cookie) cannot take every place from the others.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Live streams at once, over all sessions.
pub const MAX_STREAMS: usize = 256;
/// Live streams at once for one session (a control room's tabs, with room to spare).
pub const PER_SESSION: usize = 32;

#[derive(Debug, PartialEq, Eq)]
pub enum Full {
    /// Every place is taken.
    All(usize),
    /// This session holds its share.
    Session(usize),
}

pub struct Slots {
    all: Arc<Semaphore>,
    per_session: Arc<DashMap<String, usize>>,
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            all: Arc::new(Semaphore::new(MAX_STREAMS)),
            per_session: Arc::default(),
        }
    }
}

/// One stream's place, given back when the stream ends.
pub struct Slot {
    _all: OwnedSemaphorePermit,
    session: String,
    per_session: Arc<DashMap<String, usize>>,
}

impl Slots {
    pub fn take(&self, session: &str) -> Result<Slot, Full> {
        // The session's count first, under its map entry's lock: two tabs opening at once
        // cannot both take the last place.
        {
            let mut n = self.per_session.entry(session.to_string()).or_insert(0);
            if *n >= PER_SESSION {
                return Err(Full::Session(PER_SESSION));
            }
            *n += 1;
        }
        let slot = |all| Slot {
            _all: all,
            session: session.to_string(),
            per_session: self.per_session.clone(),
        };
        match self.all.clone().try_acquire_owned() {
            Ok(all) => Ok(slot(all)),
            Err(_) => {
                release(&self.per_session, session);
                Err(Full::All(MAX_STREAMS))
            }
        }
    }
}

fn release(per_session: &DashMap<String, usize>, session: &str) {
    // The entry goes with its last stream: the map holds only sessions streaming now.
    per_session.remove_if_mut(session, |_, n| {
        *n = n.saturating_sub(1);
        *n == 0
    });
}

impl Drop for Slot {
    fn drop(&mut self) {
        release(&self.per_session, &self.session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_session_cannot_take_every_place() {
        let slots = Slots::default();
        let mine: Vec<Slot> = (0..PER_SESSION)
            .map(|_| slots.take("a").expect("a place"))
            .collect();
        assert_eq!(
            slots.take("a").err(),
            Some(Full::Session(PER_SESSION)),
            "the session's share is taken"
        );
        // Another session still gets in, and a stream that ends gives its place back.
        let other = slots.take("b").expect("another session");
        drop(mine);
        assert!(slots.take("a").is_ok());
        drop(other);
        assert!(
            slots.per_session.is_empty(),
            "nothing kept for ended streams"
        );
    }

    #[test]
    fn the_overall_limit_holds_and_a_refusal_takes_nothing() {
        let slots = Slots::default();
        let held: Vec<Slot> = (0..MAX_STREAMS)
            .map(|i| slots.take(&format!("s{}", i % 16)).expect("a place"))
            .collect();
        assert_eq!(slots.take("new").err(), Some(Full::All(MAX_STREAMS)));
        assert!(
            !slots.per_session.contains_key("new"),
            "a refused stream counts for nobody"
        );
        drop(held);
        assert!(slots.take("new").is_ok());
    }
}

//! How an index follows a watch, in one place: applies and deletes as they come, and a relist
//! that replaces everything at its end (until then the old view stands). The indexes say
//! only what an object is to them ([`Index`]); unit-tested through them (`task_index`,
//! `nodes`).

use kube::runtime::watcher;

/// What an index keeps of its objects.
pub trait Index {
    type Object;
    /// What is kept of one object.
    type Entry;
    fn entry(o: &Self::Object) -> Self::Entry;
    /// Takes (or moves) an object's entry.
    fn apply(&mut self, e: Self::Entry);
    fn delete(&mut self, o: &Self::Object);
    fn clear(&mut self);
}

/// An index with the relist it is in the middle of.
#[derive(Default)]
pub struct Relisting<I: Index> {
    pub index: I,
    /// A relist in progress: what it has listed so far.
    listed: Option<Vec<I::Entry>>,
}

impl<I: Index> Relisting<I> {
    /// Takes one event of the watch.
    pub fn observe(&mut self, ev: &watcher::Event<I::Object>) {
        match ev {
            watcher::Event::Apply(o) => self.index.apply(I::entry(o)),
            watcher::Event::Delete(o) => self.index.delete(o),
            watcher::Event::Init => self.listed = Some(Vec::new()),
            watcher::Event::InitApply(o) => {
                let e = I::entry(o);
                match self.listed.as_mut() {
                    Some(listed) => listed.push(e),
                    None => self.index.apply(e),
                }
            }
            watcher::Event::InitDone => {
                // The relist is the whole truth: what it did not list is gone.
                let listed = self.listed.take().unwrap_or_default();
                self.index.clear();
                for e in listed {
                    self.index.apply(e);
                }
            }
        }
    }
}

//! How an index follows a watch, in one place: applies and deletes as they come, and a relist
//! that replaces everything at its end (until then the old view stands). The indexes say
//! only what an object is to them ([`Index`]); unit-tested through them (`task_index`,
//! `nodes`). What both keep, objects grouped by one key ([`Groups`]), is here too.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

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
pub struct Relisting<I: Index> {
    pub index: I,
    /// A relist in progress: what it has listed so far.
    listed: Option<Vec<I::Entry>>,
}

// By hand: a derive would ask the entries to have a default too.
impl<I: Index + Default> Default for Relisting<I> {
    fn default() -> Self {
        Relisting {
            index: I::default(),
            listed: None,
        }
    }
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

/// Members grouped by one key each (tasks by environment, Nodes by host label), with the way
/// back from a member to its group so that a member moves or goes in one step.
pub struct Groups<G, M> {
    members: HashMap<G, BTreeSet<M>>,
    group_of: HashMap<M, G>,
}

impl<G, M> Default for Groups<G, M> {
    fn default() -> Self {
        Groups {
            members: HashMap::new(),
            group_of: HashMap::new(),
        }
    }
}

impl<G: Hash + Eq + Clone, M: Hash + Ord + Clone> Groups<G, M> {
    /// Puts `member` in `group` (None: in none), out of the group it was in.
    pub fn set(&mut self, member: M, group: Option<G>) {
        self.remove(&member);
        if let Some(group) = group {
            self.members
                .entry(group.clone())
                .or_default()
                .insert(member.clone());
            self.group_of.insert(member, group);
        }
    }

    pub fn remove(&mut self, member: &M) {
        if let Some(group) = self.group_of.remove(member)
            && let Some(set) = self.members.get_mut(&group)
        {
            set.remove(member);
            if set.is_empty() {
                self.members.remove(&group);
            }
        }
    }

    /// The members of `group`, in order.
    pub fn members<Q>(&self, group: &Q) -> impl Iterator<Item = &M>
    where
        G: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.members.get(group).into_iter().flatten()
    }

    /// How many members `group` has.
    pub fn len<Q>(&self, group: &Q) -> usize
    where
        G: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.members.get(group).map_or(0, BTreeSet::len)
    }

    pub fn clear(&mut self) {
        self.members.clear();
        self.group_of.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_moves_and_an_emptied_group_goes() {
        let mut g: Groups<&str, &str> = Groups::default();
        g.set("b", Some("x"));
        g.set("a", Some("x"));
        assert_eq!(g.members(&"x").collect::<Vec<_>>(), [&"a", &"b"]);
        assert_eq!((g.len(&"x"), g.len(&"y")), (2, 0));
        g.set("a", Some("y"));
        assert_eq!(g.members(&"x").collect::<Vec<_>>(), [&"b"]);
        g.set("b", None);
        assert!(!g.members.contains_key("x"), "an empty group is dropped");
        g.remove(&"a");
        assert!(g.members.is_empty() && g.group_of.is_empty());
    }
}

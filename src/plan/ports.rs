//! Port allocation: control ports and TCP channel ports, unique per node.
//!
//! Deterministic: tasks are visited in (node, role path) order and take the lowest free port
//! of the range. Ports reserved by other live environments (the daemon passes them) are skipped,
//! so two environments on the same nodes stay disjoint.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

use crate::workflow::model::FastMap;

/// Ports in use, per node.
#[derive(Debug, Default)]
pub struct PortBook<'r> {
    reserved: Option<&'r BTreeMap<String, BTreeSet<u16>>>,
    /// Hashed: every task looks its node up (the sorted view is made once, at the end).
    used: FastMap<String, BTreeSet<u16>>,
}

impl<'r> PortBook<'r> {
    pub fn new(reserved: &'r BTreeMap<String, BTreeSet<u16>>) -> Self {
        PortBook {
            reserved: Some(reserved),
            used: FastMap::default(),
        }
    }

    /// The lowest port of `range` free on `node`, now taken; `None` when the range is exhausted.
    pub fn take(&mut self, node: &str, range: &RangeInclusive<u16>) -> Option<u16> {
        let reserved = self.reserved.and_then(|r| r.get(node));
        if !self.used.contains_key(node) {
            self.used.insert(node.to_string(), BTreeSet::new());
        }
        let used = self.used.get_mut(node)?;
        let port = range
            .clone()
            .find(|p| !used.contains(p) && !reserved.is_some_and(|r| r.contains(p)))?;
        used.insert(port);
        Some(port)
    }

    /// Every port taken, per node (what a caller reserves for the next environment).
    pub fn into_taken(self) -> BTreeMap<String, BTreeSet<u16>> {
        self.used.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_per_node_and_skips_reserved() {
        let mut reserved = BTreeMap::new();
        reserved.insert("n1".to_string(), BTreeSet::from([100u16]));
        let mut book = PortBook::new(&reserved);
        let r = 100..=102;
        assert_eq!(book.take("n1", &r), Some(101));
        assert_eq!(book.take("n1", &r), Some(102));
        assert_eq!(book.take("n1", &r), None);
        assert_eq!(book.take("n2", &r), Some(100));
    }
}

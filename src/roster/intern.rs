//! String interning: node names, classes, namespaces, pod phases and transition ids repeat
//! across thousands of tasks; each distinct value is stored once and shared.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// A shared immutable string.
pub type Str = Arc<str>;

#[derive(Default, Debug)]
pub struct Interner {
    set: Mutex<HashSet<Str>>,
}

impl Interner {
    /// The shared copy of `s` (created on first use).
    pub fn get(&self, s: &str) -> Str {
        let mut set = match self.set.lock() {
            Ok(g) => g,
            // A panic while holding the lock cannot leave the set inconsistent (insert is atomic).
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(found) = set.get(s) {
            return found.clone();
        }
        let new: Str = Arc::from(s);
        set.insert(new.clone());
        new
    }

    pub fn opt(&self, s: Option<&str>) -> Option<Str> {
        s.map(|s| self.get(s))
    }

    /// Drops values no record uses any more (only the interner holds them).
    pub fn prune(&self) {
        if let Ok(mut set) = self.set.lock() {
            set.retain(|s| Arc::strong_count(s) > 1);
        }
    }

    /// Approximate heap bytes held by the interner itself.
    pub fn heap_bytes(&self) -> usize {
        let Ok(set) = self.set.lock() else { return 0 };
        let strings: usize = set.iter().map(|s| s.len() + 16).sum();
        strings + set.capacity() * (std::mem::size_of::<Str>() + 1)
    }

    pub fn len(&self) -> usize {
        self.set.lock().map(|s| s.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_text_same_allocation() {
        let i = Interner::default();
        let a = i.get("flp001");
        let b = i.get("flp001");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(i.len(), 1);
        drop((a, b));
        i.prune();
        assert!(i.is_empty());
    }
}

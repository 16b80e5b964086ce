//! The daemon's configuration store, read from a file (a mounted ConfigMap is one): reloaded
//! when the file changes, so the next create sees the new version; a broken new version is
//! reported and the last good one kept. Environments already rendered are never touched.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::workflow::store::ConfigStore;

/// What identifies one version of the file: modification time and length.
type Stamp = (Option<SystemTime>, u64);

#[derive(Debug)]
pub struct StoreFile {
    path: PathBuf,
    last: Mutex<Option<(Stamp, Arc<ConfigStore>)>>,
}

impl StoreFile {
    pub fn new(path: PathBuf) -> Self {
        StoreFile {
            path,
            last: Mutex::new(None),
        }
    }

    /// The current store: the file's if it changed and parses, else the last good one. An
    /// error only when no version has ever parsed.
    pub fn current(&self) -> Result<Arc<ConfigStore>, String> {
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let stamp: Option<Stamp> = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.modified().ok(), m.len()));
        if let (Some((seen, store)), Some(now)) = (last.as_ref(), stamp)
            && *seen == now
        {
            return Ok(store.clone());
        }
        match ConfigStore::load(&self.path) {
            Ok(s) => {
                let s = Arc::new(s);
                if let Some(now) = stamp {
                    if last.is_some() {
                        tracing::info!(file = %self.path.display(), "configuration store reloaded");
                    }
                    *last = Some((now, s.clone()));
                }
                Ok(s)
            }
            Err(e) => match last.as_ref() {
                Some((_, good)) => {
                    tracing::error!(error = %e, "configuration store: new version rejected, the last good one stays in use");
                    Ok(good.clone())
                }
                None => Err(format!("configuration store: {e}")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reloads_on_change_and_keeps_the_last_good_version() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("store.yaml");
        let write = |t: &str| std::fs::write(&p, t).unwrap();
        let detector = |s: &ConfigStore| s.detector_for_host("flp001").unwrap();
        write(
            "o2:\n  hardware:\n    detectors:\n      TST:\n        flps:\n          flp001: {}\n",
        );
        let f = StoreFile::new(p.clone());
        assert_eq!(detector(&f.current().unwrap()), "TST");
        // A new version (another length, so the stamp differs whatever the clock).
        write(
            "o2:\n  hardware:\n    detectors:\n      ITSX:\n        flps:\n          flp001: {}\n",
        );
        assert_eq!(detector(&f.current().unwrap()), "ITSX");
        // A broken version: reported, the last good one kept.
        write("o2: [\n");
        assert_eq!(detector(&f.current().unwrap()), "ITSX");
        // Never a good version: an error naming the file.
        let g = StoreFile::new(dir.path().join("missing.yaml"));
        assert!(g.current().unwrap_err().contains("missing.yaml"));
    }
}

//! Which watchers the apiserver cut off as unresponsive, read from its log. The metric counts
//! them by resource only, and several watchers share one (kwok's, the operator's, the
//! simulators', the controller-manager's Pod watches); the plane runs the apiserver with
//! `--vmodule=cache_watcher=1`, which logs each cut-off with its key, labels and fields, and
//! those selectors tell the watchers apart.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

/// At most this much of the log is read for one step: a step's cut-offs are a few lines among
/// the apiserver's warnings, and a log gone wild must not take the benchmark's memory.
const READ_MAX: u64 = 256 << 20;

/// Where the apiserver's log ended at a moment.
#[derive(Clone, Debug)]
pub struct LogMark {
    path: PathBuf,
    len: u64,
}

impl LogMark {
    pub fn now(path: PathBuf) -> LogMark {
        let len = std::fs::metadata(&path).map_or(0, |m| m.len());
        LogMark { path, len }
    }

    /// The watchers cut off since the mark, by "resource {key, labels, fields}", most first
    /// (none when the log cannot be read: the metric's count still stands). A log shorter than
    /// the mark was started again, and is read from its beginning.
    pub fn cut_since(&self) -> Vec<(String, usize)> {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        let len = f.metadata().map_or(0, |m| m.len());
        let from = if len < self.len { 0 } else { self.len };
        if f.seek(SeekFrom::Start(from)).is_err() {
            return Vec::new();
        }
        let mut text = Vec::new();
        if f.take(READ_MAX).read_to_end(&mut text).is_err() {
            return Vec::new();
        }
        count(&String::from_utf8_lossy(&text))
    }
}

/// Cut-off watchers in `log`, by watcher, most first.
fn count(log: &str) -> Vec<(String, usize)> {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for w in log.lines().filter_map(cut_off) {
        *by.entry(w).or_default() += 1;
    }
    let mut v: Vec<_> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// The watcher a "Forcing <resource> watcher close due to unresponsiveness[ (reason = ..)]:
/// key: .., labels: .., fields: ... len(c.input) = .." line names: "<resource> {key: ..,
/// labels: .., fields: ..}".
fn cut_off(line: &str) -> Option<String> {
    let (_, rest) = line.split_once("Forcing ")?;
    let (resource, rest) = rest.split_once(" watcher close due to unresponsiveness")?;
    let start = rest.find("key: ")?;
    let who = &rest[start..];
    let who = who.find(". len(").map_or(who, |end| &who[..end]);
    Some(format!("{resource} {{{}}}", who.trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_off_watchers_are_counted_by_resource_and_selector() {
        let log = concat!(
            "I1207 19:13:01.1 1 cache_watcher.go:203] Forcing pods watcher close due to ",
            "unresponsiveness: key: \"/pods\", labels: \"\", fields: \"spec.nodeName!=\". ",
            "len(c.input) = 10, len(c.result) = 10, graceful = false\n",
            "W1207 19:13:01.2 1 reflector.go:1] something else\n",
            "I1207 19:13:02.1 1 cache_watcher.go:203] Forcing pods watcher close due to ",
            "unresponsiveness (reason = unresponsive): key: \"/pods/ns\", labels: ",
            "\"app=x\", fields: \"\". len(c.input) = 10, len(c.result) = 3, graceful = true\n",
            "I1207 19:13:03.1 1 cache_watcher.go:203] Forcing pods watcher close due to ",
            "unresponsiveness: key: \"/pods\", labels: \"\", fields: \"spec.nodeName!=\". ",
            "len(c.input) = 10, len(c.result) = 10, graceful = false\n",
        );
        assert_eq!(
            count(log),
            vec![
                (
                    r#"pods {key: "/pods", labels: "", fields: "spec.nodeName!="}"#.to_string(),
                    2
                ),
                (
                    r#"pods {key: "/pods/ns", labels: "app=x", fields: ""}"#.to_string(),
                    1
                ),
            ]
        );
    }

    #[test]
    fn only_what_the_log_gained_since_the_mark_is_read() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("kube-apiserver.log");
        let line = "I1 Forcing tasks.envbridge.dev watcher close due to unresponsiveness: \
                    key: \"/t\", labels: \"\", fields: \"\". len(c.input) = 1\n";
        std::fs::write(&path, line).expect("write");
        let mark = LogMark::now(path.clone());
        assert!(
            mark.cut_since().is_empty(),
            "counted a line before the mark"
        );
        std::fs::write(&path, format!("{line}{line}")).expect("write");
        assert_eq!(mark.cut_since().len(), 1);
        assert_eq!(mark.cut_since()[0].1, 1);
        // Started again: shorter than the mark, read from the start.
        std::fs::write(&path, "").expect("write");
        assert!(mark.cut_since().is_empty());
    }
}

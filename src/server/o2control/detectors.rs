//! Detectors as the anchor's clients see them: the configuration store's inventory
//! (`o2/hardware/detectors/<DET>/flps/<host>`) against the environments the roster holds. An
//! environment includes the detectors of its hosts; a detector is active while an
//! environment includes it, available otherwise (pure: unit-tested without a store file).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::pb::o2control as pb;
use crate::roster::TaskRecord;

/// The inventory, by detector and by host.
#[derive(Debug, Default)]
pub struct Inventory {
    hosts: BTreeMap<String, Vec<String>>,
    all: Vec<String>,
    by_host: BTreeMap<String, String>,
}

impl Inventory {
    /// From the store's inventory (detector -> hosts). A host listed under two detectors
    /// belongs to the first by name, as the store's own lookup has it.
    pub fn new(inv: BTreeMap<String, Vec<String>>) -> Inventory {
        let mut by_host = BTreeMap::new();
        for (det, hosts) in &inv {
            for h in hosts {
                by_host.entry(h.clone()).or_insert_with(|| det.clone());
            }
        }
        Inventory {
            all: inv.keys().cloned().collect(),
            hosts: inv,
            by_host,
        }
    }

    /// Every detector, by name.
    pub fn all(&self) -> &[String] {
        &self.all
    }

    /// The hosts a detector's inventory lists (None: no such detector).
    pub fn hosts_of(&self, det: &str) -> Option<&[String]> {
        self.hosts.get(det).map(Vec::as_slice)
    }

    /// Every host some detector lists, by name.
    pub fn hosts(&self) -> Vec<String> {
        self.by_host.keys().cloned().collect()
    }

    pub fn detector_of(&self, host: &str) -> Option<&str> {
        self.by_host.get(host).map(String::as_str)
    }

    /// The detectors of some hosts, each once, by name (hosts the inventory does not list
    /// belong to none).
    pub fn detectors_of<'a>(&self, hosts: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let set: BTreeSet<&str> = hosts
            .into_iter()
            .filter_map(|h| self.detector_of(h))
            .collect();
        set.into_iter().map(str::to_string).collect()
    }

    /// (active, available): the detectors some environment's tasks are on, and the rest.
    pub fn split<'a>(
        &self,
        envs: impl IntoIterator<Item = &'a [Arc<TaskRecord>]>,
    ) -> (Vec<String>, Vec<String>) {
        let active: BTreeSet<String> = envs
            .into_iter()
            .flat_map(|tasks| self.detectors_of(tasks.iter().map(|t| &*t.node)))
            .collect();
        let available = self
            .all
            .iter()
            .filter(|d| !active.contains(*d))
            .cloned()
            .collect();
        (active.into_iter().collect(), available)
    }
}

/// An environment's `includedDetectors` (its hosts' detectors) and `numberOfFlps` (the
/// hosts its tasks are on: the anchor counts its `hosts`).
pub fn fill(info: &mut pb::EnvironmentInfo, inv: &Inventory, tasks: &[Arc<TaskRecord>]) {
    let hosts: BTreeSet<&str> = tasks.iter().map(|t| &*t.node).collect();
    info.included_detectors = inv.detectors_of(hosts.iter().copied());
    info.number_of_flps = hosts.len() as i32;
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::state::State;

    fn inv() -> Inventory {
        Inventory::new(
            [
                ("TST", vec!["flp001", "flp002"]),
                ("ITS", vec!["flp003"]),
                ("TRG", vec![]),
            ]
            .into_iter()
            .map(|(d, h)| (d.to_string(), h.into_iter().map(String::from).collect()))
            .collect(),
        )
    }

    fn on(node: &str) -> Arc<TaskRecord> {
        let name = format!("t-{node}");
        super::super::fixture::task(&name, node, "rd.readout", State::Standby, true)
    }

    #[test]
    fn an_environment_on_a_detectors_host_makes_it_active() {
        let i = inv();
        assert_eq!(i.all(), ["ITS", "TRG", "TST"]);
        assert_eq!(i.hosts_of("TST").unwrap(), ["flp001", "flp002"]);
        assert!(i.hosts_of("TPC").is_none());
        assert_eq!(i.hosts(), ["flp001", "flp002", "flp003"]);
        let e1 = vec![on("flp002"), on("flp002"), on("epn001")];
        let (active, available) = i.split([e1.as_slice()]);
        assert_eq!(active, ["TST"]);
        assert_eq!(available, ["ITS", "TRG"]);
        let (active, available) = i.split(std::iter::empty());
        assert!(active.is_empty());
        assert_eq!(available.len(), 3);
        let mut info = pb::EnvironmentInfo::default();
        fill(&mut info, &i, &e1);
        assert_eq!(info.included_detectors, ["TST"]);
        assert_eq!(info.number_of_flps, 2);
    }

    #[test]
    fn a_host_in_two_detectors_belongs_to_the_first() {
        let i = Inventory::new(
            [("A", vec!["h"]), ("B", vec!["h"])]
                .into_iter()
                .map(|(d, h)| (d.to_string(), h.into_iter().map(String::from).collect()))
                .collect(),
        );
        assert_eq!(i.detector_of("h"), Some("A"));
        assert_eq!(i.hosts_of("B").unwrap(), ["h"]);
        assert_eq!(
            Inventory::default().detectors_of(["h"]),
            Vec::<String>::new()
        );
    }
}

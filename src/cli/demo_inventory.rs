//! The demo's configuration store: a detector inventory for its simulated hosts, so that
//! the anchor's clients see detectors (docs/o2control.md). flp001 and flp002 are detector
//! TST's, the other hosts ITS's: an environment `--hold` keeps on the others leaves TST free
//! for a client's own readout-dataflow on flp001 and flp002.

use std::path::{Path, PathBuf};

/// The hosts of the detector a client's environment uses.
pub const CLIENT_HOSTS: [&str; 2] = ["flp001", "flp002"];

/// The store's text for `hosts`.
pub fn text(hosts: &[String]) -> String {
    let mut tst = String::new();
    let mut its = String::new();
    for h in hosts {
        let line = format!("          {h}: {{}}\n");
        if CLIENT_HOSTS.contains(&h.as_str()) {
            tst.push_str(&line);
        } else {
            its.push_str(&line);
        }
    }
    let block = |name: &str, body: &str| {
        if body.is_empty() {
            format!("      {name}: {{}}\n")
        } else {
            format!("      {name}:\n        flps:\n{body}")
        }
    };
    format!(
        "# envbridge demo: the simulated hosts' detector inventory\no2:\n  hardware:\n    detectors:\n{}{}",
        block("TST", &tst),
        block("ITS", &its)
    )
}

/// Writes the store into `dir`, returning its path.
pub fn write(dir: &Path, hosts: &[String]) -> Result<PathBuf, String> {
    let path = dir.join("inventory.yaml");
    std::fs::write(&path, text(hosts)).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envbridge::workflow::store::ConfigStore;

    #[test]
    fn the_first_two_hosts_are_tst_and_the_rest_its() {
        let hosts: Vec<String> = (1..=4).map(|i| format!("flp{i:03}")).collect();
        let s = ConfigStore::parse("inventory.yaml", &text(&hosts)).expect("a store");
        let inv = s.inventory();
        assert_eq!(inv["TST"], ["flp001", "flp002"]);
        assert_eq!(inv["ITS"], ["flp003", "flp004"]);
        let two = ConfigStore::parse("inventory.yaml", &text(&hosts[..2])).expect("a store");
        assert!(two.inventory()["ITS"].is_empty());
    }
}

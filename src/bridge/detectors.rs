//! One environment per detector, as in the anchor: a create whose hosts include a host of a
//! detector that another environment is on is refused, naming the detector and the
//! environment holding it. Detectors are the configuration store's inventory; hosts it does
//! not list belong to no detector and are not restricted (pure: unit-tested).

use std::collections::BTreeMap;

use super::error::BridgeError;

/// Host -> the environment (`namespace/name`) that holds it.
pub type HostsHeld = BTreeMap<String, String>;

/// The first conflict between the hosts of a new environment and those other environments
/// hold, given each host's detector (`detector_of`, the store's lookup).
pub fn check<'a>(
    new_hosts: impl IntoIterator<Item = &'a str>,
    held: &HostsHeld,
    detector_of: impl Fn(&str) -> Option<String>,
) -> Result<(), BridgeError> {
    // Detector -> (a host of it, the environment holding that host).
    let mut busy: BTreeMap<String, (&str, &str)> = BTreeMap::new();
    for (host, env) in held {
        if let Some(d) = detector_of(host) {
            busy.entry(d).or_insert((host, env));
        }
    }
    for h in new_hosts {
        if let Some(d) = detector_of(h)
            && let Some((host, env)) = busy.get(&d)
        {
            return Err(BridgeError::DetectorInUse {
                detector: d,
                host: host.to_string(),
                environment: env.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn det(h: &str) -> Option<String> {
        match h {
            "flp001" | "flp002" => Some("TST".into()),
            "flp003" => Some("ITS".into()),
            _ => None,
        }
    }

    #[test]
    fn a_host_of_a_busy_detector_is_refused_naming_it_and_the_holder() {
        let held: HostsHeld = [("flp001".to_string(), "runs/e1".to_string())].into();
        let e = check(["flp002"], &held, det).expect_err("TST is busy");
        let msg = e.to_string();
        assert!(
            msg.contains("detector TST") && msg.contains("runs/e1"),
            "{msg}"
        );
        assert!(
            msg.contains("flp001") && msg.contains("nothing was written"),
            "{msg}"
        );
        assert!(check(["flp003"], &held, det).is_ok(), "ITS is free");
    }

    #[test]
    fn hosts_outside_the_inventory_are_not_restricted() {
        let held: HostsHeld = [("epn001".to_string(), "runs/e1".to_string())].into();
        assert!(check(["epn001", "flp001"], &held, det).is_ok());
        assert!(check(["flp001"], &HostsHeld::new(), det).is_ok());
    }
}

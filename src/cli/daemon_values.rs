//! The text forms of the daemon's compound settings, one parser each, shared by the flags,
//! the environment variables and the config file: `FIRST-LAST`, `NAMESPACE/NAME`,
//! `PLUGIN=URL`, `EVENT=SECONDS`, the o2control listener's role.

use envbridge::state::Event;

/// `FIRST-LAST`, two ports, 0 < FIRST <= LAST.
pub fn port_range(s: &str) -> Result<(u16, u16), String> {
    let (a, z) = s
        .split_once('-')
        .ok_or_else(|| format!("port range {s:?}: expected FIRST-LAST"))?;
    let a: u16 = a
        .trim()
        .parse()
        .map_err(|_| format!("port range {s:?}: FIRST is not a port"))?;
    let z: u16 = z
        .trim()
        .parse()
        .map_err(|_| format!("port range {s:?}: LAST is not a port"))?;
    if a == 0 || a > z {
        return Err(format!("port range {s:?}: need 0 < FIRST <= LAST"));
    }
    Ok((a, z))
}

/// `PLUGIN=URL`, an http:// URL.
pub fn plugin_endpoint(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((p, u)) if !p.is_empty() && u.starts_with("http://") => {
            Ok((p.to_string(), u.to_string()))
        }
        _ => Err(format!("`{s}` is not PLUGIN=http://HOST:PORT/PATH")),
    }
}

/// `NAMESPACE/NAME`.
pub fn namespaced_name(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("`{s}` is not NAMESPACE/NAME")),
    }
}

/// `EVENT=SECONDS`, a transition's own timeout.
pub fn event_timeout(kv: &str) -> Result<(Event, u64), String> {
    let (k, v) = kv
        .split_once('=')
        .ok_or_else(|| format!("transition-timeout {kv:?}: expected EVENT=SECONDS"))?;
    let v = v
        .parse()
        .map_err(|_| format!("transition-timeout {kv:?}: seconds must be a number"))?;
    let ev: Event = k.parse().map_err(|e| format!("transition-timeout: {e}"))?;
    Ok((ev, v))
}

/// `--o2control-role viewer|operator`: the one role of the o2control listener's callers.
pub fn o2control_role(s: &str) -> Result<envbridge::server::auth::Role, String> {
    use envbridge::server::auth::Role;
    match s.trim() {
        "viewer" => Ok(Role::Viewer),
        "operator" => Ok(Role::Operator),
        other => Err(format!(
            "{other:?}: the o2control role is viewer or operator"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_is_read_or_refused_with_the_reason() {
        assert_eq!(port_range("47100-47999"), Ok((47100, 47999)));
        assert_eq!(port_range(" 5 - 5 "), Ok((5, 5)));
        for (bad, why) in [
            ("47100", "expected FIRST-LAST"),
            ("x-3", "FIRST is not a port"),
            ("3-70000", "LAST is not a port"),
            ("0-3", "need 0 < FIRST <= LAST"),
            ("9-3", "need 0 < FIRST <= LAST"),
        ] {
            let e = port_range(bad).expect_err(bad);
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
        assert_eq!(
            plugin_endpoint("bk=http://h:1/x"),
            Ok(("bk".into(), "http://h:1/x".into()))
        );
        assert!(plugin_endpoint("bk=https://h:1").is_err());
        assert!(plugin_endpoint("=http://h:1").is_err());
        assert_eq!(namespaced_name("ns/cm"), Ok(("ns".into(), "cm".into())));
        for bad in ["ns", "/cm", "ns/", "ns/a/b"] {
            assert!(namespaced_name(bad).is_err(), "{bad}");
        }
        assert_eq!(event_timeout("START=4"), Ok((Event::Start, 4)));
        let e = event_timeout("START").expect_err("no =");
        assert!(e.contains("expected EVENT=SECONDS"), "{e}");
        let e = event_timeout("START=x").expect_err("not a number");
        assert!(e.contains("seconds must be a number"), "{e}");
        let e = event_timeout("LAUNCH=3").expect_err("no such event");
        assert!(e.contains("LAUNCH"), "{e}");
        use envbridge::server::auth::Role;
        assert_eq!(o2control_role("viewer"), Ok(Role::Viewer));
        assert_eq!(o2control_role("operator"), Ok(Role::Operator));
        let e = o2control_role("admin").expect_err("not an o2control role");
        assert!(e.contains("viewer or operator"), "{e}");
    }
}

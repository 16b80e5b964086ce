//! Endpoint arguments bound to loopback are rewritten to the pod's IP; nothing else is touched.
//!
//! A broad rewrite of every host breaks unrelated arguments (drunc's review rejected it): only
//! `grpc://` or `tcp://` endpoints whose host is `localhost`, `0.0.0.0` or `127.0.0.1` change.

/// What a rewritten host becomes: Kubernetes expands `$(POD_IP)` from the container env.
pub const POD_IP_REF: &str = "$(POD_IP)";

const SCHEMES: [&str; 2] = ["grpc://", "tcp://"];
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "0.0.0.0", "127.0.0.1"];

/// Rewrites every loopback endpoint inside `arg` (also after `--flag=`), returns it unchanged otherwise.
pub fn rewrite_loopback(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some((pos, scheme)) = next_scheme(rest) {
        let after = &rest[pos + scheme.len()..];
        out.push_str(&rest[..pos + scheme.len()]);
        match LOOPBACK_HOSTS.iter().find(|h| host_matches(after, h)) {
            Some(host) => {
                out.push_str(POD_IP_REF);
                rest = &after[host.len()..];
            }
            None => rest = after,
        }
    }
    out.push_str(rest);
    out
}

fn next_scheme(s: &str) -> Option<(usize, &'static str)> {
    SCHEMES
        .iter()
        .filter_map(|sch| s.find(sch).map(|p| (p, *sch)))
        .min_by_key(|(p, _)| *p)
}

/// The host must end where the authority's host ends (`:port`, `/`, end, or a separator).
fn host_matches(after: &str, host: &str) -> bool {
    after.starts_with(host)
        && after[host.len()..]
            .chars()
            .next()
            .is_none_or(|c| matches!(c, ':' | '/' | ',' | ';' | ' ' | '"' | '\''))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_endpoints_are_rewritten() {
        assert_eq!(
            rewrite_loopback("grpc://localhost:47100"),
            "grpc://$(POD_IP):47100"
        );
        assert_eq!(
            rewrite_loopback("tcp://0.0.0.0:5555"),
            "tcp://$(POD_IP):5555"
        );
        assert_eq!(
            rewrite_loopback("--bind=tcp://127.0.0.1:1/x"),
            "--bind=tcp://$(POD_IP):1/x"
        );
        assert_eq!(
            rewrite_loopback("a=grpc://localhost:1,b=tcp://127.0.0.1:2"),
            "a=grpc://$(POD_IP):1,b=tcp://$(POD_IP):2"
        );
        assert_eq!(rewrite_loopback("tcp://localhost"), "tcp://$(POD_IP)");
    }

    #[test]
    fn everything_else_is_untouched() {
        for arg in [
            "http://localhost:8500/x",
            "consul-ini://localhost:8500/o2",
            "tcp://flp001:5555",
            "tcp://*:5555",
            "grpc://localhost.example.org:1",
            "tcp://127.0.0.10:5",
            "ipc://@o2ipc-abc",
            "localhost:47100",
            "--id",
            "",
        ] {
            assert_eq!(rewrite_loopback(arg), arg);
        }
    }
}

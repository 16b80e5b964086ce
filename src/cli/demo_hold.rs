//! `envbridge demo --hold`: after the demo's own steps, one environment left RUNNING and
//! everything kept up until Ctrl-C, so that a person can look at it on the dashboard. It runs
//! on the hosts other than flp001 and flp002, which stay free for a client's environment
//! (coconut's, the ControlGUI's, over `--o2control-listen`).

use super::demo::{create, destroy, say, step, transition};
use super::demo_inventory::CLIENT_HOSTS;
use super::env_connect::Client;

/// The dashboard's address and where its login token is (never the token itself).
pub fn announce(http: &str, token_file: &std::path::Path) {
    say(&format!(
        "dashboard: http://{http}/ui/ (log in with the admin token in {}, a file only you may read)",
        token_file.display()
    ));
}

/// The hosts the held environment uses: the demo's hosts but flp001 and flp002 (detector
/// TST), which stay free for a client's own environment.
pub fn hold_hosts(hosts: &[String]) -> Result<Vec<String>, String> {
    let rest: Vec<String> = hosts
        .iter()
        .filter(|h| !CLIENT_HOSTS.contains(&h.as_str()))
        .cloned()
        .collect();
    if rest.is_empty() {
        return Err(format!(
            "--hold keeps an environment on hosts other than {}, which stay free for a client: it needs --nodes 3 or more",
            CLIENT_HOSTS.join(" and ")
        ));
    }
    Ok(rest)
}

/// Creates `demo-hold` on [`hold_hosts`], runs it to RUNNING, waits for Ctrl-C, destroys it.
pub async fn hold(
    api: &mut Client,
    live: &mut Vec<String>,
    hosts: &[String],
    http: &str,
    token_file: &std::path::Path,
) -> Result<(), String> {
    let held = hold_hosts(hosts)?;
    let hosts_json = serde_json::to_string(&held).map_err(|e| e.to_string())?;
    step(&format!(
        "--hold: an environment left RUNNING on {} for you to look at ({} stay free)",
        held.join(", "),
        CLIENT_HOSTS.join(" and ")
    ));
    let env = create(
        api,
        live,
        "demo-hold",
        "readout-dataflow",
        &[("hosts", hosts_json.as_str())],
    )
    .await?;
    for (event, args) in [
        ("CONFIGURE", &[][..]),
        ("START", &[("run_type", "PHYSICS")][..]),
    ] {
        let r = transition(api, &env.id, event, args).await?;
        if !r.ok {
            return Err(format!("{event} of {}: {}", env.id, r.message));
        }
    }
    until_ctrl_c(http, token_file).await?;
    destroy(api, &env.id).await?;
    live.retain(|id| id != &env.id);
    say(&format!("environment {} destroyed", env.id));
    Ok(())
}

/// Keeps everything up (the daemon, its dashboard, the operator) until Ctrl-C.
pub async fn until_ctrl_c(http: &str, token_file: &std::path::Path) -> Result<(), String> {
    announce(http, token_file);
    say("everything stays up until Ctrl-C");
    tokio::signal::ctrl_c()
        .await
        .map_err(|e| format!("waiting for Ctrl-C: {e}"))?;
    step("Ctrl-C: ending the demo");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_held_environment_leaves_the_clients_hosts_free() {
        let hosts: Vec<String> = (1..=4).map(|i| format!("flp{i:03}")).collect();
        assert_eq!(hold_hosts(&hosts).unwrap(), ["flp003", "flp004"]);
        let e = hold_hosts(&hosts[..2]).unwrap_err();
        assert!(e.contains("--nodes 3"), "{e}");
    }
}

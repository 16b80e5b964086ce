//! `envbridge demo --hold`: after the demo's own steps, one environment left RUNNING and
//! everything kept up until Ctrl-C, so that a person can look at it on the dashboard.

use super::demo::{create, destroy, say, step, transition};
use super::env_connect::Client;

/// The dashboard's address and where its login token is (never the token itself).
pub fn announce(http: &str, token_file: &std::path::Path) {
    say(&format!(
        "dashboard: http://{http}/ui/ (log in with the admin token in {}, a file only you may read)",
        token_file.display()
    ));
}

/// Creates `demo-hold`, runs it to RUNNING, waits for Ctrl-C, destroys it.
pub async fn hold(
    api: &mut Client,
    live: &mut Vec<String>,
    hosts_json: &str,
    http: &str,
    token_file: &std::path::Path,
) -> Result<(), String> {
    step("--hold: an environment left RUNNING for you to look at");
    let env = create(
        api,
        live,
        "demo-hold",
        "readout-dataflow",
        &[("hosts", hosts_json)],
    )
    .await?;
    for (event, args) in [
        ("CONFIGURE", &[][..]),
        ("START", &[("run_number", "3"), ("run_type", "PHYSICS")][..]),
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

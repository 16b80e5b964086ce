//! `envbridge logs ENV [TASK] [--follow] [--since D]`: task container logs with timestamps,
//! read from the apiserver with the user's kubeconfig (as kubectl does; docs/logs.md).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use envbridge::control::log_resume::FollowOptions;
use envbridge::control::log_stream::{PodLog, TaskLog, follow_tasks, format_line};
use envbridge::control::log_targets::{find_environment, find_targets};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

#[derive(clap::Args, Debug)]
pub struct LogsArgs {
    /// Environment id or name (NAMESPACE/NAME when the name is used in several namespaces).
    pub env: String,
    /// Only this task (by task name); default: every task, each line prefixed with its name.
    pub task: Option<String>,
    /// Keep following new lines until every container has ended.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only lines newer than this: 30s, 5m, 1h, 1h30m.
    #[arg(long, value_name = "D", value_parser = since)]
    pub since: Option<Duration>,
    /// Look for the environment in this namespace only (default: all namespaces).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

fn since(s: &str) -> Result<Duration, String> {
    envbridge::workflow::duration::parse_duration(s)
        .map(|secs| Duration::from_secs(secs.into()))
        .ok_or_else(|| format!("expected a duration like 30s, 5m or 1h, got {s:?}"))
}

pub fn run(args: LogsArgs) -> ExitCode {
    super::block_on_client(logs(args))
}

async fn client(kubeconfig: Option<&PathBuf>, follow: bool) -> Result<kube::Client, String> {
    let mut cfg = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("kubernetes client config: {e}"))?,
    };
    cfg.connect_timeout = Some(Duration::from_secs(5));
    if follow {
        // A followed log may stay quiet for long; a read timeout would cut it (kubectl sets none).
        cfg.read_timeout = None;
    }
    kube::Client::try_from(cfg).map_err(|e| format!("kubernetes client: {e}"))
}

async fn logs(a: LogsArgs) -> Result<ExitCode, String> {
    let client = client(a.kubeconfig.as_ref(), a.follow).await?;
    let env = find_environment(&client, &a.env, a.namespace.as_deref())
        .await
        .map_err(|e| e.to_string())?;
    let targets = find_targets(&client, &env, a.task.as_deref())
        .await
        .map_err(|e| e.to_string())?;
    if targets.ready.is_empty() && a.task.is_some() {
        // The one task asked for: its reason is the error.
        if let Some(e) = targets.not_started.first() {
            return Err(e.to_string());
        }
    }
    let mut failed = false;
    for e in &targets.not_started {
        eprintln!("envbridge logs: {e}");
        failed = true;
    }
    if targets.ready.is_empty() {
        return Err("no task container has started yet".into());
    }
    // Several tasks: prefix each line with its task, as `kubectl logs --prefix` does.
    let prefix = a.task.is_none();
    let opts = FollowOptions {
        since: a.since.map(|d| {
            let t = jiff::Timestamp::now() - d;
            jiff::Timestamp::from_second(t.as_second()).unwrap_or(t)
        }),
        ..FollowOptions::default()
    };
    let sources = targets
        .ready
        .into_iter()
        .map(|t| {
            let src = PodLog {
                pods: Api::<Pod>::namespaced(client.clone(), &t.namespace),
                pod: t.pod,
                container: t.container,
                follow: a.follow,
            };
            (t.task, src)
        })
        .collect();
    let mut stream = Box::pin(follow_tasks(sources, opts));
    let stdout = std::io::stdout();
    while let Some(ev) = stream.next().await {
        match ev {
            TaskLog::Line { task, line } => {
                let text = format_line(prefix.then_some(task.as_str()), &line);
                let mut out = stdout.lock();
                // A closed stdout (`| head`) ends the command quietly.
                if writeln!(out, "{text}").and_then(|_| out.flush()).is_err() {
                    return Ok(ExitCode::SUCCESS);
                }
            }
            TaskLog::Lost { task, error } => {
                eprintln!("envbridge logs: task {task}: {error}");
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_human_durations() {
        assert_eq!(since("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(since("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(since("1h"), Ok(Duration::from_secs(3600)));
        assert!(since("soon").unwrap_err().contains("30s, 5m or 1h"));
    }
}

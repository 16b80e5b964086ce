//! A private plane whose kwok reaches the apiserver through the watch relay: kwok speaks
//! HTTP/1.1 to the relay's port (nothing else), pods still run, and the plane is reused
//! as it is (the relay counts as one of its processes).

use envbridge::dev::{UpSpec, addressing};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;

use super::{pod, wait_phase};

/// (pid, argv) of every process whose command line has an argument containing `needle`.
fn processes_with(needle: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).into_owned();
            let argv: Vec<String> = cmd.split('\0').map(str::to_string).collect();
            Some((e.file_name().to_string_lossy().into_owned(), argv))
        })
        .filter(|(_, argv)| argv.iter().any(|a| a.contains(needle)))
        .collect();
    out.sort();
    out
}

/// The plane's processes: those naming its directory, and its relay (named by the
/// apiserver's address it relays to).
fn processes(dir: &std::path::Path, apiserver: &str) -> Vec<(String, Vec<String>)> {
    let mut out = processes_with(&dir.to_string_lossy());
    out.extend(processes_with(&format!("--upstream={apiserver}")));
    out.sort();
    out
}

fn kwok(dir: &std::path::Path) -> Option<(String, Vec<String>)> {
    processes_with(&dir.to_string_lossy())
        .into_iter()
        .find(|(_, argv)| argv[0].ends_with("/kwok"))
}

fn flag<'a>(argv: &'a [String], name: &str) -> Option<&'a str> {
    argv.iter().find_map(|a| a.strip_prefix(name))
}

struct Down(std::path::PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        if let Err(e) = envbridge::dev::down_in(&self.0) {
            eprintln!("taking the private plane down: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kwok_through_the_watch_relay_runs_pods_over_http1_to_the_relay_only() {
    let tmp = tempfile::Builder::new()
        .prefix("envbridge-kwok-relay-")
        .tempdir()
        .expect("tmp");
    let dir = tmp.path().join("dev");
    let spec = UpSpec {
        nodes: 2,
        kwok_relay: true,
        exe: Some(env!("CARGO_BIN_EXE_envbridge").into()),
        ..Default::default()
    };
    let down = Down(dir.clone());
    let info = envbridge::dev::ensure_up_in_with(&dir, &spec, &[])
        .await
        .unwrap_or_else(|e| panic!("private plane with the kwok relay: {e}"));
    assert!(info.kwok_relay, "the plane does not say it has the relay");

    let (kwok_pid, kwok_argv) = kwok(&dir).expect("kwok runs");
    let apiserver = info.server.trim_start_matches("https://").to_string();
    let relays = processes_with(&format!("--upstream={apiserver}"));
    assert_eq!(
        relays.len(),
        1,
        "one relay to this plane's apiserver: {relays:?}"
    );
    let relay = &relays[0];
    assert!(relay.1.iter().any(|a| a == "watch-relay"), "{relay:?}");
    let listen = flag(&relay.1, "--listen=").expect("--listen");
    // kwok's only way to the apiserver is the relay's port, over HTTP/1.1.
    let kubeconfig = flag(&kwok_argv, "--kubeconfig=").expect("kwok's --kubeconfig");
    let servers: Vec<String> = std::fs::read_to_string(kubeconfig)
        .expect("kwok's kubeconfig")
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("server:")
                .map(|s| s.trim().trim_matches('"').to_string())
        })
        .collect();
    assert_eq!(servers, [format!("https://{listen}")]);
    let environ = std::fs::read(format!("/proc/{kwok_pid}/environ")).expect("kwok's environ");
    assert!(
        environ.split(|b| *b == 0).any(|v| v == b"DISABLE_HTTP2=1"),
        "kwok would speak HTTP/2 through the relay"
    );

    // Pods run: kwok sees them and writes their status through the relay.
    let client = envbridge::dev::client_for(&info.kubeconfig)
        .await
        .expect("client");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    for n in 1..=2u32 {
        pods.create(
            &PostParams::default(),
            &pod(&format!("r{n}"), &addressing::node_name(n), &[], &[]),
        )
        .await
        .expect("create pod");
    }
    for n in 1..=2u32 {
        wait_phase(&pods, &format!("r{n}"), "Running").await;
    }

    // Reused as it is: the relay is one of the plane's processes, not a stranger.
    let before = processes(&dir, &apiserver);
    envbridge::dev::ensure_up_in_with(&dir, &spec, &[])
        .await
        .unwrap_or_else(|e| panic!("the plane again: {e}"));
    assert_eq!(
        processes(&dir, &apiserver),
        before,
        "the plane was restarted"
    );
    drop(down);
    assert!(
        processes(&dir, &apiserver).is_empty(),
        "a process left after down"
    );
}

//! The daemon's config file against its flags: the same structure, the same settings.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use envbridge::bridge::NamespaceMode;
use envbridge::state::Event;

use super::super::daemon::{Settings, resolve};
use super::*;

#[derive(Parser)]
struct Cmd {
    #[command(flatten)]
    args: DaemonArgs,
}

fn flags(argv: &[&str]) -> DaemonArgs {
    let argv = std::iter::once("daemon").chain(argv.iter().copied());
    Cmd::try_parse_from(argv).expect("flags").args
}

/// A key's value, written as YAML flow style or TOML.
enum V<'a> {
    S(&'a str),
    N(u64),
    B(bool),
    L(&'static [&'static str]),
    M(&'static [(&'static str, &'static str)]),
    MN(&'static [(&'static str, u64)]),
}

fn text(keys: &[(&str, V<'_>)], toml: bool) -> String {
    let is = if toml { " = " } else { ": " };
    keys.iter()
        .map(|(k, v)| {
            let v = match v {
                V::S(s) => format!("{s:?}"),
                V::N(n) => n.to_string(),
                V::B(b) => b.to_string(),
                V::L(l) => format!("{l:?}"),
                V::M(m) => {
                    let e: Vec<String> = m.iter().map(|(k, v)| format!("{k}{is}{v:?}")).collect();
                    format!("{{ {} }}", e.join(", "))
                }
                V::MN(m) => {
                    let e: Vec<String> = m.iter().map(|(k, v)| format!("{k}{is}{v}")).collect();
                    format!("{{ {} }}", e.join(", "))
                }
            };
            format!("{k}{is}{v}\n")
        })
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

/// Settings as comparable text (the per-event map sorted: a HashMap's order varies).
fn view(s: &Settings) -> String {
    let mut b = s.bridge.clone();
    let mut per_event: Vec<(String, Duration)> = b
        .transition_timeouts
        .drain()
        .map(|(e, d)| (format!("{e:?}"), d))
        .collect();
    per_event.sort();
    format!(
        "{b:?}\n{per_event:?}\n{:?}\n{:?}\n{:?}\n{:?}",
        s.server, s.lease, s.log_format, s.renamed
    )
}

/// Every key (but token-file, a temporary file) except the other side of each exclusive
/// pair (namespace-prefix, config-map, the lease's name).
fn every_key_fixed() -> Vec<(&'static str, V<'static>)> {
    vec![
        ("listen", V::S("127.0.0.1:50071")),
        ("metrics-listen", V::S("127.0.0.1:9471")),
        ("tls-cert", V::S("/etc/tls/tls.crt")),
        ("tls-key", V::S("/etc/tls/tls.key")),
        ("o2control-listen", V::S("127.0.0.1:50072")),
        ("o2control-role", V::S("operator")),
        ("namespace", V::S("runs")),
        ("watch-namespace", V::S("runs")),
        ("shard", V::S("its")),
        ("tasks-dir", V::S("/w/tasks")),
        ("workflows-dir", V::S("/w/workflows")),
        ("defaults", V::L(&["/site/a.yaml", "/site/b.yaml"])),
        ("config-store", V::S("/site/store.yaml")),
        (
            "integrations",
            V::M(&[
                ("bookkeeping", "http://bk:8080/x"),
                ("dcs", "http://dcs:1/y"),
            ]),
        ),
        ("templates", V::S("/site/templates.yaml")),
        ("caller-variables", V::L(&["detector", "run_type"])),
        ("max-hosts", V::N(12)),
        ("max-tasks", V::N(345)),
        ("render-deadline", V::N(6)),
        ("jit-dir", V::S("/w/jit")),
        ("jit-generator", V::S("/site/jit-generate")),
        ("jit-generator-deadline", V::N(7)),
        ("jit-generator-max-bytes", V::N(100000)),
        ("control-ports", V::S("50000-50099")),
        ("tcp-ports", V::S("51000-51999")),
        ("deploy-timeout", V::N(91)),
        ("destroy-timeout", V::N(92)),
        ("kill-timeout", V::N(93)),
        ("namespace-gone-timeout", V::N(94)),
        ("namespace-active-timeout", V::N(95)),
        (
            "transition-timeouts",
            V::MN(&[("CONFIGURE", 96), ("START", 97)]),
        ),
        ("default-transition-timeout", V::N(98)),
        ("orphan-grace", V::N(99)),
        ("leader-election", V::B(false)),
        ("log-format", V::S("json")),
    ]
}

const FLAGS_FIXED: &[&str] = &[
    "--listen=127.0.0.1:50071",
    "--metrics-listen=127.0.0.1:9471",
    "--tls-cert=/etc/tls/tls.crt",
    "--tls-key=/etc/tls/tls.key",
    "--o2control-listen=127.0.0.1:50072",
    "--o2control-role=operator",
    "--namespace=runs",
    "--watch-namespace=runs",
    "--shard=its",
    "--tasks-dir=/w/tasks",
    "--workflows-dir=/w/workflows",
    "--defaults=/site/a.yaml",
    "--defaults=/site/b.yaml",
    "--config-store=/site/store.yaml",
    "--integration=bookkeeping=http://bk:8080/x",
    "--integration=dcs=http://dcs:1/y",
    "--templates=/site/templates.yaml",
    "--allow-variable=detector",
    "--allow-variable=run_type",
    "--max-hosts=12",
    "--max-tasks=345",
    "--render-deadline=6",
    "--jit-dir=/w/jit",
    "--jit-generator=/site/jit-generate",
    "--jit-generator-deadline=7",
    "--jit-generator-max-bytes=100000",
    "--control-ports=50000-50099",
    "--tcp-ports=51000-51999",
    "--deploy-timeout=91",
    "--destroy-timeout=92",
    "--kill-timeout=93",
    "--namespace-gone-timeout=94",
    "--namespace-active-timeout=95",
    "--transition-timeout=CONFIGURE=96",
    "--transition-timeout=START=97",
    "--default-transition-timeout=98",
    "--orphan-grace=99",
    "--no-leader-election",
    "--log-format=json",
];

/// The keys the other variant takes instead.
fn every_key_per_env() -> Vec<(&'static str, V<'static>)> {
    let swapped = [
        "namespace",
        "watch-namespace",
        "config-store",
        "leader-election",
    ];
    let mut keys: Vec<(&str, V)> = every_key_fixed()
        .into_iter()
        .filter(|(k, _)| !swapped.contains(k))
        .collect();
    keys.extend([
        ("namespace-prefix", V::S("env-")),
        ("config-map", V::S("site/store")),
        ("leader-election", V::B(true)),
        ("lease-name", V::S("bridge-lease")),
        ("lease-namespace", V::S("bridge-system")),
    ]);
    keys
}

fn flags_per_env() -> Vec<&'static str> {
    let swapped = [
        "--namespace=",
        "--watch-namespace=",
        "--config-store=",
        "--no-leader-election",
    ];
    let mut f: Vec<&str> = FLAGS_FIXED
        .iter()
        .copied()
        .filter(|f| !swapped.iter().any(|s| f.starts_with(s)))
        .collect();
    f.extend([
        "--namespace-prefix=env-",
        "--config-map=site/store",
        "--lease-name=bridge-lease",
        "--lease-namespace=bridge-system",
    ]);
    f
}

#[test]
fn a_file_with_every_key_resolves_as_the_same_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tok = write(dir.path(), "token", "s3cret-token-of-enough-length\n");
    std::fs::set_permissions(&tok, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let tok = tok.to_str().expect("utf-8");
    for (mut keys, flag_list) in [
        (every_key_fixed(), FLAGS_FIXED.to_vec()),
        (every_key_per_env(), flags_per_env()),
    ] {
        keys.push(("token-file", V::S(tok)));
        let mut argv = flag_list.clone();
        let token_flag = format!("--token-file={tok}");
        argv.push(&token_flag);
        let by_flags = flags(&argv);
        let expected = view(&resolve(flags(&argv)).expect("flags resolve"));
        for (name, toml) in [("d.yaml", false), ("d.toml", true)] {
            let p = write(dir.path(), name, &text(&keys, toml));
            // The same structure: every key lands where its flag does.
            let file = load_file(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(DaemonArgs::default().over_file(file), by_flags, "{name}");
            let p = p.to_str().expect("utf-8");
            let s = resolve(flags(&["--config", p])).expect("file resolve");
            assert_eq!(view(&s), expected, "{name}");
        }
    }
    // And not merely equal to the defaults.
    let mut keys = every_key_per_env();
    keys.push(("token-file", V::S(tok)));
    let p = write(dir.path(), "d.yaml", &text(&keys, false));
    let s = resolve(flags(&["--config", p.to_str().expect("utf-8")])).expect("resolve");
    assert_eq!(
        s.bridge.namespaces,
        NamespaceMode::PerEnvironment {
            prefix: "env-".into()
        }
    );
    assert_eq!(s.bridge.config_map, Some(("site".into(), "store".into())));
    assert_eq!(s.bridge.tcp_ports, 51000..=51999);
    assert_eq!(s.bridge.integrations.len(), 2);
    assert_eq!(
        s.bridge.transition_timeout(Event::Start),
        Duration::from_secs(97)
    );
    let lease = s.lease.expect("elected");
    assert_eq!(
        (lease.name.as_str(), lease.namespace.as_str()),
        ("bridge-lease", "bridge-system")
    );
    assert!(s.server.tokens.is_some());
    let o2 = s.server.o2control.expect("the o2control listener");
    assert_eq!(o2.addr.to_string(), "127.0.0.1:50072");
    assert_eq!(o2.role, envbridge::server::auth::Role::Operator);
}

#[test]
fn flags_override_the_files_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "d.yaml",
        "namespace-prefix: env-\ndeploy-timeout: 7\ncontrol-ports: 50000-50099\n\
         integrations: {bk: 'http://file:1/', dcs: 'http://dcs:1/'}\n\
         caller-variables: [a]\ndefaults: [/f.yaml]\n\
         transition-timeouts: {START: 5, STOP: 6}\nlease-name: file-lease\n\
         leader-election: true\nlog-format: json\n",
    );
    let p = p.to_str().expect("utf-8");
    let s = resolve(flags(&[
        "--config",
        p,
        "--insecure-no-auth",
        "--deploy-timeout=3",
        "--control-ports=40000-40009",
        "--integration=bk=http://flag:1/",
        "--allow-variable=b",
        "--defaults=/g.yaml",
        "--transition-timeout=START=4",
        "--lease-name=flag-lease",
        "--log-format=text",
    ]))
    .expect("resolve");
    assert_eq!(s.bridge.deploy_timeout, Duration::from_secs(3));
    assert_eq!(s.bridge.control_ports, 40000..=40009);
    // Keyed lists: the flag's entry wins for its key, the file's other entries stay.
    assert_eq!(s.bridge.integrations["bk"], "http://flag:1/");
    assert_eq!(s.bridge.integrations["dcs"], "http://dcs:1/");
    assert_eq!(
        s.bridge.transition_timeout(Event::Start),
        Duration::from_secs(4)
    );
    assert_eq!(
        s.bridge.transition_timeout(Event::Stop),
        Duration::from_secs(6)
    );
    let allowed: Vec<&str> = s.bridge.caller.allowed.iter().map(|v| v.as_str()).collect();
    assert_eq!(allowed, ["a", "b"]);
    // Site profiles from flags replace the file's list.
    assert_eq!(s.bridge.defaults_files, [PathBuf::from("/g.yaml")]);
    assert_eq!(s.lease.expect("elected").name, "flag-lease");
    assert_eq!(s.log_format, envbridge::launch::logging::LogFormat::Text);
    // What no flag gave comes from the file.
    assert_eq!(
        s.bridge.namespaces,
        NamespaceMode::PerEnvironment {
            prefix: "env-".into()
        }
    );
    // The switch: the flag turns election off whatever the file says.
    let s = resolve(flags(&[
        "--config",
        p,
        "--insecure-no-auth",
        "--no-leader-election",
    ]))
    .expect("resolve");
    assert_eq!(s.lease, None);
    // A flag that excludes a file's key is refused as before.
    let e = resolve(flags(&[
        "--config",
        p,
        "--insecure-no-auth",
        "--namespace=x",
    ]))
    .err()
    .expect("exclusive");
    assert!(
        e.contains("namespace and namespace-prefix exclude each other"),
        "{e}"
    );
}

#[test]
fn an_unknown_key_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text, key) in [
        (
            "a.yaml",
            "listen: 127.0.0.1:1\nlistn: 127.0.0.1:1\n",
            "`listn`",
        ),
        ("a.toml", "listn = \"127.0.0.1:1\"\n", "`listn`"),
        // Keys in snake case, and flags that may not come from a file.
        (
            "b.yaml",
            "metrics_listen: 127.0.0.1:1\n",
            "`metrics_listen`",
        ),
        ("c.yaml", "token: t\n", "`token`"),
        ("d.yaml", "insecure-no-auth: true\n", "`insecure-no-auth`"),
        ("e.yaml", "config: other.yaml\n", "`config`"),
        ("f.toml", "identity = \"me\"\n", "`identity`"),
        (
            "g.yaml",
            "no-leader-election: true\n",
            "`no-leader-election`",
        ),
        ("h.yaml", "file-lease-name: x\n", "`file-lease-name`"),
    ] {
        let p = write(dir.path(), name, text);
        let e = load_file(&p)
            .err()
            .unwrap_or_else(|| panic!("{name} accepted"));
        assert!(e.contains(key) && e.contains(name), "{name}: {e}");
        assert!(e.contains("unknown field"), "{name}: {e}");
    }
    // The lease group's keys are typed as its flags: YAML's `y` stays a name.
    let p = write(
        dir.path(),
        "l.yaml",
        "lease-name: y\nlease-namespace: 2024\n",
    );
    let f = DaemonArgs::default().over_file(load_file(&p).expect("lease keys"));
    assert_eq!(f.lease.lease_name.as_deref(), Some("y"));
    assert_eq!(f.lease.lease_namespace.as_deref(), Some("2024"));
}

#[test]
fn a_bad_value_in_the_file_names_its_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text, key, why) in [
        (
            "a.yaml",
            "control-ports: 9-3\n",
            "control-ports",
            "need 0 < FIRST <= LAST",
        ),
        (
            "b.toml",
            "tcp-ports = \"48000\"\n",
            "tcp-ports",
            "expected FIRST-LAST",
        ),
        (
            "c.yaml",
            "config-map: store\n",
            "config-map",
            "is not NAMESPACE/NAME",
        ),
        (
            "d.toml",
            "[integrations]\nbk = \"https://bk\"\n",
            "integrations",
            "is not PLUGIN=http://",
        ),
    ] {
        let p = write(dir.path(), name, text);
        let e = load_file(&p)
            .err()
            .unwrap_or_else(|| panic!("{name} accepted"));
        assert!(
            e.contains(name) && e.contains(&format!("{key}: ")) && e.contains(why),
            "{name}: {e}"
        );
    }
    // Event names are checked with the flags' parser, whatever the source.
    let p = write(dir.path(), "e.yaml", "transition-timeouts: {LAUNCH: 3}\n");
    let e = resolve(flags(&[
        "--config",
        p.to_str().expect("utf-8"),
        "--insecure-no-auth",
    ]))
    .err()
    .expect("no such event");
    assert!(
        e.contains("transition-timeout") && e.contains("LAUNCH"),
        "{e}"
    );
    // A key written empty is as if absent.
    let p = write(
        dir.path(),
        "f.yaml",
        "control-ports: ~\nleader-election: ~\n",
    );
    let f = load_file(&p).expect("nulls");
    assert_eq!(f, DaemonArgs::default());
}

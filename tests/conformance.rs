//! The anchor's real workflows, unmodified, rendered as the anchor renders them: every case of
//! `../shared/conformance/aliecs/` through `envbridge render -o tasks` and the anchor's own
//! checker (`compare.py --full`), and the errors a site's bad input gets (exit 2, `error:` with
//! FILE:LINE:COLUMN, nothing on stdout).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn shared() -> PathBuf {
    for c in ["../shared", "../../shared"] {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(c);
        if p.join("conformance/aliecs").is_dir() {
            return p;
        }
    }
    panic!("../shared/conformance/aliecs not found beside the repository");
}

fn cw() -> PathBuf {
    shared().join("corpus/aliecs/controlworkflows")
}

fn render(workflow: &str, config: &Path, sets: &[String]) -> Output {
    let cw = cw();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_envbridge"));
    cmd.arg("render")
        .arg(cw.join("workflows").join(format!("{workflow}.yaml")))
        .arg("--tasks")
        .arg(cw.join("tasks"))
        .arg("--workflows")
        .arg(cw.join("workflows"))
        .arg("--config")
        .arg(config);
    for s in sets {
        cmd.arg("--set").arg(s);
    }
    cmd.args(["--env-id", "envcheck01", "-o", "tasks"])
        .output()
        .expect("run envbridge")
}

#[test]
fn every_shared_case_matches_the_anchor() {
    let root = shared().join("conformance/aliecs");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("workflow").is_file())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no cases in {}", root.display());
    let mut failed = Vec::new();
    for case in &cases {
        let workflow = std::fs::read_to_string(case.join("workflow")).unwrap();
        let sets: Vec<String> = std::fs::read_to_string(case.join("vars"))
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect();
        let out = render(workflow.trim(), &case.join("config.yaml"), &sets);
        assert!(
            out.status.success(),
            "{}: {}",
            case.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let got = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(got.path(), &out.stdout).unwrap();
        let cmp = Command::new("python3")
            .arg(root.join("compare.py"))
            .arg(got.path())
            .arg(case.join("expected.json"))
            .arg("--full")
            .output()
            .expect("run python3 compare.py");
        let report = String::from_utf8_lossy(&cmp.stdout).to_string();
        println!(
            "{}: {}",
            case.display(),
            report.lines().last().unwrap_or("")
        );
        if !cmp.status.success() {
            failed.push(format!("{}:\n{report}", case.display()));
        }
    }
    assert!(
        failed.is_empty(),
        "different from the anchor:\n{}",
        failed.join("\n")
    );
}

/// A store with two hosts of one detector, for the error cases.
fn store(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("config.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

const STORE: &str = "o2:\n  hardware:\n    detectors:\n      TST:\n        flps:\n          flp001: {}\n          flp002: {}\n  runtime:\n    aliecs:\n      defaults:\n        o2_install_path: /opt/o2\n        infologger_mode: stdout\n        consul_endpoint: 127.0.0.1:8500\n        detector: TST\n        modulepath: \"\"\n";

fn expect_error(out: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty(), "nothing on stdout on error");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(what), "expected `{what}` in {err}");
    err
}

#[test]
fn bad_input_exits_2_naming_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = r#"hosts=["flp001","flp009"]"#.to_string();
    // A host missing from the inventory: the expression's place, and the host.
    let out = render("readout-dataflow", &store(dir.path(), STORE), &[hosts]);
    let err = expect_error(&out, "flp009");
    assert!(err.contains("readout-dataflow.yaml:"), "{err}");
    // A store path that does not exist (a component entry `config.Resolve` looks for): the
    // expression's place and the key.
    let mut with_inventory = STORE.replace("flp002: {}", "flp002: {}\n          flp009: {}");
    with_inventory.push_str("  components: {}\n");
    let out = render(
        "readout-dataflow",
        &store(dir.path(), &with_inventory),
        &[r#"hosts=["flp009"]"#.to_string()],
    );
    let err = expect_error(&out, "readout-stfb-flp009");
    assert!(
        err.contains("readout-dataflow.yaml:") && err.contains("o2/components"),
        "{err}"
    );
    // A DPL workflow that is neither a JIT entry nor a workflow template.
    let out = render(
        "readout-dataflow",
        &store(dir.path(), STORE),
        &[
            r#"hosts=["flp001"]"#.to_string(),
            "dpl_workflow=x".to_string(),
        ],
    );
    let err = expect_error(&out, "included workflow `x` not found");
    assert!(err.contains("nor is there a JIT entry `jit/x`"), "{err}");
    // A JIT entry, which only the experiment's software generates: the entry and the variable.
    let out = render(
        "readout-dataflow",
        &store(dir.path(), STORE),
        &[
            r#"hosts=["flp001"]"#.to_string(),
            "dpl_workflow=minimal-dpl".to_string(),
        ],
    );
    let err = expect_error(&out, "dpl.GenerateFromUriOrFallbackToTemplate");
    assert!(
        err.contains("the JIT entry `jit/minimal-dpl`")
            && err.contains("no JIT generator is configured")
            && err.contains("chosen by the variable `dpl_workflow`"),
        "{err}"
    );
    // A store path that does not exist.
    let out = render(
        "readout-dataflow",
        &dir.path().join("nope.yaml"),
        &[r#"hosts=["flp001"]"#.to_string()],
    );
    expect_error(&out, "nope.yaml");
    // A malformed store file: its line and column.
    let bad = store(dir.path(), "o2:\n  runtime: [\n");
    let out = render(
        "readout-dataflow",
        &bad,
        &[r#"hosts=["flp001"]"#.to_string()],
    );
    expect_error(&out, &format!("{}:", bad.display()));
    // An unknown function, through a variable.
    let out = render(
        "readout-dataflow",
        &store(dir.path(), STORE),
        &[
            r#"hosts=["flp001"]"#.to_string(),
            "detector={{ inventory.Nope(it) }}".to_string(),
        ],
    );
    expect_error(&out, "unknown function `inventory.Nope`");
}

#[test]
fn the_repository_s_other_workflows_render() {
    let dir = tempfile::tempdir().unwrap();
    let cards = r#"'{"0":{"serial":"1041","endpoint":"0"},"1":{"serial":"1041","endpoint":"1"}}'"#;
    let text = STORE.replace(
        "          flp002: {}\n",
        &format!("          flp002: {{}}\n    flps:\n      flp001:\n        cards: {cards}\n"),
    );
    let config = store(dir.path(), &text);
    let out = render(
        "o2-roc-config",
        &config,
        &[r#"hosts=["flp001"]"#.to_string()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tasks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &tasks[0];
    assert_eq!(
        t["path"],
        "o2-roc-config.host-flp001.card-1041.roc-config-uri"
    );
    assert_eq!(t["controlMode"], "basic");
    assert_eq!(t["controlPort"], 0);
    let cmd = t["command"].as_str().unwrap();
    assert!(cmd.contains("for endpoint in 0 1;"), "{cmd}");
    let out = render(
        "resources-cleanup",
        &config,
        &[r#"hosts=["flp001","flp002"]"#.to_string()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The site's class -> TaskTemplate mapping: a class's own entry, else its control mode's.
#[test]
fn the_site_mapping_names_each_task_s_template() {
    let cw = cw();
    let case = shared().join("conformance/aliecs/caches");
    let out = Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .arg("render")
        .arg(cw.join("workflows/readout-dataflow.yaml"))
        .arg("--tasks")
        .arg(cw.join("tasks"))
        .arg("--workflows")
        .arg(cw.join("workflows"))
        .arg("--config")
        .arg(case.join("config.yaml"))
        .arg("--templates")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/site/templates.yaml"))
        .args([
            "--set",
            r#"hosts=["flp001"]"#,
            "--set",
            "drop_caches_enabled=true",
        ])
        .args(["--env-id", "e1", "-o", "json"])
        .output()
        .expect("run envbridge");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objects: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for o in objects.as_array().unwrap() {
        for t in o["spec"]["tasks"].as_array().into_iter().flatten() {
            seen.insert(
                t["class"].as_str().unwrap().to_string(),
                t["template"].as_str().unwrap().to_string(),
            );
        }
    }
    assert_eq!(seen["readout"], "readout", "by class");
    assert_eq!(seen["stfsender"], "stfsender", "by class");
    assert_eq!(
        seen["shell-command"], "hook-task",
        "a basic class with a trigger: by mode hook"
    );
    assert_eq!(seen["fairmq-shmmonitor"], "hook-task");
}

/// The anchor's `!public` markers stay in the model with all their metadata.
#[test]
fn the_anchor_s_public_variables_keep_their_metadata() {
    let wf =
        envbridge::workflow::load::load_workflow(&cw().join("workflows/readout-dataflow.yaml"))
            .unwrap_or_else(|e| panic!("{e}"));
    let declared = envbridge::workflow::public::declared(&wf);
    let get = |n: &str| {
        declared
            .iter()
            .find(|d| &*d.name == n)
            .unwrap_or_else(|| panic!("{n} not declared"))
    };
    assert!(declared.iter().filter(|d| d.meta.public).count() > 50);
    let det = get("detectors");
    assert!(det.meta.public);
    assert_eq!(det.meta.fields["widget"], "detectorSelector");
    assert_eq!(det.meta.fields["panel"], "Detectors");
    let dcs = get("dcs_enabled");
    assert_eq!(dcs.default.as_deref(), Some("false"));
    assert_eq!(dcs.meta.fields["type"], "bool");
    assert_eq!(dcs.meta.fields["label"], "DCS");
}

/// `detectors` comes from the inventory of the environment's hosts when the workflow does not
/// define it (the anchor's environment creation sets it).
#[test]
fn detectors_come_from_the_hosts_inventory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("tasks")).unwrap();
    std::fs::write(
        dir.path().join("tasks/t.yaml"),
        "control:\n  mode: basic\ncommand:\n  value: \"echo {{ detectors }}\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("w.yaml"),
        "name: w\nroles:\n  - name: h-{{ it }}\n    for:\n      range: \"{{ hosts }}\"\n      var: it\n    constraints:\n      - attribute: machine_id\n        value: \"{{ it }}\"\n    roles:\n      - name: t\n        task:\n          load: t\n",
    )
    .unwrap();
    let config = store(
        dir.path(),
        "o2:\n  hardware:\n    detectors:\n      TPC:\n        flps:\n          flp001: {}\n      ITS:\n        flps:\n          flp002: {}\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .arg("render")
        .arg(dir.path().join("w.yaml"))
        .arg("--tasks")
        .arg(dir.path().join("tasks"))
        .arg("--config")
        .arg(&config)
        .args(["--set", r#"hosts=["flp001","flp002"]"#, "-o", "tasks"])
        .output()
        .expect("run envbridge");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tasks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(tasks[0]["command"], r#"echo ["ITS","TPC"]"#);
}

/// A store of TPC's FLPs: the A side's first (IDC), and the SAC one.
const TPC_STORE: &str = "o2:\n  hardware:\n    detectors:\n      TPC:\n        flps:\n          alio2-cr1-flp001: {}\n          alio2-cr1-flp145: {}\n  components:\n    readout:\n      ANY:\n        any:\n          readout-stfb-alio2-cr1-flp001: x\n          readout-stfb-alio2-cr1-flp145: x\n  runtime:\n    aliecs:\n      defaults:\n        o2_install_path: /opt/o2\n        infologger_mode: stdout\n        consul_endpoint: 127.0.0.1:8500\n        detector: TPC\n        modulepath: \"\"\n";

const TPC_HOSTS: &str = r#"hosts=["alio2-cr1-flp001","alio2-cr1-flp145"]"#;

/// A stand-in for the experiment's DPL as a site's JIT generator: it logs the command it is
/// given and writes, as DPL's `--o2-control` does, a workflow with one output proxy (reading
/// the StfBuilder's `readout-proxy`, publishing the `downstream` that the StfSender reads)
/// and that proxy's task class.
fn fake_dpl(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let log = dir.join("commands.log");
    let script = format!(
        r#"#!/bin/sh
{{ printf '%s: ' "$ENVBRIDGE_JIT_ENTRY"; cat; echo; }} >> '{log}'
n="$ENVBRIDGE_JIT_NAME"
cat > "workflows/$n.yaml" <<EOF
name: $n
roles:
  - name: dpl-output-proxy
    connect:
      - name: readout-proxy
        type: pull
        transport: shmem
        target: "::readout-proxy-{{{{ it }}}}"
    bind:
      - name: downstream
        type: push
        transport: shmem
        addressing: ipc
        global: "downstream-{{{{ it }}}}"
    task:
      load: $n-proxy
EOF
cat > "tasks/$n-proxy.yaml" <<EOF
name: $n-proxy
control:
  mode: fairmq
command:
  value: o2-dpl-output-proxy
  arguments:
    - "--jit-entry=$ENVBRIDGE_JIT_ENTRY"
EOF
"#,
        log = log.display()
    );
    let p = dir.join("fake-dpl.sh");
    std::fs::write(&p, script).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// readout-dataflow with a TPC calibration chain: `dpl.GenerateFromUriOrFallbackToTemplate`
/// finds no `jit/tpc-idc-sac-full-split` and includes `workflows/tpc-idc-sac-full-split.yaml`,
/// as the anchor does; its roles pick, per FLP, the JIT entry of that FLP's side
/// (`jit/tpc-idc-a`, `jit/tpc-sac`), which the site's generator turns into workflows.
#[test]
fn a_tpc_calibration_chain_renders_through_the_jit_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let config = store(dir.path(), TPC_STORE);
    let sets = [
        TPC_HOSTS.to_string(),
        "tpc_dpl_workflow=tpc-idc-sac-full-split".to_string(),
    ];
    // Without a generator: the JIT entry the included workflow names, and how it came in.
    let out = render("readout-dataflow", &config, &sets);
    let err = expect_error(&out, "the JIT entry `jit/tpc-idc-a`");
    for want in [
        "tpc-idc-sac-full-split.yaml:13:",
        "no JIT generator is configured",
        "role `readout-dataflow.host-alio2-cr1-flp001.data-distribution-dpl.dpl.tpc-idc-a`",
        "`tpc-idc-sac-full-split` included at",
        "by the variable `dpl_workflow`",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }

    // With one.
    let cw = cw();
    let out = Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .arg("render")
        .arg(cw.join("workflows/readout-dataflow.yaml"))
        .arg("--tasks")
        .arg(cw.join("tasks"))
        .arg("--workflows")
        .arg(cw.join("workflows"))
        .arg("--config")
        .arg(&config)
        .arg("--jit-generator")
        .arg(fake_dpl(dir.path()))
        .args(["--set", &sets[0], "--set", &sets[1]])
        .args(["--env-id", "envcheck01", "-o", "tasks"])
        .output()
        .expect("run envbridge");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tasks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tasks = tasks.as_array().unwrap();
    let task = |path: &str| {
        tasks
            .iter()
            .find(|t| t["path"] == path)
            .unwrap_or_else(|| panic!("no task {path} in {tasks:#?}"))
    };
    let host = |h: &str, rest: &str| format!("readout-dataflow.host-alio2-cr1-{h}.{rest}");
    // The included workflow's roles, each on the FLPs its `enabled` selects.
    let idc = task(&host(
        "flp001",
        "data-distribution-dpl.dpl.tpc-idc-a.dpl-output-proxy",
    ));
    let sac = task(&host(
        "flp145",
        "data-distribution-dpl.dpl.tpc-sac.dpl-output-proxy",
    ));
    assert_eq!(idc["node"], "alio2-cr1-flp001");
    assert_eq!(sac["node"], "alio2-cr1-flp145");
    assert_eq!(idc["args"][0], "--jit-entry=tpc-idc-a", "{idc:#}");
    assert_eq!(sac["args"][0], "--jit-entry=tpc-sac", "{sac:#}");
    let dpl: Vec<&str> = tasks
        .iter()
        .filter_map(|t| t["path"].as_str())
        .filter(|p| p.contains(".dpl."))
        .collect();
    assert_eq!(dpl.len(), 2, "{dpl:?}");
    // readout -> StfBuilder -> the generated proxy -> StfSender, on each FLP.
    for (h, proxy) in [("flp001", idc), ("flp145", sac)] {
        task(&host(h, "readout"));
        let stfb = task(&host(h, "data-distribution-dpl.stfb"));
        let stfs = task(&host(h, "data-distribution-dpl.stfs"));
        assert_eq!(
            proxy["channels"]["chans.readout-proxy.0.address"],
            stfb["channels"]["chans.dpl-chan.0.address"]
        );
        assert_eq!(
            stfs["channels"]["chans.downstream.0.address"],
            proxy["channels"]["chans.downstream.0.address"]
        );
    }
    // The generator got each entry templated in its role's variables: the FLP, the merger
    // port of the include role's `defaults`, the included workflow's own `defaults`.
    let log = std::fs::read_to_string(dir.path().join("commands.log")).unwrap();
    let lines: Vec<&str> = log.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 2, "{log}");
    let idc_cmd = lines.iter().find(|l| l.starts_with("tpc-idc-a: ")).unwrap();
    let sac_cmd = lines.iter().find(|l| l.starts_with("tpc-sac: ")).unwrap();
    assert!(!log.contains("{{"), "{log}");
    assert!(
        idc_cmd.contains("o2/cache/flpToCruId/alio2-cr1-flp001")
            && idc_cmd.contains("tcp://*:29950")
            && idc_cmd.contains("ccdb-default@1715236056769"),
        "{idc_cmd}"
    );
    assert!(
        sac_cmd.contains("tcp://*:29951") && sac_cmd.contains("--nthreads-decoding 1"),
        "{sac_cmd}"
    );
}

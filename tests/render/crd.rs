//! The CRDs: generated from the types, written whole even into a closed pipe.

use std::io::Read;

use super::*;

#[test]
fn crd_yaml_is_generated_from_the_types_and_survives_a_closed_pipe() {
    let want = envbridge::crd::all_yaml();
    let got = std::fs::read_to_string(repo("crds/envbridge.yaml")).unwrap();
    assert_eq!(
        got, want,
        "crds/envbridge.yaml is stale: run `envbridge crd > crds/envbridge.yaml`"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_envbridge"))
        .arg("crd")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 4];
    out.read_exact(&mut first).unwrap();
    drop(out);
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!err.contains("panicked"), "{err}");
    assert!(status.code().is_some(), "ended by a signal");
}

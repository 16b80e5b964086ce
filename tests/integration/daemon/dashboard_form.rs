//! The create form in a real browser, built from a workflow that uses the anchor's widgets:
//! panels and their order, radio buttons, a detector selector, a drop-down shown only when
//! its `visibleif` holds, a combo box; what it sends passes the daemon's checks of the
//! declaration, and a value the declaration does not allow is refused in the daemon's words.

use serde_json::json;

use super::dashboard::{ADMIN, tokens};
use super::fixture::{self, Daemon, fixed_ns};
use super::web::{Browser, require_chromium};
use crate::support::TestNamespace;

const STEP: std::time::Duration = std::time::Duration::from_secs(60);

const WIDGETS: &str = r#"name: widgets
defaults:
  run_mode: !public
    value: "physics"
    label: Run mode
    widget: radioButtonBox
    values: ["physics", "cosmics"]
    panel: mainPanel
    index: 1
  detectors: !public
    value: '["TPC"]'
    label: Detectors
    widget: detectorSelector
    values: ["TPC", "ITS", "TOF"]
    panel: mainPanel
    index: 2
  qc_enabled: !public
    value: "false"
    label: Quality control
    type: bool
    widget: checkBox
    panel: qcPanel
    index: 1
  qc_config: !public
    value: "basic"
    label: QC configuration
    widget: dropDownBox
    values: ["basic", "full"]
    visibleif: $$qc_enabled === "true"
    panel: qcPanel
    index: 2
  readout_cfg: !public
    value: "file"
    label: Readout configuration
    widget: comboBox
    values: ["file", "consul"]
    panel: advancedPanel
    index: 1
roles: []
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_form_honours_the_public_variables_widgets_and_visibleif() {
    require_chromium();
    let ns = TestNamespace::new("dash-form").await;
    let flows = tempfile::tempdir().expect("workflows dir");
    std::fs::write(flows.path().join("widgets.yaml"), WIDGETS).expect("workflow");
    let mut cfg = fixed_ns(&ns.name);
    cfg.workflows_dir = flows.path().to_path_buf();
    // The test renderer renders only readout-dataflow: a create of `widgets` that passes the
    // daemon's checks of the caller's variables ends in its render error.
    let d = Daemon::start_with_tokens(
        ns.client.clone(),
        cfg,
        fixture::test_renderer("unused"),
        Some(tokens()),
    )
    .await;
    let b = Browser::start().await;
    let base = format!("http://{}", d.http);
    b.goto(&format!("{base}/ui/login")).await;
    b.type_in("#token", ADMIN).await;
    b.click("#login-submit").await;
    b.find("body[data-page=list]", STEP).await;
    b.goto(&format!("{base}/ui/new")).await;
    b.find("[data-var=readout_cfg]", STEP).await;

    let form = b
        .js(
            "const q = (s) => [...document.querySelectorAll(s)];
             return {
               panels: q('fieldset legend').map(l => l.textContent),
               order: q('[data-var]').map(f => f.dataset.var),
               radios: q('#var-run_mode input[type=radio]').map(r => r.value + (r.checked ? '*' : '')),
               detectors: q('#var-detectors input[type=checkbox]').map(r => r.value + (r.checked ? '*' : '')),
               qcHidden: document.querySelector('[data-var=qc_config]').hidden,
               qcOptions: q('#var-qc_config option').map(o => o.value),
               combo: q('#list-readout_cfg option').map(o => o.value),
               labels: q('[data-var=run_mode] > label').map(l => l.textContent),
             };",
            json!([]),
        )
        .await;
    assert_eq!(form["panels"], json!(["Main", "Qc", "Advanced"]), "{form}");
    assert_eq!(
        form["order"],
        json!([
            "run_mode",
            "detectors",
            "qc_enabled",
            "qc_config",
            "readout_cfg"
        ]),
        "{form}"
    );
    assert_eq!(form["radios"], json!(["physics*", "cosmics"]), "{form}");
    assert_eq!(form["detectors"], json!(["TPC*", "ITS", "TOF"]), "{form}");
    assert_eq!(form["qcHidden"], true, "visibleif is false: {form}");
    assert_eq!(form["qcOptions"], json!(["basic", "full"]), "{form}");
    assert_eq!(form["combo"], json!(["file", "consul"]), "{form}");
    assert_eq!(form["labels"], json!(["Run mode"]), "{form}");

    // Turning QC on shows its configuration.
    b.click("[name=var-qc_enabled]").await;
    let hidden = b
        .js(
            "return document.querySelector('[data-var=qc_config]').hidden",
            json!([]),
        )
        .await;
    assert_eq!(hidden, false, "visibleif now holds");
    b.click("#var-detectors input[value=ITS]").await;
    b.click("#var-run_mode input[value=cosmics]").await;
    b.type_in("#hosts", "flp001").await;
    b.screenshot("14-form-widgets").await;

    // A value outside the combo box's list: refused by the daemon, in its words.
    b.type_in("[name=var-readout_cfg]", "bogus").await;
    b.click("#create-submit").await;
    b.find("#action-error", STEP).await;
    let refused = b.text("#action-error").await;
    assert!(
        refused.contains("variable readout_cfg: \"bogus\" is not one of file, consul"),
        "{refused}"
    );
    // Values the declaration allows pass the daemon's checks (the test renderer then refuses
    // this workflow, so nothing is written).
    b.type_in("[name=var-readout_cfg]", "consul").await;
    b.js(
        "document.querySelector('#notice').hidden = true; return 1",
        json!([]),
    )
    .await;
    b.click("#create-submit").await;
    b.find("#notice:not([hidden]) #action-error", STEP).await;
    let refused = b.text("#action-error").await;
    assert!(
        refused.contains("unknown workflow \"widgets\""),
        "{refused}"
    );
    drop(b);
    drop(d);
}

//! CreateEnvironment's renderer: workflow + variables -> Objects, through the render core.

use super::{BridgeConfig, BridgeError, CreateSpec, Objects, Renderer, TakenPorts};

/// The renderer the daemon uses, reading task classes and workflows from the configured dirs.
pub fn renderer(cfg: &BridgeConfig) -> Renderer {
    let cfg = cfg.clone();
    std::sync::Arc::new(move |spec: &CreateSpec, id: &str, taken: &TakenPorts| {
        render(&cfg, spec, id, taken)
    })
}

fn render(
    _cfg: &BridgeConfig,
    spec: &CreateSpec,
    _id: &str,
    _taken: &TakenPorts,
) -> Result<Objects, BridgeError> {
    // The render core (plan::render) is not merged on this branch yet.
    Err(BridgeError::Render(format!(
        "cannot render workflow {:?}: the render core is not part of this build",
        spec.workflow
    )))
}

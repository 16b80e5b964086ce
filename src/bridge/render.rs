//! CreateEnvironment's renderer: workflow + variables -> Objects, through the render core,
//! with the ports other live environments hold passed in so that allocations stay disjoint.

use std::path::PathBuf;
use std::sync::Arc;

use super::config_store::StoreFile;
use crate::plan::templates::TemplateMap;
use crate::workflow::store::ConfigStore;

use super::{BridgeConfig, BridgeError, CreateSpec, Objects, Renderer, TakenPorts};
use crate::plan::{RenderRequest, render as render_core};
use crate::workflow::Sources;

/// The renderer the daemon uses, reading task classes and workflows from the configured dirs.
pub fn renderer(cfg: &BridgeConfig) -> Renderer {
    let cfg = cfg.clone();
    let store = cfg.config_store.clone().map(StoreFile::new);
    // Read once here: a broken mapping is reported at the first create that needs it.
    let templates = cfg
        .templates
        .clone()
        .map(|p| TemplateMap::load(&p).map(Arc::new));
    std::sync::Arc::new(move |spec: &CreateSpec, id: &str, taken: &TakenPorts| {
        let templates = match &templates {
            Some(Ok(m)) => m.clone(),
            Some(Err(e)) => return Err(BridgeError::Render(format!("template mapping: {e}"))),
            None => Arc::default(),
        };
        let store = match &store {
            Some(f) => f.current().map_err(BridgeError::Render)?,
            None => Arc::new(ConfigStore::empty()),
        };
        render_with(&cfg, store, templates, spec, id, taken)
    })
}

/// A workflow is named, not given as a path: clients cannot make the daemon read other files.
fn workflow_file(cfg: &BridgeConfig, name: &str) -> Result<PathBuf, BridgeError> {
    let stem = name.strip_suffix(".yaml").unwrap_or(name);
    let ok = !stem.is_empty()
        && !stem.starts_with('.')
        && stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(BridgeError::Invalid(vec![format!(
            "workflow {name:?}: give the name of a file in the workflows directory (letters, digits, '-', '_', '.')"
        )]));
    }
    Ok(cfg.workflows_dir.join(format!("{stem}.yaml")))
}

pub fn render(
    cfg: &BridgeConfig,
    spec: &CreateSpec,
    id: &str,
    taken: &TakenPorts,
) -> Result<Objects, BridgeError> {
    render_with(
        cfg,
        Arc::new(ConfigStore::empty()),
        Arc::default(),
        spec,
        id,
        taken,
    )
}

/// [`render`] with the site's configuration store.
pub fn render_with(
    cfg: &BridgeConfig,
    store: Arc<ConfigStore>,
    templates: Arc<TemplateMap>,
    spec: &CreateSpec,
    id: &str,
    taken: &TakenPorts,
) -> Result<Objects, BridgeError> {
    let req = RenderRequest {
        store,
        templates,
        sources: Sources {
            tasks_dir: cfg.tasks_dir.clone(),
            workflows_dir: Some(cfg.workflows_dir.clone()),
            defaults_files: cfg.defaults_files.clone(),
        },
        workflow: workflow_file(cfg, &spec.workflow)?,
        sets: spec
            .variables
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        env_id: Some(id.to_string()),
        reserved_ports: taken.clone(),
        control_ports: cfg.control_ports.clone(),
        tcp_ports: cfg.tcp_ports.clone(),
        ..RenderRequest::default()
    };
    let r = render_core(&req).map_err(|e| BridgeError::Render(e.to_string()))?;
    Ok(Objects {
        environment: r.environment,
        task_sets: r.task_sets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_names_cannot_escape_the_directory() {
        let cfg = BridgeConfig::default();
        assert!(workflow_file(&cfg, "readout-dataflow").is_ok());
        assert!(workflow_file(&cfg, "../../etc/passwd").is_err());
        assert!(workflow_file(&cfg, "/abs").is_err());
        assert!(workflow_file(&cfg, ".hidden").is_err());
    }

    #[test]
    fn renders_our_readout_dataflow_around_taken_ports() {
        let cfg = BridgeConfig {
            tasks_dir: "manifests/control-workflows/tasks".into(),
            workflows_dir: "manifests/control-workflows/workflows".into(),
            defaults_files: vec!["manifests/site/local.yaml".into()],
            ..BridgeConfig::default()
        };
        let spec = CreateSpec {
            workflow: "readout-dataflow".into(),
            variables: [("hosts".to_string(), r#"["flp001","flp002"]"#.to_string())].into(),
            ..CreateSpec::default()
        };
        let free = render(&cfg, &spec, "e1", &TakenPorts::new()).expect("render");
        let first = free.ports_by_node();
        let taken: TakenPorts = first.clone();
        let second = render(&cfg, &spec, "e2", &taken)
            .expect("render")
            .ports_by_node();
        for (node, ports) in &second {
            assert!(
                ports.is_disjoint(&first[node]),
                "{node}: {ports:?} vs {:?}",
                first[node]
            );
        }
        assert_eq!(free.environment.metadata.name.as_deref(), Some("e1"));
    }
}

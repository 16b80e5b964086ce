//! CreateEnvironment's renderer: workflow + variables -> Objects, through the render core,
//! with the ports other live environments hold passed in so that allocations stay disjoint.

use std::path::PathBuf;
use std::sync::Arc;

use super::config_map_store::SharedStore;
use super::config_store::StoreFile;
use crate::plan::templates::TemplateMap;
use crate::workflow::store::ConfigStore;

use super::{BridgeConfig, BridgeError, CreateSpec, Objects, Renderer, TakenPorts};
use crate::plan::RenderRequest;
use crate::workflow::Sources;

/// Where the daemon's renders take the configuration store from.
#[derive(Clone, Debug)]
pub enum StoreSource {
    None,
    File(Arc<StoreFile>),
    ConfigMap(Arc<SharedStore>),
}

impl StoreSource {
    /// The file named in the settings, if any (a ConfigMap needs a watch: see
    /// [`crate::bridge::config_map_store::watch`]).
    pub fn of(cfg: &BridgeConfig) -> Self {
        match &cfg.config_store {
            Some(p) => StoreSource::File(Arc::new(StoreFile::new(p.clone()))),
            None => StoreSource::None,
        }
    }

    /// The store as it is now (a file re-read when it changed; the ConfigMap's last version).
    pub fn current(&self) -> Result<Arc<ConfigStore>, String> {
        match self {
            StoreSource::None => Ok(Arc::new(ConfigStore::empty())),
            StoreSource::File(f) => f.current(),
            StoreSource::ConfigMap(s) => s.current(),
        }
    }
}

/// The renderer the daemon uses, reading task classes and workflows from the configured dirs.
pub fn renderer(cfg: &BridgeConfig) -> Renderer {
    renderer_with(cfg, StoreSource::of(cfg))
}

/// [`renderer`] with the configuration store from `store`.
pub fn renderer_with(cfg: &BridgeConfig, store: StoreSource) -> Renderer {
    let cfg = cfg.clone();
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
        let store = store.current().map_err(BridgeError::Render)?;
        render_with(&cfg, store, templates, spec, id, taken)
    })
}

/// A workflow is named, not given as a path: clients cannot make the daemon read other files.
pub(crate) fn workflow_file(cfg: &BridgeConfig, name: &str) -> Result<PathBuf, BridgeError> {
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
        jit: cfg.jit.clone(),
        ..RenderRequest::default()
    };
    let mut objs = crate::objects::render(&req).map_err(|e| BridgeError::Render(e.to_string()))?;
    route_calls(cfg, &req.store, &mut objs.environment.spec.hooks)?;
    Ok(objs)
}

/// Where each call goes: the plugin's endpoint from the daemon's `integrations`, else the
/// store's `o2/runtime/envbridge/integrations/<plugin>`. A triggered critical call that no
/// endpoint serves refuses the create, naming it; a non-critical one is a warning.
pub fn route_calls(
    cfg: &BridgeConfig,
    store: &ConfigStore,
    calls: &mut [crate::crd::HookRef],
) -> Result<(), BridgeError> {
    let mut unserved = Vec::new();
    for c in calls.iter_mut() {
        c.endpoint = cfg.integrations.get(&c.plugin).cloned().or_else(|| {
            store
                .get(&format!("o2/runtime/envbridge/integrations/{}", c.plugin))
                .and_then(|n| n.as_str())
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        });
        if let Some(e) = &c.endpoint
            && !e.starts_with("http://")
        {
            unserved.push(format!(
                "call {}: endpoint `{e}` of plugin `{}` is not an http:// URL",
                c.path, c.plugin
            ));
        }
        if c.endpoint.is_none() && c.trigger.is_some() {
            let what = format!(
                "call {} ({}): no endpoint serves plugin `{}` (daemon setting `integrations`, or the store's o2/runtime/envbridge/integrations/{})",
                c.path, c.func, c.plugin, c.plugin
            );
            if c.critical {
                unserved.push(what);
            } else {
                tracing::warn!("{what}: a non-critical call, it will be skipped with a warning");
            }
        }
    }
    if unserved.is_empty() {
        Ok(())
    } else {
        Err(BridgeError::Invalid(unserved))
    }
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
        let first = free.ports.clone();
        let taken: TakenPorts = first.clone();
        let second = render(&cfg, &spec, "e2", &taken).expect("render").ports;
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

//! The workflow templates a daemon offers: the workflows directory's files, each with whether
//! its `name` is `!public`, its public description and its declared variables. The shift's
//! page builds its create form from them; o2control's GetWorkflowTemplates lists them.

use std::path::Path;

use super::BridgeConfig;
use crate::workflow::public::Declared;

/// At most this many templates are listed (a directory is the site's, not a caller's).
pub const MAX_TEMPLATES: usize = 200;

/// One workflow template of the workflows directory.
#[derive(Clone, Debug, PartialEq)]
pub struct TemplateInfo {
    /// The file name without `.yaml`: what a create names.
    pub name: String,
    pub public: bool,
    pub description: Option<String>,
    /// Its declared variables (`!public` or with metadata), by name.
    pub vars: Vec<Declared>,
    /// Why the file could not be read as a workflow (it is still listed: a create of it
    /// reports the same error in full).
    pub error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("workflows directory {dir}: {source}")]
pub struct TemplatesError {
    dir: String,
    source: std::io::Error,
}

/// The templates of `cfg.workflows_dir`, sorted by name (blocking: file reads).
pub fn list(cfg: &BridgeConfig) -> Result<Vec<TemplateInfo>, TemplatesError> {
    let mut names = names(&cfg.workflows_dir).map_err(|source| TemplatesError {
        dir: cfg.workflows_dir.display().to_string(),
        source,
    })?;
    names.sort();
    names.truncate(MAX_TEMPLATES);
    Ok(names.into_iter().map(|n| info(cfg, n)).collect())
}

fn names(dir: &Path) -> std::io::Result<Vec<String>> {
    Ok(std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".yaml"))
                .map(str::to_string)
        })
        .filter(|n| !n.starts_with('.'))
        .collect())
}

fn info(cfg: &BridgeConfig, name: String) -> TemplateInfo {
    let loaded = super::render::workflow_file(cfg, &name)
        .map_err(|e| e.to_string())
        .and_then(|p| crate::workflow::load::load_workflow(&p).map_err(|e| e.to_string()));
    match loaded {
        Ok(wf) => TemplateInfo {
            name,
            public: wf.public,
            description: wf.description.clone(),
            vars: crate::workflow::public::declared(&wf),
            error: None,
        },
        Err(e) => TemplateInfo {
            name,
            public: false,
            description: None,
            vars: Vec::new(),
            error: Some(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path) -> BridgeConfig {
        BridgeConfig {
            workflows_dir: dir.to_path_buf(),
            ..BridgeConfig::default()
        }
    }

    #[test]
    fn templates_say_whether_they_are_public_with_their_variables_and_errors() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("pub.yaml"),
            "name: !public pub\ndescription: !public \"Main\"\ndefaults:\n  \
             run_type: !public\n    value: PHYSICS\n    widget: comboBox\n  hidden: x\nroles: []\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("plain.yaml"),
            "name: plain\ndescription: not public\nroles: []\n",
        )
        .unwrap();
        std::fs::write(d.path().join("broken.yaml"), "name: [\n").unwrap();
        std::fs::write(d.path().join(".hidden.yaml"), "name: h\n").unwrap();
        std::fs::write(d.path().join("notes.txt"), "").unwrap();
        let l = list(&cfg(d.path())).unwrap();
        let names: Vec<&str> = l.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["broken", "plain", "pub"]);
        assert!(l[0].error.as_deref().unwrap().contains("broken.yaml"));
        assert!(!l[1].public);
        assert_eq!(l[1].description, None);
        assert!(l[2].public);
        assert_eq!(l[2].description.as_deref(), Some("Main"));
        assert_eq!(l[2].vars.len(), 1);
        assert_eq!(&*l[2].vars[0].name, "run_type");
        assert_eq!(l[2].vars[0].default.as_deref(), Some("PHYSICS"));
        let missing = list(&cfg(&d.path().join("nope"))).unwrap_err().to_string();
        assert!(missing.contains("nope"), "{missing}");
    }
}

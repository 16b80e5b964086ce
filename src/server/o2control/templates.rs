//! GetWorkflowTemplates and ListRepos: the workflows directory as the anchor's one
//! repository. envbridge has no git repositories; its directory is offered as repository
//! [`REPO`] at revision [`REVISION`] (docs/o2control.md).

use std::collections::HashMap;

use super::pb::o2control as pb;
use crate::bridge::templates::TemplateInfo;
use crate::workflow::public::Declared;

/// The repository name the workflows directory is offered as.
pub const REPO: &str = "envbridge";
/// Its one revision.
pub const REVISION: &str = "main";

/// The templates a request asks for: public ones unless `allWorkflows`, when the repository
/// and revision patterns (the anchor's globs, empty for any) match ours.
pub fn reply(
    req: &pb::GetWorkflowTemplatesRequest,
    all: Vec<TemplateInfo>,
) -> Vec<pb::WorkflowTemplateInfo> {
    if !glob(&req.repo_pattern, REPO) || !glob(&req.revision_pattern, REVISION) {
        return Vec::new();
    }
    all.into_iter()
        .filter(|t| t.error.is_none() && (req.all_workflows || t.public))
        .map(|t| pb::WorkflowTemplateInfo {
            repo: REPO.into(),
            template: t.name,
            revision: REVISION.into(),
            var_spec_map: t
                .vars
                .iter()
                .filter(|d| d.meta.public)
                .map(|d| (d.name.to_string(), var_spec(d)))
                .collect::<HashMap<_, _>>(),
            description: t.description.unwrap_or_default(),
        })
        .collect()
}

/// ListRepos: the one repository, the default.
pub fn repos(req: &pb::ListReposRequest) -> pb::ListReposReply {
    pb::ListReposReply {
        repos: vec![pb::RepoInfo {
            name: REPO.into(),
            default: true,
            default_revision: REVISION.into(),
            revisions: if req.get_revisions {
                vec![REVISION.into()]
            } else {
                Vec::new()
            },
        }],
        global_default_revision: REVISION.into(),
        timestamp: 0,
    }
}

/// A public variable's metadata under the anchor's keys (value, type, label, description,
/// widget, panel, values, index, rows, visibleif, enabledif); an unknown widget is an edit
/// box and an unknown type a string, as in the anchor.
fn var_spec(d: &Declared) -> pb::VarSpecMessage {
    use pb::var_spec_message::{Type, UiWidget};
    let f = &d.meta.fields;
    let text = |k: &str| match f.get(k) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let widget = match text("widget").as_str() {
        "slider" => UiWidget::Slider,
        "listBox" => UiWidget::ListBox,
        "dropDownBox" => UiWidget::DropDownBox,
        "comboBox" => UiWidget::ComboBox,
        "radioButtonBox" => UiWidget::RadioButtonBox,
        "checkBox" => UiWidget::CheckBox,
        _ => UiWidget::EditBox,
    };
    let r#type = match text("type").as_str() {
        "number" => Type::Number,
        "bool" => Type::Bool,
        "list" => Type::List,
        "map" => Type::Map,
        _ => Type::String,
    };
    pb::VarSpecMessage {
        default_value: d.default.clone().unwrap_or_else(|| text("value")),
        r#type: r#type as i32,
        label: text("label"),
        description: text("description"),
        widget: widget as i32,
        panel: text("panel"),
        allowed_values: values(f.get("values")),
        index: text("index").trim().parse().unwrap_or(0),
        visible_if: text("visibleif"),
        enabled_if: text("enabledif"),
        rows: text("rows").trim().parse().unwrap_or(0),
    }
}

/// `values`: a list, kept as JSON (a YAML list of scalars), or its JSON text.
fn values(v: Option<&serde_json::Value>) -> Vec<String> {
    let parsed;
    let v = match v {
        Some(serde_json::Value::String(s)) => match serde_json::from_str(s) {
            Ok(p) => {
                parsed = p;
                &parsed
            }
            Err(_) => return vec![s.clone()],
        },
        Some(v) => v,
        None => return Vec::new(),
    };
    match v {
        serde_json::Value::Array(a) => a
            .iter()
            .map(|x| match x {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
        other => vec![other.to_string()],
    }
}

/// The anchor's repository and revision patterns are globs; empty matches anything.
fn glob(pattern: &str, s: &str) -> bool {
    pattern.is_empty() || super::glob::Glob::new(pattern, None).matches(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::model::VarMeta;

    fn template(name: &str, public: bool) -> TemplateInfo {
        let fields = [
            ("label", "Run Type"),
            ("widget", "comboBox"),
            ("type", "string"),
            ("panel", "General"),
            ("values", r#"["PHYSICS","TECHNICAL"]"#),
            ("index", "3"),
            ("visibleif", "$$x === \"true\""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.into())))
        .collect();
        let var = |name: &str, public: bool, fields| Declared {
            name: name.into(),
            default: Some("PHYSICS".into()),
            meta: VarMeta { public, fields },
        };
        TemplateInfo {
            name: name.into(),
            public,
            description: Some("Main".into()),
            vars: vec![
                var("run_type", true, fields),
                var("hidden", false, Default::default()),
            ],
            error: None,
        }
    }

    #[test]
    fn public_templates_with_their_variables_as_the_anchor_sends_them() {
        let all = || vec![template("a", true), template("b", false)];
        let req = pb::GetWorkflowTemplatesRequest::default();
        let r = reply(&req, all());
        assert_eq!(r.len(), 1);
        let t = &r[0];
        assert_eq!(
            (t.repo.as_str(), t.template.as_str(), t.revision.as_str()),
            (REPO, "a", REVISION)
        );
        assert_eq!(t.description, "Main");
        assert_eq!(t.var_spec_map.len(), 1, "only public variables");
        let v = &t.var_spec_map["run_type"];
        assert_eq!(v.default_value, "PHYSICS");
        assert_eq!(v.widget, pb::var_spec_message::UiWidget::ComboBox as i32);
        assert_eq!(v.allowed_values, ["PHYSICS", "TECHNICAL"]);
        assert_eq!(
            (v.index, v.label.as_str(), v.panel.as_str()),
            (3, "Run Type", "General")
        );
        assert_eq!(v.visible_if, "$$x === \"true\"");
        let every = pb::GetWorkflowTemplatesRequest {
            all_workflows: true,
            ..Default::default()
        };
        assert_eq!(reply(&every, all()).len(), 2);
        let other_repo = pb::GetWorkflowTemplatesRequest {
            repo_pattern: "github.com/*".into(),
            ..Default::default()
        };
        assert!(reply(&other_repo, all()).is_empty());
        let ours = pb::GetWorkflowTemplatesRequest {
            repo_pattern: "env*".into(),
            revision_pattern: "ma?n".into(),
            ..Default::default()
        };
        assert_eq!(reply(&ours, all()).len(), 1);
    }

    #[test]
    fn unknown_widgets_and_types_are_edit_boxes_and_strings() {
        let mut t = template("a", true);
        let f = &mut t.vars[0].meta.fields;
        f.insert("widget".into(), "detectorSelector".into());
        f.insert("type".into(), "weird".into());
        let r = reply(&Default::default(), vec![t]);
        let v = &r[0].var_spec_map["run_type"];
        assert_eq!(v.widget, pb::var_spec_message::UiWidget::EditBox as i32);
        assert_eq!(v.r#type, pb::var_spec_message::Type::String as i32);
    }

    #[test]
    fn an_empty_pattern_matches_any_name() {
        assert!(glob("", REPO) && glob("env*", REPO) && !glob("x*", REPO));
    }

    #[test]
    fn one_repository_listed_as_the_default() {
        let r = repos(&pb::ListReposRequest {
            get_revisions: true,
        });
        assert_eq!(r.repos.len(), 1);
        assert!(r.repos[0].default);
        assert_eq!(r.repos[0].revisions, [REVISION]);
        assert_eq!(r.global_default_revision, REVISION);
    }
}

//! Checks made before anything is written: every problem is collected into one error.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::Api;

use super::error::{BridgeError, Result, is_not_found};
use crate::crd::{TaskTemplate, TaskTemplateSpec};
use crate::objects::Objects;

/// DNS-1123 label: what Task, Pod, Service and namespace names must be.
pub fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Problems that need no cluster: names and ports. `taken` are ports other live
/// environments hold per node.
pub fn static_problems(
    objs: &Objects,
    namespace: &str,
    taken: &BTreeMap<String, BTreeSet<u16>>,
) -> Vec<String> {
    let mut p = Vec::new();
    let env = objs.name();
    if !dns_label(&env) {
        p.push(format!("environment name {env:?} is not a DNS-1123 label (lowercase alphanumerics and '-', at most 63)"));
    }
    if !dns_label(namespace) {
        p.push(format!(
            "namespace {namespace:?} is not a DNS-1123 label (at most 63 characters)"
        ));
    }
    if objs.tasks().next().is_none() && objs.environment.spec.hooks.is_empty() {
        p.push(format!(
            "workflow {}: it renders no task (are `hosts` empty?): nothing to run",
            objs.environment.spec.workflow
        ));
    }
    let mut seen = BTreeSet::new();
    for t in objs.tasks() {
        if !dns_label(&t.name) {
            p.push(format!(
                "task {} ({}): name is not a DNS-1123 label of at most 63 characters",
                t.name, t.path
            ));
        }
        if !seen.insert(t.name.as_str()) {
            p.push(format!("task {} ({}): name used twice", t.name, t.path));
        }
    }
    for (node, ports) in &objs.ports {
        if let Some(used) = taken.get(node) {
            let clash: Vec<_> = ports.intersection(used).map(u16::to_string).collect();
            if !clash.is_empty() {
                p.push(format!(
                    "node {node}: port(s) {} already used by another live environment",
                    clash.join(", ")
                ));
            }
        }
    }
    p
}

/// Problems against the TaskTemplates: missing templates, missing required env, IPC without
/// the host's network and IPC namespaces.
pub fn template_problems(
    objs: &Objects,
    templates: &BTreeMap<String, Option<TaskTemplateSpec>>,
) -> Vec<String> {
    let mut p = Vec::new();
    let mut missing_reported = BTreeSet::new();
    for t in objs.tasks() {
        let Some(Some(tt)) = templates.get(&t.template) else {
            if missing_reported.insert(t.template.clone()) {
                p.push(format!(
                    "TaskTemplate {:?} does not exist (used by {} and others)",
                    t.template, t.path
                ));
            }
            continue;
        };
        let have: BTreeSet<&str> = t.env.iter().map(|e| &*e.name).collect();
        let missing: Vec<&str> = tt
            .required_env
            .iter()
            .map(String::as_str)
            .filter(|n| !have.contains(n))
            .collect();
        if !missing.is_empty() {
            p.push(format!(
                "task {} ({}): TaskTemplate {} requires env {}",
                t.name,
                t.path,
                t.template,
                missing.join(", ")
            ));
        }
        if t.needs_host_namespaces()
            && !(tt.pod.host_network == Some(true) && tt.pod.host_ipc == Some(true))
        {
            p.push(format!(
                "task {} ({}): IPC/shmem channels need hostNetwork and hostIPC, TaskTemplate {} lacks them",
                t.name, t.path, t.template
            ));
        }
    }
    p
}

/// Fetches every TaskTemplate the objects use (None: it does not exist).
pub async fn fetch_templates(
    client: &kube::Client,
    objs: &Objects,
) -> Result<BTreeMap<String, Option<TaskTemplateSpec>>> {
    let api: Api<TaskTemplate> = Api::all(client.clone());
    let names: BTreeSet<&str> = objs.tasks().map(|t| t.template.as_str()).collect();
    let mut out = BTreeMap::new();
    for name in names {
        let got = match api.get_opt(name).await {
            Ok(t) => t.map(|t| t.spec),
            Err(e) if is_not_found(&e) => None,
            Err(e) => return Err(BridgeError::kube(format!("get TaskTemplate {name}"))(e)),
        };
        out.insert(name.to_string(), got);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;
    use crate::objects::pack;
    use crate::plan::{ControlMode, EnvVar, TaskRef};

    fn task(name: &str, template: &str, env: &[&str]) -> TaskRef {
        TaskRef {
            name: name.into(),
            path: format!("wf.{name}"),
            node: "flp001".into(),
            template: template.into(),
            control_port: 47100 + name.len() as u16,
            env: env
                .iter()
                .map(|n| EnvVar {
                    name: (*n).into(),
                    value: "1".into(),
                })
                .collect(),
            ..TaskRef::default()
        }
    }

    #[test]
    fn names_and_ports() {
        assert!(dns_label("env-a1"));
        assert!(!dns_label("Env"));
        assert!(!dns_label("-a"));
        assert!(!dns_label(&"a".repeat(64)));
        let objs = pack(
            "e1",
            "e1",
            "wf",
            vec![task("ok", "t", &[]), task("Bad_Name", "t", &[])],
        );
        let taken = BTreeMap::from([("flp001".to_string(), BTreeSet::from([47102u16]))]);
        let p = static_problems(&objs, "ns", &taken);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("Bad_Name"));
        assert!(p[1].contains("47102"));
        let empty = pack("e1", "e1", "wf", vec![]);
        let p = static_problems(&empty, "ns", &BTreeMap::new());
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("renders no task"), "{p:?}");
    }

    #[test]
    fn templates_and_required_env_all_listed() {
        let spec = TaskTemplateSpec {
            control_mode: ControlMode::Direct,
            required_env: vec!["O2_ROLE".into(), "OCC_CONTROL_PORT".into()],
            log_file: None,
            pod: PodSpec::default(),
        };
        let templates = BTreeMap::from([
            ("readout".to_string(), Some(spec)),
            ("gone".to_string(), None),
        ]);
        let mut ipc = task("c", "readout", &["O2_ROLE", "OCC_CONTROL_PORT"]);
        ipc.channels
            .insert("chans.x.0.address".into(), "ipc://@abc".into());
        let objs = pack(
            "e",
            "e",
            "wf",
            vec![
                task("a", "readout", &["O2_ROLE"]),
                task("b", "gone", &[]),
                task("bb", "gone", &[]),
                ipc,
            ],
        );
        let p = template_problems(&objs, &templates);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p.iter()
                .any(|m| m.contains("task a") && m.contains("OCC_CONTROL_PORT"))
        );
        assert!(p.iter().any(|m| m.contains("\"gone\" does not exist")));
        assert!(
            p.iter()
                .any(|m| m.contains("task c") && m.contains("hostIPC"))
        );
    }
}

//! The Pod of a task: its TaskTemplate's pod shape plus the task reference. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::args::rewrite_loopback;
use super::control_api::fairmq_launch_args;
use crate::crd::{Task, TaskTemplateSpec};
use crate::plan::{ControlMode, TaskRef};

/// Operator settings that shape every pod.
#[derive(Clone, Debug)]
pub struct PodSettings {
    /// `HOME` = this + `/` + user.
    pub home_base: String,
    /// `USER` when the task reference names none.
    pub default_user: String,
    /// FairMQ plugin directory (`-S <dir>/lib/`).
    pub fairmq_plugin_dir: String,
}

/// Why a task cannot get a pod. Each names the task's template and what is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    #[error("TaskTemplate {template:?} has no container")]
    NoContainer { template: String },
    #[error(
        "TaskTemplate {template:?} requires env {missing:?}, which the task reference does not supply"
    )]
    MissingEnv {
        template: String,
        missing: Vec<String>,
    },
    #[error(
        "channel {key}={value} needs the node's network and IPC namespaces, but TaskTemplate {template:?} \
         lacks {missing}: set hostNetwork: true and hostIPC: true in its pod"
    )]
    IpcNeedsHost {
        template: String,
        key: String,
        value: String,
        missing: String,
    },
    #[error(
        "TaskTemplate {template:?} sets logFile but neither it nor the task names a command to wrap"
    )]
    LogFileWithoutCommand { template: String },
}

/// Builds the Pod for `task` on `node`. `labels` are computed once by the caller and shared
/// with the Service.
pub fn build_pod(
    task: &Task,
    template_name: &str,
    template: &TaskTemplateSpec,
    node: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    settings: &PodSettings,
) -> Result<Pod, PodError> {
    let tref = &task.spec.task;
    let tmpl_err = || template_name.to_string();
    check_ipc(tref, template_name, &template.pod)?;

    let mut spec: PodSpec = template.pod.clone();
    spec.node_name = Some(node.to_string());
    spec.restart_policy = Some("Never".into());
    let container = spec
        .containers
        .first_mut()
        .ok_or_else(|| PodError::NoContainer {
            template: tmpl_err(),
        })?;

    let env = merged_env(container.env.take().unwrap_or_default(), tref, settings);
    let missing: Vec<String> = template
        .required_env
        .iter()
        .filter(|n| !env.iter().any(|e| &e.name == *n))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(PodError::MissingEnv {
            template: tmpl_err(),
            missing,
        });
    }
    container.env = Some(env);

    let (command, args) = command_line(
        tref,
        container.command.take(),
        container.args.take(),
        settings,
    );
    let (command, args) = match &template.log_file {
        Some(file) => with_log_file(file, tref.shell, command, args).ok_or_else(|| {
            PodError::LogFileWithoutCommand {
                template: tmpl_err(),
            }
        })?,
        None => (command, args),
    };
    container.command = command;
    container.args = if args.is_empty() { None } else { Some(args) };
    // A process that fails leaves its last log lines as its termination message (the
    // operator copies them into the Task's status), unless the template chose otherwise.
    container
        .termination_message_policy
        .get_or_insert_with(|| "FallbackToLogsOnError".into());

    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(task.name_any()),
            namespace: task.namespace(),
            labels: Some(labels.clone()),
            annotations: Some(annotations.clone()),
            owner_references: task.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// Template env, then the reference's env, then what the operator injects (it wins):
/// POD_IP first (so later values may use `$(POD_IP)`), USER, HOME, the control port and mode.
fn merged_env(template_env: Vec<EnvVar>, tref: &TaskRef, s: &PodSettings) -> Vec<EnvVar> {
    let mut env: Vec<EnvVar> = vec![EnvVar {
        name: "POD_IP".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "status.podIP".into(),
                api_version: None,
            }),
            ..Default::default()
        }),
        value: None,
    }];
    let mut upsert = |var: EnvVar| match env.iter_mut().find(|e| e.name == var.name) {
        Some(slot) if slot.name == "POD_IP" => {}
        Some(slot) => *slot = var,
        None => env.push(var),
    };
    let plain = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    };
    for var in template_env {
        upsert(var);
    }
    for var in &tref.env {
        upsert(plain(&var.name, var.value.to_string()));
    }
    let user = tref.user.clone().unwrap_or_else(|| s.default_user.clone());
    let home = format!("{}/{}", s.home_base.trim_end_matches('/'), user);
    upsert(plain("USER", user));
    upsert(plain("HOME", home));
    if tref.control_port != 0 {
        upsert(plain("OCC_CONTROL_PORT", tref.control_port.to_string()));
    }
    upsert(plain(
        "ENVBRIDGE_CONTROL_MODE",
        mode_name(tref.control_mode).into(),
    ));
    env
}

pub fn mode_name(mode: ControlMode) -> &'static str {
    match mode {
        ControlMode::Direct => "direct",
        ControlMode::Fairmq => "fairmq",
        ControlMode::Basic => "basic",
        ControlMode::Hook => "hook",
    }
}

/// The reference's command replaces the template's; without one the template's command runs
/// with the template's args followed by the reference's. FairMQ launch args are appended;
/// loopback endpoints are rewritten to `$(POD_IP)`. A `shell` command becomes `bash -c`.
fn command_line(
    tref: &TaskRef,
    tmpl_command: Option<Vec<String>>,
    tmpl_args: Option<Vec<String>>,
    s: &PodSettings,
) -> (Option<Vec<String>>, Vec<String>) {
    let mut args: Vec<String> = if tref.command.is_empty() {
        tmpl_args.unwrap_or_default()
    } else {
        Vec::new()
    };
    args.extend(tref.args.iter().map(|a| a.to_string()));
    if tref.control_mode == ControlMode::Fairmq {
        args.extend(fairmq_launch_args(
            &tref.id,
            tref.control_port,
            &s.fairmq_plugin_dir,
        ));
    }
    let args: Vec<String> = args.iter().map(|a| rewrite_loopback(a)).collect();
    if tref.command.is_empty() {
        return (tmpl_command, args);
    }
    if tref.shell {
        let mut line = tref.command.clone();
        for a in &args {
            line.push(' ');
            line.push_str(&shell_quote(a));
        }
        return (
            Some(vec!["/bin/bash".into(), "-c".into(), line]),
            Vec::new(),
        );
    }
    (Some(vec![tref.command.clone()]), args)
}

/// Runs the command through bash so that output goes to `file` and to stdout (kubectl logs).
fn with_log_file(
    file: &str,
    shell: bool,
    command: Option<Vec<String>>,
    args: Vec<String>,
) -> Option<(Option<Vec<String>>, Vec<String>)> {
    let redirect = format!("exec > >(tee -a {}) 2>&1", shell_quote(file));
    let command = command?;
    if shell && command.len() == 3 && command[0] == "/bin/bash" && command[1] == "-c" {
        let line = format!("{redirect}; {}", command[2]);
        return Some((
            Some(vec!["/bin/bash".into(), "-c".into(), line]),
            Vec::new(),
        ));
    }
    let wrapper = vec![
        "/bin/bash".into(),
        "-c".into(),
        format!("{redirect}; exec \"$@\""),
        "envbridge-task".into(),
    ];
    let mut argv = command;
    argv.extend(args);
    Some((Some(wrapper), argv))
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+$()".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// IPC (abstract sockets live in the network namespace) and shmem (the IPC namespace) channels
/// need a pod sharing the node's namespaces.
fn check_ipc(tref: &TaskRef, template: &str, pod: &PodSpec) -> Result<(), PodError> {
    let Some((key, value)) = tref.host_namespace_channel() else {
        return Ok(());
    };
    let mut missing = Vec::new();
    if pod.host_network != Some(true) {
        missing.push("hostNetwork");
    }
    if pod.host_ipc != Some(true) {
        missing.push("hostIPC");
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(PodError::IpcNeedsHost {
        template: template.to_string(),
        key: key.to_string(),
        value: value.to_string(),
        missing: missing.join(" and "),
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Container;

    use super::*;
    use crate::crd::TaskSpec;
    use crate::plan::EnvVar as RefEnv;

    fn settings() -> PodSettings {
        PodSettings {
            home_base: "/home".into(),
            default_user: "flp".into(),
            fairmq_plugin_dir: "/opt/occ".into(),
        }
    }

    fn tref() -> TaskRef {
        TaskRef {
            name: "e1-readout-flp001".into(),
            id: "t1".into(),
            path: "rd.host-flp001.readout".into(),
            class: "readout".into(),
            node: "flp001".into(),
            template: "readout".into(),
            control_mode: ControlMode::Direct,
            control_port: 47101,
            critical: true,
            command: "/opt/o2/bin/o2-readout-exe".into(),
            env: vec![RefEnv {
                name: "O2_ROLE".into(),
                value: "flp001".into(),
            }],
            args: vec![
                "file:///etc/readout.cfg".into(),
                "--ctl=grpc://localhost:47101".into(),
            ],
            ..Default::default()
        }
    }

    fn task(tref: TaskRef) -> Task {
        let mut t = Task::new(
            &tref.name.clone(),
            TaskSpec {
                environment: "e1".into(),
                task: tref,
                transition: None,
            },
        );
        t.metadata.namespace = Some("ns1".into());
        t.metadata.uid = Some("uid-1".into());
        t
    }

    fn template(host: bool) -> TaskTemplateSpec {
        TaskTemplateSpec {
            control_mode: ControlMode::Direct,
            required_env: vec!["O2_ROLE".into(), "OCC_CONTROL_PORT".into()],
            log_file: None,
            pod: PodSpec {
                host_network: Some(host),
                host_ipc: Some(host),
                containers: vec![Container {
                    name: "task".into(),
                    image: Some("example.invalid/readout:1".into()),
                    command: Some(vec!["/bin/false".into()]),
                    env: Some(vec![
                        EnvVar {
                            name: "OCC_CONTROL_PORT".into(),
                            value: Some("1".into()),
                            value_from: None,
                        },
                        EnvVar {
                            name: "SITE".into(),
                            value: Some("p2".into()),
                            value_from: None,
                        },
                    ]),
                    ..Default::default()
                }],
                ..Default::default()
            },
        }
    }

    fn build(t: &Task, tmpl: &TaskTemplateSpec) -> Result<Pod, PodError> {
        let labels = super::super::names::task_labels("e1", &t.spec.task, None);
        let ann = super::super::names::task_annotations(&t.spec.task);
        build_pod(
            t,
            "readout",
            tmpl,
            "flp001.cluster.local",
            &labels,
            &ann,
            &settings(),
        )
    }

    fn env_of(pod: &Pod) -> Vec<(String, String)> {
        let c = &pod.spec.as_ref().unwrap().containers[0];
        c.env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| {
                let v = e.value.clone().unwrap_or_else(|| {
                    e.value_from
                        .as_ref()
                        .unwrap()
                        .field_ref
                        .as_ref()
                        .unwrap()
                        .field_path
                        .clone()
                });
                (e.name.clone(), v)
            })
            .collect()
    }

    #[test]
    fn pod_is_pinned_owned_and_labelled() {
        let t = task(tref());
        let pod = build(&t, &template(true)).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("flp001.cluster.local"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.metadata.name.as_deref(), Some("e1-readout-flp001"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ns1"));
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Task", "uid-1", Some(true))
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["envbridge.dev/node"], "flp001");
        assert_eq!(labels["envbridge.dev/task"], "e1-readout-flp001");
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()["envbridge.dev/role-path"],
            "rd.host-flp001.readout"
        );
    }

    #[test]
    fn env_is_merged_and_injected() {
        let t = task(tref());
        let env = env_of(&build(&t, &template(true)).unwrap());
        let want: Vec<(String, String)> = [
            ("POD_IP", "status.podIP"),
            ("OCC_CONTROL_PORT", "47101"),
            ("SITE", "p2"),
            ("O2_ROLE", "flp001"),
            ("USER", "flp"),
            ("HOME", "/home/flp"),
            ("ENVBRIDGE_CONTROL_MODE", "direct"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(env, want);
        let mut r = tref();
        r.user = Some("alice".into());
        let env = env_of(&build(&task(r), &template(true)).unwrap());
        assert!(env.contains(&("HOME".into(), "/home/alice".into())));
    }

    #[test]
    fn only_loopback_args_are_rewritten_and_command_replaced() {
        let pod = build(&task(tref()), &template(true)).unwrap();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            c.command.as_ref().unwrap(),
            &vec!["/opt/o2/bin/o2-readout-exe".to_string()]
        );
        assert_eq!(
            c.args.as_ref().unwrap(),
            &vec![
                "file:///etc/readout.cfg".to_string(),
                "--ctl=grpc://$(POD_IP):47101".to_string()
            ]
        );
    }

    #[test]
    fn fairmq_gets_launch_args() {
        let mut r = tref();
        r.control_mode = ControlMode::Fairmq;
        r.args = vec!["--session=default".into()];
        let pod = build(&task(r), &template(true)).unwrap();
        let args = pod.spec.unwrap().containers[0].args.clone().unwrap();
        assert_eq!(
            args,
            [
                "--session=default",
                "--control-port",
                "47101",
                "-S",
                "/opt/occ/lib/",
                "-P",
                "OCClite",
                "--id",
                "t1"
            ]
        );
    }

    #[test]
    fn log_file_runs_through_bash_tee() {
        let mut tmpl = template(true);
        tmpl.log_file = Some("/tmp/readout.log".into());
        let pod = build(&task(tref()), &tmpl).unwrap();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            c.command.as_ref().unwrap(),
            &vec![
                "/bin/bash".to_string(),
                "-c".into(),
                "exec > >(tee -a /tmp/readout.log) 2>&1; exec \"$@\"".into(),
                "envbridge-task".into()
            ]
        );
        assert_eq!(c.args.as_ref().unwrap()[0], "/opt/o2/bin/o2-readout-exe");
        let mut r = tref();
        r.shell = true;
        r.command = "cd /tmp && run".into();
        r.args = vec!["a b".into()];
        let pod = build(&task(r), &tmpl).unwrap();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            c.command.as_ref().unwrap()[2],
            "exec > >(tee -a /tmp/readout.log) 2>&1; cd /tmp && run 'a b'"
        );
        assert!(c.args.is_none());
    }

    #[test]
    fn ipc_without_host_namespaces_is_refused() {
        let mut r = tref();
        r.channels
            .insert("chans.out.0.address".into(), "ipc://@o2ipc-x".into());
        let err = build(&task(r.clone()), &template(false)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "channel chans.out.0.address=ipc://@o2ipc-x needs the node's network and IPC namespaces, but \
             TaskTemplate \"readout\" lacks hostNetwork and hostIPC: set hostNetwork: true and hostIPC: true in its pod"
        );
        assert!(build(&task(r), &template(true)).is_ok());
        let mut r = tref();
        r.channels
            .insert("chans.out.0.address".into(), "tcp://*:5000".into());
        assert!(build(&task(r), &template(false)).is_ok());
    }

    #[test]
    fn missing_required_env_is_named() {
        let mut tmpl = template(true);
        tmpl.required_env.push("O2_DETECTOR".into());
        let err = build(&task(tref()), &tmpl).unwrap_err();
        assert_eq!(
            err,
            PodError::MissingEnv {
                template: "readout".into(),
                missing: vec!["O2_DETECTOR".into()]
            }
        );
    }
}

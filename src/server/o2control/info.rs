//! Roster records -> the anchor's messages (pure: unit-tested without a server).

use std::collections::BTreeSet;
use std::sync::Arc;

use super::pb::o2control as pb;
use super::state_map;
use crate::roster::{EnvRecord, Phase, TaskRecord};
use crate::server::convert::millis;

/// A task as the anchor's lists show it. Its id is the Task object's name (unique in its
/// namespace, and it names the environment); the anchor's Mesos fields stay empty.
pub fn short_task(t: &TaskRecord) -> pb::ShortTaskInfo {
    pb::ShortTaskInfo {
        name: t.name.to_string(),
        // Every task envbridge knows belongs to an environment: the anchor's "locked".
        locked: true,
        task_id: t.name.to_string(),
        status: state_map::task_status(t.state).into(),
        state: state_map::task_state(t.state).into(),
        class_name: t.class.to_string(),
        deployment_info: Some(pb::TaskDeploymentInfo {
            hostname: t.node.to_string(),
            ..Default::default()
        }),
        critical: t.critical,
        pid: if t.pid > 0 {
            t.pid.to_string()
        } else {
            String::new()
        },
        ..Default::default()
    }
}

/// One task in full as far as the roster knows it: its short info, its path in the workflow
/// tree and its environment's id. Channels, command and properties live on the Task object,
/// not in the roster, and stay empty.
pub fn task(t: &TaskRecord, env: &EnvRecord) -> pb::TaskInfo {
    pb::TaskInfo {
        short_info: Some(short_task(t)),
        task_path: t.path.to_string(),
        env_id: env.id.to_string(),
        ..Default::default()
    }
}

/// What GetTask adds from the Task object itself: its command (`commandInfo`), its
/// channels (a `bind` channel is inbound, a `connect` one outbound, as the anchor lists
/// them) and its CONFIGURE properties.
pub fn task_detail(r: &crate::model::TaskRef, info: &mut pb::TaskInfo) {
    info.command_info = Some(pb::CommandInfo {
        env: r
            .env
            .iter()
            .map(|e| format!("{}={}", e.name, e.value))
            .collect(),
        shell: r.shell,
        value: r.command.clone(),
        arguments: r.args.iter().map(|a| a.to_string()).collect(),
        user: r.user.clone().unwrap_or_default(),
    });
    // `chans.<name>.<i>.<field>`: one ChannelInfo per channel, from its first socket.
    let mut chans: std::collections::BTreeMap<&str, (String, String, String)> = Default::default();
    for (k, v) in &r.channels {
        let mut parts = k.splitn(4, '.');
        let (Some("chans"), Some(name), Some("0"), Some(field)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let c = chans.entry(name).or_default();
        match field {
            "method" => c.0 = v.to_string(),
            "type" => c.1 = v.to_string(),
            "address" => c.2 = v.to_string(),
            _ => {}
        }
    }
    for (name, (method, kind, target)) in chans {
        let c = pb::ChannelInfo {
            name: name.to_string(),
            r#type: kind,
            target,
        };
        if method == "bind" {
            info.inbound_channels.push(c);
        } else {
            info.outbound_channels.push(c);
        }
    }
    info.properties = r
        .properties
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
}

/// The transition under way: requested in the spec and not yet settled by the status.
fn current_transition(e: &EnvRecord) -> String {
    let Some((id, ev)) = &e.requested else {
        return String::new();
    };
    let settled = e
        .observed
        .as_ref()
        .is_some_and(|o| o.id == *id && o.phase != Phase::Running);
    if settled {
        String::new()
    } else {
        state_map::event_name(*ev).to_string()
    }
}

/// An environment as the anchor's clients see it, from its record and its tasks; the task
/// list itself only `with_tasks` (the counts always).
pub fn environment(
    e: &EnvRecord,
    tasks: &[Arc<TaskRecord>],
    with_tasks: bool,
) -> pb::EnvironmentInfo {
    let active = tasks
        .iter()
        .filter(|t| state_map::task_status(t.state) == "ACTIVE")
        .count();
    let hosts: BTreeSet<&str> = tasks.iter().map(|t| &*t.node).collect();
    let number_of_hosts = if hosts.is_empty() {
        e.nodes as usize
    } else {
        hosts.len()
    };
    pb::EnvironmentInfo {
        id: e.id.to_string(),
        created_when: millis(e.created_at),
        state: state_map::environment_state(e.state).into(),
        tasks: if with_tasks {
            tasks.iter().map(|t| short_task(t)).collect()
        } else {
            vec![]
        },
        root_role: e.workflow.to_string(),
        current_run_number: e
            .run_number
            .as_deref()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0),
        number_of_hosts: number_of_hosts as i32,
        number_of_tasks: e.tasks as i32,
        current_transition: current_transition(e),
        user_vars: user_vars(e),
        description: e.description.as_deref().unwrap_or_default().to_string(),
        number_of_active_tasks: active as i32,
        number_of_inactive_tasks: (e.tasks as usize).saturating_sub(active) as i32,
        ..Default::default()
    }
}

/// The anchor's user variables: the caller's at create, then the run's (a run variable
/// wins over a caller's of the same name, as the anchor's runtime variables do).
/// `environment_id` is always there, as the anchor sets it for every environment (its
/// clients read the map as absent when it is empty).
pub fn user_vars(e: &EnvRecord) -> std::collections::HashMap<String, String> {
    let mut vars: std::collections::HashMap<String, String> = e
        .variables
        .iter()
        .chain(e.run_variables.iter())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    vars.insert("environment_id".into(), e.id.to_string());
    vars
}

/// The integration plugins the anchor's core knows: GetIntegratedServices lists each, as
/// the anchor lists its registered plugins, enabled or not.
pub const KNOWN_PLUGINS: [&str; 8] = [
    "bookkeeping",
    "ccdb",
    "dcs",
    "ddsched",
    "kafka",
    "lhc",
    "odc",
    "trg",
];

/// GetIntegratedServices: the anchor's plugins and any other the daemon is configured with,
/// by plugin name. A configured one is enabled, with its endpoint; envbridge calls it per
/// request and keeps no connection, so its connection state is IDLE. One not configured is
/// listed disabled with nothing else, as the anchor lists a plugin it did not load.
pub fn integrated_services(
    plugins: &std::collections::BTreeMap<String, String>,
) -> std::collections::HashMap<String, pb::IntegratedServiceInfo> {
    let mut out: std::collections::HashMap<String, pb::IntegratedServiceInfo> = KNOWN_PLUGINS
        .iter()
        .map(|name| {
            let info = pb::IntegratedServiceInfo {
                name: name.to_string(),
                ..Default::default()
            };
            (name.to_string(), info)
        })
        .collect();
    for (name, endpoint) in plugins {
        let info = pb::IntegratedServiceInfo {
            name: name.clone(),
            enabled: true,
            endpoint: endpoint.clone(),
            connection_state: "IDLE".into(),
            data: "{}".into(),
        };
        out.insert(name.clone(), info);
    }
    out
}

/// The daemon's own version in the anchor's shape.
pub fn version() -> pb::Version {
    let part = |s: &str| s.parse().unwrap_or(0);
    pb::Version {
        major: part(env!("CARGO_PKG_VERSION_MAJOR")),
        minor: part(env!("CARGO_PKG_VERSION_MINOR")),
        patch: part(env!("CARGO_PKG_VERSION_PATCH")),
        build: String::new(),
        product_name: env!("CARGO_PKG_NAME").into(),
        version_str: env!("CARGO_PKG_VERSION").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roster::Observed;
    use crate::state::{Event, State};

    fn env() -> EnvRecord {
        super::super::fixture::env("e1", 2, 3, Some(State::Standby))
    }

    fn task(name: &str, node: &str, state: State) -> Arc<TaskRecord> {
        super::super::fixture::task(name, node, "readout-dataflow.readout", state, true)
    }

    #[test]
    fn an_environment_with_its_tasks_up_is_deployed() {
        let tasks = [
            task("e1-flp001-readout", "flp001", State::Standby),
            task("e1-flp002-readout", "flp002", State::Standby),
            task("e1-flp002-stfb", "flp002", State::Deploying),
        ];
        let i = environment(&env(), &tasks, true);
        assert_eq!(i.id, "e1");
        assert_eq!(i.state, "DEPLOYED");
        assert_eq!(i.created_when, 1_700_000_000_123);
        assert_eq!(i.root_role, "readout-dataflow");
        assert_eq!(i.number_of_tasks, 3);
        assert_eq!(i.number_of_hosts, 2);
        assert_eq!(
            (i.number_of_active_tasks, i.number_of_inactive_tasks),
            (2, 1)
        );
        assert_eq!(i.current_run_number, 0);
        assert_eq!(i.current_transition, "");
        assert_eq!(i.tasks.len(), 3);
        let t = &i.tasks[2];
        assert_eq!(
            (t.task_id.as_str(), t.state.as_str()),
            ("e1-flp002-stfb", "UNKNOWN")
        );
        assert_eq!(t.status, "INACTIVE");
        assert_eq!(t.class_name, "readout");
        assert!(t.critical && t.locked);
        assert_eq!(
            t.deployment_info.as_ref().map(|d| d.hostname.as_str()),
            Some("flp002")
        );
        // Without the list, the counts stay.
        let i = environment(&env(), &tasks, false);
        assert!(i.tasks.is_empty());
        assert_eq!(i.number_of_active_tasks, 2);
    }

    #[test]
    fn a_running_environment_reports_its_run_and_a_transition_under_way() {
        let mut e = env();
        e.state = Some(State::Running);
        e.run_number = Some("512".into());
        e.requested = Some(("t2".into(), Event::Start));
        e.observed = Some(Observed {
            id: "t2".into(),
            event: Event::Start,
            phase: Phase::Succeeded,
            message: None,
        });
        let i = environment(&e, &[], false);
        assert_eq!((i.state.as_str(), i.current_run_number), ("RUNNING", 512));
        assert_eq!(i.current_transition, "");
        // No tasks in the roster yet: the hosts the environment spans.
        assert_eq!(i.number_of_hosts, 2);
        e.requested = Some(("t3".into(), Event::Stop));
        assert_eq!(
            environment(&e, &[], false).current_transition,
            "STOP_ACTIVITY"
        );
        e.observed = Some(Observed {
            id: "t3".into(),
            event: Event::Stop,
            phase: Phase::Running,
            message: None,
        });
        assert_eq!(
            environment(&e, &[], false).current_transition,
            "STOP_ACTIVITY"
        );
    }

    #[test]
    fn integrated_services_are_the_anchors_plugins_and_the_configured_ones() {
        let plugins = [
            (
                "bookkeeping".to_string(),
                "http://127.0.0.1:9/bk".to_string(),
            ),
            ("site".to_string(), "http://127.0.0.1:9/site".to_string()),
        ]
        .into_iter()
        .collect();
        let s = integrated_services(&plugins);
        assert_eq!(s.len(), KNOWN_PLUGINS.len() + 1);
        let b = &s["bookkeeping"];
        assert!(b.enabled);
        assert_eq!(b.endpoint, "http://127.0.0.1:9/bk");
        assert_eq!(
            (b.connection_state.as_str(), b.data.as_str()),
            ("IDLE", "{}")
        );
        assert!(s["site"].enabled);
        let dcs = &s["dcs"];
        assert!(!dcs.enabled && dcs.endpoint.is_empty() && dcs.connection_state.is_empty());
        // Never empty: the anchor's clients read an empty map as no map at all.
        let none = integrated_services(&Default::default());
        assert_eq!(none.len(), KNOWN_PLUGINS.len());
        assert!(none.values().all(|p| !p.enabled));
    }

    #[test]
    fn get_task_shows_the_command_and_the_channels() {
        let r = crate::model::TaskRef {
            command: "/opt/o2/bin/o2-readout-exe".into(),
            args: vec!["--id".into(), "readout".into()],
            env: vec![crate::model::EnvVar {
                name: "O2_ROLE".into(),
                value: "flp001".into(),
            }],
            channels: [
                ("chans.readout.0.method", "bind"),
                ("chans.readout.0.type", "push"),
                ("chans.readout.0.address", "ipc://@readout"),
                ("chans.out.0.method", "connect"),
                ("chans.out.0.type", "pull"),
                ("chans.out.0.address", "tcp://flp002:5000"),
                ("chans.out.numSockets", "1"),
            ]
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect(),
            properties: [("environment_id".to_string(), "e1".to_string())].into(),
            ..Default::default()
        };
        let mut info = pb::TaskInfo::default();
        task_detail(&r, &mut info);
        let c = info.command_info.unwrap();
        assert_eq!(c.value, "/opt/o2/bin/o2-readout-exe");
        assert_eq!(c.arguments, ["--id", "readout"]);
        assert_eq!(c.env, ["O2_ROLE=flp001"]);
        assert_eq!(info.inbound_channels.len(), 1);
        assert_eq!(
            (
                info.inbound_channels[0].name.as_str(),
                info.inbound_channels[0].r#type.as_str(),
                info.inbound_channels[0].target.as_str()
            ),
            ("readout", "push", "ipc://@readout")
        );
        assert_eq!(info.outbound_channels[0].target, "tcp://flp002:5000");
        assert_eq!(info.properties["environment_id"], "e1");
    }

    #[test]
    fn the_version_is_the_crates() {
        let v = version();
        assert_eq!(v.version_str, env!("CARGO_PKG_VERSION"));
        assert_eq!(
            format!("{}.{}.{}", v.major, v.minor, v.patch),
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(v.product_name, "envbridge");
    }
}

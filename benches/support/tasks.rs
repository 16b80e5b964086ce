//! The benchmarks' task references: N nodes, K tasks each, cycling through the three
//! classes of readout-dataflow (readout direct, StfBuilder and StfSender FairMQ).

use std::collections::BTreeMap;

use envbridge::plan::{ControlMode, EnvVar, TaskRef};

pub const CLASSES: [(&str, ControlMode); 3] = [
    ("readout", ControlMode::Direct),
    ("stfbuilder-senderoutput", ControlMode::Fairmq),
    ("stfsender", ControlMode::Fairmq),
];

pub fn task_refs(env: &str, nodes: usize, per_node: usize) -> Vec<TaskRef> {
    let mut out = Vec::with_capacity(nodes * per_node);
    for n in 1..=nodes {
        let host = format!("flp{n:03}");
        for i in 0..per_node {
            out.push(task_ref(env, &host, i, CLASSES[i % CLASSES.len()]));
        }
    }
    out
}

/// `per_host` direct-mode readout tasks on each of `hosts`, started as the image's readout
/// (`/opt/o2/bin/o2-readout-exe`), control ports `base_port`, `base_port + 1`, ... on each.
pub fn readout_refs(env: &str, hosts: &[String], per_host: usize, base_port: u16) -> Vec<TaskRef> {
    let mut out = Vec::with_capacity(hosts.len() * per_host);
    for host in hosts {
        for i in 0..per_host {
            let mut t = task_ref(env, host, i, CLASSES[0]);
            t.control_port = base_port + i as u16;
            t.command = "/opt/o2/bin/o2-readout-exe".into();
            out.push(t);
        }
    }
    out
}

/// Task `i` of `host`, of class `class` (port 47100 + i).
fn task_ref(env: &str, host: &str, i: usize, (class, mode): (&str, ControlMode)) -> TaskRef {
    let name = format!("{env}-{host}-{class}-{i}");
    TaskRef {
        name: name.clone(),
        id: name,
        path: format!("readout-dataflow.host-{host}.{class}{i}"),
        class: class.into(),
        node: host.into(),
        template: class.into(),
        control_mode: mode,
        control_port: 47100 + i as u16,
        critical: true,
        command: format!("/opt/o2/bin/{class}"),
        env: vec![
            EnvVar {
                name: "O2_ROLE".into(),
                value: host.into(),
            },
            EnvVar {
                name: "O2_SYSTEM".into(),
                value: "FLP".into(),
            },
            EnvVar {
                name: "O2_PARTITION".into(),
                value: env.into(),
            },
        ],
        args: vec![
            "--session=default".into(),
            "--monitoring-backend=no-op://".into(),
        ],
        channels: BTreeMap::from([
            (
                format!("chans.{class}.0.address").into(),
                format!("ipc://@{env}-{host}-{i}").into(),
            ),
            (format!("chans.{class}.0.method").into(), "bind".into()),
            (format!("chans.{class}.0.transport").into(), "shmem".into()),
            (format!("chans.{class}.numSockets").into(), "1".into()),
        ]),
        ..Default::default()
    }
}

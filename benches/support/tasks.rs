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
            let (class, mode) = CLASSES[i % CLASSES.len()];
            let name = format!("{env}-{host}-{class}-{i}");
            out.push(TaskRef {
                name: name.clone(),
                id: name,
                path: format!("readout-dataflow.host-{host}.{class}{i}"),
                class: class.into(),
                node: host.clone(),
                template: class.into(),
                control_mode: mode,
                control_port: 47100 + i as u16,
                critical: true,
                command: format!("/opt/o2/bin/{class}"),
                env: vec![
                    EnvVar {
                        name: "O2_ROLE".into(),
                        value: host.as_str().into(),
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
            });
        }
    }
    out
}

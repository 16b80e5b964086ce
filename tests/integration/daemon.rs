//! The bridge daemon against the real local control plane: create through the API, the
//! roster, transitions (fail fast), kill, destroy, namespaces, apiserver outage, daemon
//! restart, leader election. The cluster side is played by `sim` (see its doc) so that
//! delays and failures are exact. Here the requests' helpers; the tests one topic a module.

#[path = "daemon/anchor.rs"]
mod anchor;
#[path = "daemon/apf.rs"]
mod apf;
#[path = "daemon/dashboard.rs"]
mod dashboard;
#[path = "daemon/dashboard_browser.rs"]
mod dashboard_browser;
#[path = "daemon/dashboard_form.rs"]
mod dashboard_form;
#[path = "daemon/fixture.rs"]
mod fixture;
#[path = "daemon/lifecycle.rs"]
mod lifecycle;
#[path = "daemon/live.rs"]
mod live;
#[path = "daemon/o2control.rs"]
mod o2control;
#[path = "daemon/o2control_auto.rs"]
mod o2control_auto;
#[path = "daemon/o2control_tls.rs"]
mod o2control_tls;
#[path = "daemon/plane.rs"]
mod plane;
#[path = "daemon/rbac.rs"]
mod rbac;
#[path = "daemon/recovery.rs"]
mod recovery;
#[path = "daemon/requests.rs"]
mod requests;
#[path = "daemon/sim.rs"]
mod sim;
#[path = "daemon/stack.rs"]
mod stack;
#[path = "daemon/trust.rs"]
mod trust;
#[path = "daemon/web.rs"]
mod web;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use envbridge::bridge::{BridgeConfig, NamespaceMode};
use envbridge::crd::{Environment, Task, TaskSet};
use envbridge::roster::EnvKey;
use envbridge::server::pb;
use envbridge::state::{Event, State};
use fixture::{Child, Daemon, Setup, fixed_ns, names};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use plane::PrivatePlane;
use sim::{Sim, SimConfig};

use crate::support::{self, TestNamespace};

const WAIT: Duration = Duration::from_secs(60);

fn vars(hosts: &str, port_base: u16) -> HashMap<String, String> {
    HashMap::from([
        ("hosts".to_string(), hosts.to_string()),
        ("port_base".to_string(), port_base.to_string()),
    ])
}

fn create_req(key: &str, hosts: &str, port_base: u16) -> pb::CreateEnvironmentRequest {
    pb::CreateEnvironmentRequest {
        workflow: "readout-dataflow".into(),
        variables: vars(hosts, port_base),
        idempotency_key: key.into(),
        wait: true,
        timeout_seconds: 60,
        ..Default::default()
    }
}

fn transition(id: &str, event: &str, args: &[(&str, &str)]) -> pb::TransitionRequest {
    pb::TransitionRequest {
        id: id.into(),
        event: event.into(),
        arguments: args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        wait: true,
        timeout_seconds: 60,
        ..Default::default()
    }
}

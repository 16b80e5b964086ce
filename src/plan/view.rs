//! The `-o tasks` view: one flat, fully resolved record per task, whatever the storage format.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::{EnvVar, TaskRef};

/// `{"node", "path", "class", "name", "env", "args", "controlPort", "channels"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskView<'a> {
    pub node: &'a str,
    pub path: &'a str,
    pub class: &'a str,
    pub name: &'a str,
    pub env: &'a [EnvVar],
    pub args: &'a [Arc<str>],
    pub control_port: u16,
    pub channels: &'a BTreeMap<Arc<str>, Arc<str>>,
}

impl<'a> From<&'a TaskRef> for TaskView<'a> {
    fn from(t: &'a TaskRef) -> Self {
        TaskView {
            node: &t.node,
            path: &t.path,
            class: &t.class,
            name: &t.name,
            env: &t.env,
            args: &t.args,
            control_port: t.control_port,
            channels: &t.channels,
        }
    }
}

/// The view of every task as a JSON array (pretty-printed, with a trailing newline).
pub fn tasks_json<'a>(tasks: impl IntoIterator<Item = &'a TaskRef>) -> String {
    let view: Vec<TaskView> = tasks.into_iter().map(TaskView::from).collect();
    let mut s = serde_json::to_string_pretty(&view).unwrap_or_else(|_| "[]".to_string());
    s.push('\n');
    s
}

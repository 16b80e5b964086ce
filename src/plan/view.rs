//! The `-o tasks` view: one flat, fully resolved record per task, whatever the storage format.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::{ControlMode, EnvVar, TaskRef};

/// `{"node", "path", "class", "name", "env", "args", "controlPort", "channels", "command",
/// "shell", "user", "controlMode", "critical", "properties"}`.
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
    /// The launch and control facts: the resolved command line, whether it is a shell line,
    /// the user, the control mode, whether a failure fails the environment, and the
    /// CONFIGURE-time properties besides channels.
    pub command: &'a str,
    pub shell: bool,
    pub user: &'a str,
    pub control_mode: ControlMode,
    pub critical: bool,
    pub properties: &'a BTreeMap<String, String>,
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
            command: &t.command,
            shell: t.shell,
            user: t.user.as_deref().unwrap_or(""),
            control_mode: t.control_mode,
            critical: t.critical,
            properties: &t.properties,
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

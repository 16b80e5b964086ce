//! Task classes and workflow templates: loading with locations, expressions, the variable
//! cascade and role-tree expansion. Pure: no Kubernetes here.
//!
//! Entry points: [`Sources`] names the input directories and site profiles;
//! [`expand::expand`] turns a workflow into task and hook instances that `crate::plan` resolves.

pub mod duration;
pub mod error;
pub mod expand;
pub mod expr;
pub mod expr_scan;
pub mod funcs;
pub mod gofmt;
pub mod jit;
mod jit_generator;
pub mod load;
pub mod model;
pub mod public;
pub mod scope;
pub mod store;
pub mod template;
pub mod yaml;

use std::path::PathBuf;

pub use error::{Error, Loc, Result};

/// Where the inputs of a render come from.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// Task classes: `<tasks_dir>/<load>.yaml`.
    pub tasks_dir: PathBuf,
    /// Included workflows: `<workflows_dir>/<include>.yaml` (default: the workflow's directory).
    pub workflows_dir: Option<PathBuf>,
    /// Site profiles (`--defaults`), lowest priority first.
    pub defaults_files: Vec<PathBuf>,
}

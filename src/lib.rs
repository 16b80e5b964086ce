//! envbridge: runs experiment run-control environments on Kubernetes.
//!
//! Pure core: [`workflow`], [`plan`], [`roster`], [`state`] (no Kubernetes imports).
//! Kubernetes edges: [`bridge`] (the daemon's), [`operator`] (the cluster side), [`dev`]
//! (the local control plane).

pub mod control;
pub mod crd;
pub mod dev;
pub mod operator;
pub mod plan;
pub mod state;
pub mod install;
pub mod workflow;

//! envbridge: runs experiment run-control environments on Kubernetes.
//!
//! Pure core: [`workflow`], [`plan`], [`roster`], [`state`] (no Kubernetes imports).
//! Kubernetes edges: [`bridge`] (the daemon's), [`operator`] (the cluster side), [`dev`]
//! (the local control plane).

pub mod crd;
pub mod dev;
pub mod plan;
pub mod state;

pub mod bridge;
pub mod roster;
pub mod server;

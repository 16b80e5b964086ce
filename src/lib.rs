//! envbridge: runs experiment run-control environments on Kubernetes.
//!
//! Pure core: [`model`], [`workflow`], [`plan`], [`roster`], [`state`] (no Kubernetes imports;
//! `tests/layering.rs` checks it). The edge from the plan to the cluster's objects: [`objects`].
//! Kubernetes edges: [`bridge`] (the daemon's), [`operator`] (the cluster side), [`dev`]
//! (the local control plane).

pub mod bridge;
pub mod control;
pub mod crd;
pub mod dev;
pub mod install;
pub mod integration;
pub mod launch;
pub mod model;
pub mod objects;
pub mod operator;
pub mod plan;
pub mod roster;
pub mod server;
pub mod signal;
pub mod state;
pub mod workflow;

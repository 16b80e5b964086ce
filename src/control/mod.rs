//! Task control: the protocol task processes speak (gRPC service `occ_pb.Occ`, protobuf and
//! the JSON variant of FairMQ devices), the client the operator drives tasks with, the FairMQ
//! multi-step sequences, and the task simulator.
//!
//! Pure parts: [`bare_path`] (bare method names on the wire), [`fairmq`] (sequences, state mapping), [`wire`] (paths, content types),
//! [`sim::config`] and [`sim::machine`], [`log_resume`]. I/O: [`client`], [`bare_path_io`], [`sim::server`],
//! [`log_stream`] and [`log_targets`] (the Kubernetes edge of `envbridge logs`).

pub mod bare_path;
pub mod bare_path_io;
pub mod client;
pub mod error;
pub mod fairmq;
pub mod json;
pub mod log_resume;
pub mod log_stream;
pub mod log_targets;
pub mod pb;
pub mod sim;
pub mod wire;

pub use client::{
    TaskEndpoint, event_stream, forget, get_raw_state, get_state, raw_state_stream, state_stream,
    transition,
};
pub use error::ControlError;
pub use fairmq::fairmq_launch_args;

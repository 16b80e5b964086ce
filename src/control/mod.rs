//! Task control: the protocol task processes speak (gRPC service `occ_pb.Occ`, protobuf and
//! the JSON variant of FairMQ devices), the client the operator drives tasks with, the FairMQ
//! multi-step sequences, and the task simulator.
//!
//! Pure parts: [`bare_path`] (bare method names on the wire), [`fairmq`] (sequences, state mapping), [`wire`] (paths, content types),
//! [`sim::config`] and [`sim::machine`], [`log_resume`]. I/O: [`client`] (the calls) and
//! [`policy`] (the client value: which addresses it may dial, its channel cache),
//! [`bare_path_io`], [`sim::server`], [`log_stream`] and [`log_targets`] (the Kubernetes edge
//! of `envbridge logs`).

pub mod bare_path;
pub mod bare_path_io;
pub mod client;
pub mod conn;
pub mod error;
pub mod fairmq;
pub mod h2frame;
pub mod json;
pub mod log_resume;
pub mod log_stream;
pub mod log_targets;
pub mod pb;
pub mod policy;
pub mod sim;
pub mod wire;

pub use client::TaskEndpoint;
pub use error::ControlError;
pub use fairmq::fairmq_launch_args;
pub use policy::ControlClient;

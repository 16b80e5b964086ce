//! Generated code of proto/o2control.proto and its imports (built by build.rs with protox):
//! one module per protobuf package, as the generated code refers to its neighbours
//! (`super::common::User`).
#![allow(clippy::all, missing_docs)]

/// `common`: the requesting user, beam information.
pub mod common {
    tonic::include_proto!("common");
}

/// `events`: what Subscribe streams.
pub mod events {
    tonic::include_proto!("events");
}

/// `o2control`: the Control service and its messages.
pub mod o2control {
    tonic::include_proto!("o2control");
}

/// `apricot`: the configuration service (proto/apricot.proto).
pub mod apricot {
    tonic::include_proto!("apricot");
}

/// The encoded descriptor set (the o2control files and apricot), served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/o2control_descriptor.bin"));

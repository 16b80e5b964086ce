//! Generated code of proto/envbridge.proto (built by build.rs with protox).
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("envbridge.v1");

/// The encoded descriptor set, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/envbridge_descriptor.bin"));

//! Generated messages of the task control service (proto/occ.proto, package `occ_pb`).
//!
//! Only the messages are generated: the client and the simulator's server are written by
//! hand in this module so that one code path serves both wire variants (protobuf with full
//! method paths, JSON with bare method names; see [`super::wire`]).

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/occ_pb.rs"));

//! The wire types and gRPC stubs of `proto/reprise/v1/replay.proto`.
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("reprise.v1");

/// The protocol version this build speaks (`Layout.protocol_version`).
pub const PROTOCOL_VERSION: u32 = 1;

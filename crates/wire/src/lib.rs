//! Reprise's wire formats, shared by the clients and the servers (neither depends on
//! the other):
//! - [`pb`]: the gRPC types and stubs generated from `proto/reprise/v1/replay.proto`
//!   (the remote protocol), with conversions to and from core types;
//! - [`local`]: the frames of the local protocol (same host, over a Unix socket;
//!   step data never crosses it);
//! - [`codes`]: every mapping between core errors and what travels on a wire
//!   (gRPC statuses, the local protocol's error codes), so a call raises the same
//!   error in process, locally and remotely.

pub mod codes;
pub mod local;
pub mod pb;

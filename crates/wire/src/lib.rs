//! Reprise's wire formats, shared by the clients and the servers (neither depends on
//! the other):
//! - [`pb`]: the gRPC types and stubs generated from `proto/reprise/v1/replay.proto`
//!   (the remote protocol), with conversions to and from core types; [`sample`]'s
//!   hand-written `SampleResponse` (rows gathered into the message as it is encoded)
//!   and [`codec`], prost's codec reserving a message's length first;
//! - [`local`]: the frames of the local protocol (same host, over a Unix socket;
//!   step data never crosses it);
//! - [`codes`]: every mapping between core errors and what travels on a wire
//!   (gRPC statuses, the local protocol's error codes), so a call raises the same
//!   error in process, locally and remotely.

pub mod codec;
pub mod codes;
pub mod local;
pub mod pb;
pub mod sample;

/// True for `host:port` addresses on this machine: 127.0.0.0/8, ::1 and "localhost"
/// (where servers need no token and clients compress nothing by default).
pub fn is_loopback(address: &str) -> bool {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

//! Reprise servers. [`local`] serves tables to clients on the same host over a
//! Unix socket; the clients write and read step data in place in shared memory.
//! [`grpc`] serves them to any host over gRPC.

pub mod grpc;
pub mod local;
pub mod metrics;
mod naming;

pub use grpc::{GrpcOptions, GrpcServer};
pub use local::LocalServer;

//! iSwitch-style in-network gradient aggregation: workers stream gradient segments as UDP
//! packets to a daemon that sums each segment as its packets arrive and sends the finished
//! segment to every member (2 link traversals per value instead of a parameter server's 4).
//! `docs/aggregation.md` documents the protocol and its rules.

// Modules in layer order: each uses only modules above it.
pub mod packet;
pub mod stats;
pub mod outbox;
pub mod slot;
pub mod job;
pub mod engine;
pub mod socket;
pub mod daemon;
pub mod metrics;
pub mod worker;

pub use daemon::{Daemon, DaemonOptions};
pub use engine::{Allow, Engine, Options, UpstreamOptions};
pub use packet::{Dtype, JoinParams, Mode};
pub use worker::{Report, Worker, WorkerOptions};

/// The crate's errors; the Python bindings map each to a `reprise.errors` exception.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Timeout(String),
    /// The daemon refused a request (a Nak).
    #[error("{0}")]
    Refused(String),
}

//! Reprise clients. [`local`] attaches to a replay server on the same host:
//! steps are written and sampled rows read in place in the store's shared
//! memory; only control records cross the Unix socket ([`protocol`]).
//! [`remote`] talks to a server on any host over gRPC ([`pb`]).

pub mod local;
pub mod pb;
pub mod protocol;
pub mod remote;
pub mod status;

pub use local::{ClientSample, ClientWriter, LocalClient};
pub use remote::{RemoteClient, RemoteOptions, RemoteSampler, RemoteWriter};

//! Reprise clients. [`local`] attaches to a replay server on the same host:
//! steps are written and sampled rows read in place in the store's shared
//! memory; only control records cross the Unix socket ([`protocol`]).

pub mod local;
pub mod protocol;

pub use local::{ClientSample, ClientWriter, LocalClient};

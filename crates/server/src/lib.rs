//! Reprise servers. [`local`] serves tables to clients on the same host over a
//! Unix socket; the clients write and read step data in place in shared memory.

pub mod local;
mod naming;

pub use local::LocalServer;

//! Reprise servers over core tables. [`local`] serves local clients (same host)
//! over a Unix socket; they write and read step data in place in shared memory.
//! [`remote`] serves remote clients (any host) over gRPC. Both speak the formats
//! of `reprise-wire`; [`auth`] is the one token check of every endpoint. Both run a
//! [`checkpoint::Checkpointer`] when a client asks for a checkpoint.

pub use reprise_core::auth;
pub mod checkpoint;
pub mod dashboard;
pub mod limits;
pub mod monitor;
pub mod remote;
pub mod local;
pub mod metrics;
mod naming;

pub use remote::{RemoteServerOptions, RemoteServer};

use reprise_core::error::{Error, Result};
use reprise_core::{Store, Table};

/// The distinct stores of the tables a server serves, and each table's index into
/// them. Refuses no tables and duplicate table names.
pub(crate) fn stores_of(tables: &[Table]) -> Result<(Vec<Store>, Vec<u32>)> {
    if tables.is_empty() {
        return Err(Error::InvalidArgument("a server needs at least one table".into()));
    }
    let mut stores: Vec<Store> = Vec::new();
    let mut table_store = Vec::new();
    for (i, t) in tables.iter().enumerate() {
        if tables[..i].iter().any(|u| u.name() == t.name()) {
            return Err(Error::InvalidArgument(format!("two tables named '{}'; table names must be unique", t.name())));
        }
        let at = stores.iter().position(|s| s.same(t.store())).unwrap_or_else(|| {
            stores.push(t.store().clone());
            stores.len() - 1
        });
        table_store.push(at as u32);
    }
    Ok((stores, table_store))
}
pub use local::LocalServer;
pub use naming::socket_dir;

//! What a server is doing, for people watching it: its tables' counters and
//! extension statistics, the clients connected now with what each inserted and
//! sampled, and the step bytes through the remote service. One [`Monitor`] is
//! shared by the local and remote servers of one `rp.Server`, and read by the
//! dashboard, `reprise info` and `reprise top` through [`Monitor::snapshot`].
//!
//! Clients are registered per connection (a local socket, a remote TCP
//! connection) and leave when it closes; their counters are atomics bumped once
//! per request (not per item), so serving pays nothing measurable for them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use reprise_core::{Table, TableInfo};
use serde_json::{json, Value};

/// One connected client and what it did.
pub struct ClientEntry {
    id: u64,
    kind: &'static str,
    peer: String,
    addr: Option<SocketAddr>,
    since: Instant,
    inserts: Vec<AtomicU64>,
    samples: Vec<AtomicU64>,
}

impl ClientEntry {
    /// Counts `n` items inserted into table number `table` (out of range: ignored).
    pub fn inserted(&self, table: usize, n: u64) {
        if let Some(c) = self.inserts.get(table) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn sampled(&self, table: usize, n: u64) {
        if let Some(c) = self.samples.get(table) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// A registered client; dropping it (the connection closed) removes it.
pub struct ClientGuard {
    monitor: Arc<Monitor>,
    entry: Arc<ClientEntry>,
}

impl ClientGuard {
    pub fn entry(&self) -> &Arc<ClientEntry> {
        &self.entry
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.monitor.clients.lock().remove(&self.entry.id);
    }
}

/// A server's tables, clients and traffic, as the dashboard shows them.
pub struct Monitor {
    tables: Vec<Table>,
    started: Instant,
    local_name: Mutex<Option<String>>,
    remote_address: Mutex<Option<String>>,
    clients: Mutex<BTreeMap<u64, Arc<ClientEntry>>>,
    next_id: AtomicU64,
    /// Step bytes received by remote inserts and sent by remote samples.
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
}

impl Monitor {
    pub fn new(tables: Vec<Table>) -> Arc<Monitor> {
        Arc::new(Monitor {
            tables,
            started: Instant::now(),
            local_name: Mutex::new(None),
            remote_address: Mutex::new(None),
            clients: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
        })
    }

    pub fn tables(&self) -> &[Table] {
        &self.tables
    }

    /// The number of `name` among the monitored tables.
    pub fn table_index(&self, name: &str) -> Option<usize> {
        self.tables.iter().position(|t| t.name() == name)
    }

    pub fn set_local_name(&self, name: &str) {
        *self.local_name.lock() = Some(name.to_string());
    }

    pub fn set_remote_address(&self, address: &str) {
        *self.remote_address.lock() = Some(address.to_string());
    }

    /// Registers a client connection: `kind` is "local" or "remote"; `peer` how
    /// it is shown; `addr` how remote calls find it again ([`Monitor::client_at`]).
    pub fn connect(self: &Arc<Self>, kind: &'static str, peer: String, addr: Option<SocketAddr>) -> ClientGuard {
        let n = self.tables.len();
        let entry = Arc::new(ClientEntry {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            kind,
            peer,
            addr,
            since: Instant::now(),
            inserts: (0..n).map(|_| AtomicU64::new(0)).collect(),
            samples: (0..n).map(|_| AtomicU64::new(0)).collect(),
        });
        self.clients.lock().insert(entry.id, entry.clone());
        ClientGuard { monitor: self.clone(), entry }
    }

    /// The connected remote client at `addr`, if any.
    pub fn client_at(&self, addr: SocketAddr) -> Option<Arc<ClientEntry>> {
        self.clients.lock().values().find(|c| c.addr == Some(addr)).cloned()
    }

    /// Everything the dashboard shows, read now (see `docs/observability.md`).
    pub fn snapshot(&self) -> Value {
        let names: Vec<&str> = self.tables.iter().map(|t| t.name()).collect();
        let tables: Vec<Value> = self
            .tables
            .iter()
            .map(|t| {
                let mut v = info_json(&t.info());
                v["stats"] = t.stats();
                v
            })
            .collect();
        let per_table = |counts: &[AtomicU64]| -> Value {
            Value::Object(names.iter().zip(counts).map(|(n, c)| (n.to_string(), json!(c.load(Ordering::Relaxed)))).collect())
        };
        let clients: Vec<Value> = self
            .clients
            .lock()
            .values()
            .map(|c| {
                json!({
                    "id": c.id,
                    "kind": c.kind,
                    "peer": c.peer,
                    "connected_seconds": c.since.elapsed().as_secs_f64(),
                    "inserts": per_table(&c.inserts),
                    "samples": per_table(&c.samples),
                })
            })
            .collect();
        let time = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "time": time,
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "server": {"name": *self.local_name.lock(), "address": *self.remote_address.lock()},
            "tables": tables,
            "clients": clients,
            "bytes": {"received": self.bytes_received.load(Ordering::Relaxed), "sent": self.bytes_sent.load(Ordering::Relaxed)},
        })
    }
}

/// `Table.info()` as JSON, with the keys of the Python dict.
pub fn info_json(i: &TableInfo) -> Value {
    json!({
        "name": i.name,
        "size": i.size,
        "max_size": i.max_size,
        "max_times_sampled": i.max_times_sampled,
        "sampler": i.sampler,
        "remover": i.remover,
        "num_inserts": i.num_inserts,
        "num_samples": i.num_samples,
        "num_evictions": i.num_evictions,
        "num_deletes": i.num_deletes,
        "num_store_evictions": i.num_store_evictions,
        "rate_limiter": {
            "samples_per_insert": i.rate_limiter.samples_per_insert,
            "min_size_to_sample": i.rate_limiter.min_size_to_sample,
            "min_diff": finite(i.rate_limiter.min_diff),
            "max_diff": finite(i.rate_limiter.max_diff),
            "inserts": i.limiter_inserts,
            "samples": i.limiter_samples,
            "blocked_insert_seconds": i.blocked_insert_seconds,
            "blocked_sample_seconds": i.blocked_sample_seconds,
        },
        "version": i.version,
        "stale_removed": i.stale_removed,
        "stale_dropped": i.stale_dropped,
        "groups": i.groups,
        "attributes": i.attributes.iter().map(|(n, d)| (n.clone(), json!(d))).collect::<serde_json::Map<_, _>>(),
        "store": {"raw_bytes": i.store_raw_bytes, "stored_bytes": i.store_stored_bytes},
    })
}

/// JSON has no infinities: an unbounded limit is `null` (the Python client reads
/// it back as the infinity it was).
fn finite(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { Value::Null }
}

//! The remote service: tables over gRPC (`proto/reprise/v1/replay.proto`), with tonic.
//!
//! Each `Insert` stream owns one core [`Writer`] and applies its operations in order,
//! exactly as an in-process writer would: steps are checked whole before any is
//! written, and an item exists only once its `CreateItem` has been applied, so a
//! client that dies mid-stream leaves no partial item (its writer is dropped and its
//! blocks return). Blocking work (rate limiters, copies) runs on tokio's blocking
//! threads and gives up when the stream closes or the server stops.
//!
//! A sample goes out in parts of at most [`PART_BYTES`] (and `max_message_bytes`),
//! so no sample is refused for its size; its rows are copied once, from the store
//! into the outgoing message as tonic encodes it (`reprise_wire::sample`). Clients
//! may ask for zstd compression of each stream's messages; the server accepts it
//! and answers in kind.
//!
//! Security: a bearer token is required whenever the address is not loopback and is
//! checked on every call, and failed attempts are rate limited per peer address;
//! TLS from a PEM certificate and key; every message is bounded
//! (`max_message_bytes`), as are the items of one sample, the concurrent requests of
//! one connection and the connections per server and per peer; idle, stalled and
//! half-open connections are closed ([`crate::limits`]).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use reprise_wire::codes::to_status;
use reprise_wire::pb::{self, replay_server::Replay, replay_server::ReplayServer};
use reprise_core::error::{Error, Partial, Result};
use reprise_core::attributes::Attributes;
use reprise_core::{Collect, SampleBatch, Store, Table, Wait, Writer};
use tonic::codegen::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::checkpoint::Checkpointer;
use crate::limits::{Connections, Limits};
use crate::metrics::{self, Metrics};
use crate::monitor::Monitor;

/// HTTP/2 flow-control window of a stream (the connection's is twice that).
pub const WINDOW: u32 = 16 << 20;

/// Largest HTTP/2 frame either side accepts: large messages in few frames (the
/// default 16 KiB costs a frame header and a write entry per 16 KiB).
pub const FRAME: u32 = 1 << 20;

/// Most column bytes in one message of a sample sent in parts: a stream's window,
/// so a client that stops reading holds at most about two parts of server memory.
pub const PART_BYTES: usize = WINDOW as usize;

/// Bytes a sample's items take in its first message besides their rows (keys,
/// probabilities, priorities, times sampled, lengths: at most 8 + 8 + 8 + 5 + 5 each).
const ITEM_BYTES: usize = 34;

/// Settings of a [`RemoteServer`].
#[derive(Clone)]
pub struct RemoteServerOptions {
    /// Required unless the address is loopback; compared on every call.
    pub token: Option<String>,
    /// PEM certificate chain and private key: serve TLS.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// Largest request or response, bytes.
    pub max_message_bytes: usize,
    /// Most items one sample request may ask for.
    pub max_batch_items: u32,
    /// Most requests and streams in progress on one connection.
    pub max_concurrent_per_connection: usize,
    /// Runs a client's Checkpoint call (the built-in one:
    /// [`crate::checkpoint::to_directory`]).
    pub checkpoint: Option<Checkpointer>,
    /// `host:port` for Prometheus metrics over HTTP (`GET /metrics`); off loopback it
    /// needs the token too.
    pub metrics_address: Option<String>,
    /// Where connections and traffic are reported (shared with a local server over
    /// the same tables); None: a monitor of its own.
    pub monitor: Option<Arc<Monitor>>,
    /// Connections, timeouts and failed-token attempts ([`Limits`]).
    pub limits: Limits,
    /// HTTP/2 keepalive: a ping after this long without traffic; a connection whose
    /// peer does not answer within it too is closed (a half-open connection). None: off.
    pub keepalive: Option<Duration>,
}

impl Default for RemoteServerOptions {
    fn default() -> Self {
        RemoteServerOptions {
            token: None,
            tls: None,
            max_message_bytes: 64 << 20,
            max_batch_items: 1 << 16,
            max_concurrent_per_connection: 64,
            checkpoint: None,
            metrics_address: None,
            monitor: None,
            limits: Limits::default(),
            keepalive: Some(Duration::from_secs(30)),
        }
    }
}

struct Shared {
    tables: Vec<Table>,
    stores: Vec<Store>,
    table_store: Vec<u32>,
    options: RemoteServerOptions,
    stopping: AtomicBool,
    /// Set at shutdown: streams end at their next message boundary.
    shutdown: tokio::sync::watch::Sender<bool>,
    metrics: Arc<Metrics>,
    monitor: Arc<Monitor>,
    connections: Arc<Connections>,
}

impl Shared {
    /// Counts a request of `method`, and its error if it failed.
    fn count<T>(&self, method: &str, r: std::result::Result<T, Status>) -> std::result::Result<T, Status> {
        self.metrics.requests.with_label_values(&[method]).inc();
        if let Err(s) = &r {
            self.metrics.errors.with_label_values(&[method, &format!("{:?}", s.code())]).inc();
        }
        r
    }

    fn table(&self, name: &str) -> std::result::Result<&Table, Status> {
        self.tables.as_slice().table(name)
    }

}

/// A running gRPC service; [`RemoteServer::stop`] (or dropping it) shuts it down.
pub struct RemoteServer {
    address: SocketAddr,
    metrics_address: Option<SocketAddr>,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
    done: Option<oneshot::Receiver<()>>,
}

pub use reprise_wire::is_loopback;

impl RemoteServer {
    /// Serves `tables` at `address` (`host:port`; port 0 picks a free one).
    pub fn start(tables: Vec<Table>, address: &str, options: RemoteServerOptions) -> Result<RemoteServer> {
        let (stores, table_store) = crate::stores_of(&tables)?;
        if options.token.as_deref().is_some_and(str::is_empty) {
            return Err(Error::InvalidArgument("token must not be empty".into()));
        }
        if options.token.is_none() && !is_loopback(address) {
            return Err(Error::InvalidArgument(format!(
                "address {address:?} is not loopback: a token is required (pass token=...; clients send it as a bearer token)"
            )));
        }
        if options.max_message_bytes < 4096 || options.max_batch_items == 0 || options.max_concurrent_per_connection == 0 {
            return Err(Error::InvalidArgument("max_message_bytes must be >= 4096 and the other limits >= 1".into()));
        }
        let l = &options.limits;
        if l.max_connections == 0 || l.max_connections_per_peer == 0 || l.auth_failures_per_minute == 0 {
            return Err(Error::InvalidArgument(format!(
                "max_connections, max_connections_per_peer and auth_failures_per_minute must be >= 1, got {}, {} and {}",
                l.max_connections, l.max_connections_per_peer, l.auth_failures_per_minute
            )));
        }
        for (name, d) in [("idle_timeout", l.idle_timeout), ("stall_timeout", l.stall_timeout), ("keepalive", options.keepalive)] {
            if d.is_some_and(|d| d < Duration::from_secs(1)) {
                return Err(Error::InvalidArgument(format!("{name} must be at least 1 second (or None: off), got {d:?}")));
            }
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("reprise-grpc")
            .enable_all()
            .build()
            .map_err(|e| Error::Io(format!("cannot start the gRPC runtime: {e}")))?;
        let addr: SocketAddr = match address.parse() {
            Ok(a) => a,
            Err(_) => std::net::ToSocketAddrs::to_socket_addrs(address)
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| Error::InvalidArgument(format!("address {address:?}: expected host:port")))?,
        };
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(addr))
            .map_err(|e| Error::InvalidArgument(format!("cannot listen on {address}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| Error::Io(e.to_string()))?;
        let mut builder = tonic::transport::Server::builder()
            .concurrency_limit_per_connection(options.max_concurrent_per_connection)
            .max_concurrent_streams(options.max_concurrent_per_connection as u32)
            // Large windows: a 1 MB insert message must not wait for WINDOW_UPDATE round trips.
            .initial_stream_window_size(Some(WINDOW))
            .initial_connection_window_size(Some(2 * WINDOW))
            .max_frame_size(Some(FRAME))
            .http2_keepalive_interval(options.keepalive)
            .http2_keepalive_timeout(options.keepalive)
            .tcp_nodelay(true);
        if let Some((cert, key)) = &options.tls {
            let identity = tonic::transport::Identity::from_pem(cert, key);
            builder = builder
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .map_err(|e| Error::InvalidArgument(format!("TLS certificate or key: {e}")))?;
        }
        let metrics = Arc::new(Metrics::new(tables.clone()));
        let mut metrics_address = None;
        if let Some(m) = &options.metrics_address {
            if options.token.is_none() && !is_loopback(m) {
                return Err(Error::InvalidArgument(format!("metrics_address {m:?} is not loopback: a token is required")));
            }
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind(m.as_str()))
                .map_err(|e| Error::InvalidArgument(format!("cannot listen on metrics_address {m}: {e}")))?;
            metrics_address = Some(listener.local_addr().map_err(|e| Error::Io(e.to_string()))?);
            runtime.spawn(metrics::serve(listener, metrics.clone(), options.token.clone()));
        }
        let monitor = options.monitor.clone().unwrap_or_else(|| Monitor::new(tables.clone()));
        monitor.set_remote_address(&bound.to_string());
        let connections = Connections::new(options.limits.clone(), metrics.clone());
        runtime.spawn(connections.clone().reaper());
        let shared = Arc::new(Shared {
            tables,
            stores,
            table_store,
            options: options.clone(),
            stopping: AtomicBool::new(false),
            shutdown: tokio::sync::watch::channel(false).0,
            metrics,
            monitor: monitor.clone(),
            connections: connections.clone(),
        });
        let service = ReplayServer::new(Service { shared: shared.clone() })
            .max_decoding_message_size(options.max_message_bytes)
            .max_encoding_message_size(options.max_message_bytes)
            .accept_compressed(tonic::codec::CompressionEncoding::Zstd)
            .send_compressed(tonic::codec::CompressionEncoding::Zstd);
        let token = options.token.clone();
        let conns = connections.clone();
        let service = tonic::service::interceptor::InterceptedService::new(service, move |req: Request<()>| {
            check_token(token.as_deref(), &req, &conns)?;
            Ok(req)
        });
        let (tx, rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel::<()>();
        // Nodelay on every accepted socket (the builder's setting only reaches listeners
        // tonic binds itself): without it small replies wait ~40 ms for delayed ACKs.
        // Connections past the limits are closed as they arrive (and logged).
        use tokio_stream::StreamExt as _;
        let incoming = tonic::transport::server::TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(options.keepalive)
            .filter_map(move |conn| match conn {
                Ok(stream) => match connections.admit(stream, &monitor) {
                    Ok(c) => Some(Ok(c)),
                    Err(why) => {
                        tracing::warn!(target: "reprise", "{why}");
                        None
                    }
                },
                Err(e) => Some(Err(e)),
            });
        let router = builder.add_service(service);
        runtime.spawn(async move {
            let _ = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
            let _ = done_tx.send(());
        });
        Ok(RemoteServer { address: bound, metrics_address, shared, shutdown: Some(tx), runtime: Some(runtime), done: Some(done_rx) })
    }

    /// `host:port` the service listens on.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// `host:port` of the metrics endpoint, when there is one.
    pub fn metrics_address(&self) -> Option<String> {
        self.metrics_address.map(|a| a.to_string())
    }

    /// Stops accepting calls, lets the calls in progress finish (up to `grace`;
    /// blocked waits give up at once), then closes every connection.
    pub fn stop(&mut self, grace: Duration) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.shutdown.send_replace(true);
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let (Some(rt), Some(done)) = (self.runtime.as_ref(), self.done.take()) {
            let _ = rt.block_on(async { tokio::time::timeout(grace, done).await });
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_millis(100));
        }
    }
}

impl Drop for RemoteServer {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Refuses a call whose `authorization` metadata is not the server's token
/// ([`crate::auth`]), counting and logging the failure per peer address.
fn check_token(expected: Option<&str>, req: &Request<()>, connections: &Connections) -> std::result::Result<(), Status> {
    let peer = req.remote_addr();
    connections.touch(peer);
    if expected.is_none() {
        return Ok(());
    }
    let header = req.metadata().get("authorization").map(|v| v.as_bytes());
    crate::auth::check(expected, header).map_err(|r| Status::unauthenticated(connections.failed_authentication(peer, r.message())))
}

struct Service {
    shared: Arc<Shared>,
}

fn timeout_of(seconds: f64) -> std::result::Result<Option<Duration>, Status> {
    if seconds.is_nan() {
        return Err(Status::invalid_argument("timeout_seconds must be a number, got NaN"));
    }
    Ok(if seconds < 0.0 || seconds.is_infinite() { None } else { Some(Duration::from_secs_f64(seconds)) })
}

/// Runs blocking work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> std::result::Result<T, Status> + Send + 'static) -> std::result::Result<T, Status> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Status::internal(format!("server task failed: {e}")))?
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = std::result::Result<T, Status>> + Send>>;

/// The next message of a client stream, or `UNAVAILABLE` once the server is stopping.
async fn next_message<T>(inbound: &mut Streaming<T>, stop: &mut tokio::sync::watch::Receiver<bool>) -> std::result::Result<Option<T>, Status> {
    tokio::select! {
        m = inbound.message() => m,
        _ = stop.wait_for(|s| *s) => Err(Status::unavailable("the replay server is shutting down")),
    }
}

/// The writer of one insert stream and what it has done since the last response.
/// Public so the fuzz target can drive exactly the server's checks.
pub struct InsertSession {
    writer: Writer,
    timeout: Option<Duration>,
    keys: Vec<u64>,
    /// The table that named the store (the metrics' label for its bytes).
    table: String,
    /// Items created since last taken, per table name (the monitor's per-client counts).
    created: Vec<(String, u64)>,
}

/// Looks tables up by name, with the error the service answers.
pub trait TableLookup {
    fn table(&self, name: &str) -> std::result::Result<&Table, Status>;
}

impl TableLookup for Shared {
    fn table(&self, name: &str) -> std::result::Result<&Table, Status> {
        Shared::table(self, name)
    }
}

impl TableLookup for [Table] {
    fn table(&self, name: &str) -> std::result::Result<&Table, Status> {
        self.iter().find(|t| t.name() == name).ok_or_else(|| {
            let names: Vec<&str> = self.iter().map(|t| t.name()).collect();
            Status::not_found(format!("no table named '{name}'; this server has {names:?}"))
        })
    }
}

impl InsertSession {
    /// A session writing into the store of `table` (what an `Insert` stream's first message asks for).
    pub fn open(tables: &(impl TableLookup + ?Sized), first: &pb::InsertRequest) -> std::result::Result<InsertSession, Status> {
        let table = tables.table(&first.table)?;
        let msl = (first.max_sequence_length > 0).then_some(u64::from(first.max_sequence_length));
        let timeout = timeout_of(first.timeout_seconds)?;
        let writer = Writer::new(table.store().clone(), msl).map_err(to_status)?;
        Ok(InsertSession { writer, timeout, keys: Vec::new(), table: first.table.clone(), created: Vec::new() })
    }

    fn count_created(&mut self, table: &str, n: u64) {
        match self.created.iter_mut().find(|(t, _)| t == table) {
            Some((_, c)) => *c += n,
            None => self.created.push((table.to_string(), n)),
        }
    }

    /// The items created since the last call, per table name.
    pub fn take_created(&mut self) -> Vec<(String, u64)> {
        std::mem::take(&mut self.created)
    }

    /// Applies `ops` in order; returns the responses its flushes ask for.
    pub fn apply(
        &mut self,
        shared: &(impl TableLookup + ?Sized),
        ops: Vec<pb::InsertOp>,
        closed: &(dyn Fn() -> bool + Sync),
    ) -> std::result::Result<Vec<pb::InsertResponse>, Status> {
        let mut out = Vec::new();
        for op in ops {
            match op.op {
                Some(pb::insert_op::Op::Steps(steps)) => {
                    let sig = self.writer.store().signature();
                    if steps.columns.len() != sig.len() {
                        return Err(Status::invalid_argument(format!(
                            "steps: {} columns, expected one per field of the signature ({})",
                            steps.columns.len(),
                            sig.describe()
                        )));
                    }
                    let n = steps.num_steps as usize;
                    if n == 0 {
                        return Err(Status::invalid_argument("steps: num_steps must be >= 1"));
                    }
                    for (col, f) in steps.columns.iter().zip(sig.fields()) {
                        let want = n.saturating_mul(f.row_bytes());
                        if col.len() != want {
                            return Err(Status::invalid_argument(format!(
                                "steps: field '{}' has {} bytes for {n} steps; expected {want} ({} per step: {})",
                                f.name,
                                col.len(),
                                f.row_bytes(),
                                f.describe()
                            )));
                        }
                    }
                    let cols: Vec<&[u8]> = steps.columns.iter().map(|c| c.as_ref()).collect();
                    self.writer.extend(&cols, n, Wait { timeout: self.timeout, interrupt: Some(closed) }).map_err(to_status)?;
                }
                Some(pb::insert_op::Op::CreateItem(item)) => {
                    let table = shared.table(&item.table)?;
                    let wait = Wait { timeout: self.timeout, interrupt: Some(closed) };
                    let key = self.writer.create_item(table, u64::from(item.num_steps), item.priority, &item.attributes, wait).map_err(to_status)?;
                    self.keys.push(key);
                    self.count_created(&item.table, 1);
                }
                Some(pb::insert_op::Op::CreateItems(items)) => {
                    let table = shared.table(&items.table)?;
                    let wait = Wait { timeout: self.timeout, interrupt: Some(closed) };
                    let keys = self.writer.create_items(table, u64::from(items.num_steps), &items.priorities, &items.attributes, wait).map_err(to_status)?;
                    self.count_created(&items.table, keys.len() as u64);
                    self.keys.extend(keys);
                }
                Some(pb::insert_op::Op::EndEpisode(_)) => self.writer.end_episode(),
                Some(pb::insert_op::Op::Flush(f)) => {
                    // A durable store answers a flush once its items are on disk.
                    self.writer.store().commit().map_err(to_status)?;
                    out.push(pb::InsertResponse { flush_id: f.id, keys: std::mem::take(&mut self.keys) })
                }
                None => return Err(Status::invalid_argument("insert: an operation with no kind set")),
            }
        }
        Ok(out)
    }
}

/// The messages of a drawn batch: its items and the chosen columns, `[n, T, row]`
/// each, zero past an item's length, in parts of at most `part_bytes` column bytes
/// (whole items where they fit; an item larger than a part is split by column and
/// byte). The rows stay in the store until tonic encodes each part.
pub fn sample_parts(mut batch: SampleBatch, fields: &[usize], partial: bool, part_bytes: usize, schema: &Attributes) -> Vec<pb::SampleResponse> {
    let t = batch.max_length();
    let n = batch.len();
    let records = std::mem::take(&mut batch.attributes);
    let first = pb::SampleResponse {
        keys: batch.items.iter().map(|i| i.key).collect(),
        probabilities: batch.items.iter().map(|i| i.probability).collect(),
        priorities: batch.items.iter().map(|i| i.priority).collect(),
        times_sampled: batch.items.iter().map(|i| i.times_sampled).collect(),
        table_size: batch.table_size,
        lengths: batch.items.iter().map(|i| i.length).collect(),
        max_length: t,
        fields: fields.iter().map(|&c| batch.store().signature().fields()[c].name.clone()).collect(),
        columns: Vec::new(),
        partial,
        more: false,
        attributes: schema.columns(&records, n).into_iter().map(Bytes::from).collect(),
    };
    let strides: Vec<usize> = fields.iter().map(|&c| t as usize * batch.store().columns().sample_bytes(c)).collect();
    let item_bytes: usize = strides.iter().sum();
    let batch = Arc::new(batch);
    let rows = |items: std::ops::Range<usize>| -> Vec<pb::Column> {
        fields.iter().map(|&column| pb::Column::Rows(pb::Rows { batch: batch.clone(), column, t_max: t, items: items.clone() })).collect()
    };
    let mut parts = vec![first];
    if n == 0 {
        parts[0].columns = rows(0..0);
    }
    // The first part takes the first columns; each later set of columns is a part.
    let put = |parts: &mut Vec<pb::SampleResponse>, columns: Vec<pb::Column>| match parts.last_mut() {
        Some(p) if p.columns.is_empty() => p.columns = columns,
        _ => parts.push(pb::SampleResponse { columns, ..Default::default() }),
    };
    let mut at = 0;
    while at < n {
        let fit = part_bytes.checked_div(item_bytes).unwrap_or(n).max(1).min(n - at);
        if item_bytes * fit <= part_bytes || item_bytes == 0 {
            put(&mut parts, rows(at..at + fit));
            at += fit;
            continue;
        }
        // One item larger than a part: each column in byte slices, the others empty.
        for (f, &column) in fields.iter().enumerate() {
            let mut bytes = Vec::with_capacity(strides[f]);
            batch.for_each_slice(column, t, at..at + 1, |s| bytes.extend_from_slice(s));
            let bytes = tonic::codegen::Bytes::from(bytes);
            for start in (0..bytes.len()).step_by(part_bytes) {
                let mut columns = vec![pb::Column::Bytes(Default::default()); fields.len()];
                columns[f] = pb::Column::Bytes(bytes.slice(start..(start + part_bytes).min(bytes.len())));
                put(&mut parts, columns);
            }
        }
        at += 1;
    }
    let last = parts.len() - 1;
    for p in &mut parts[..last] {
        p.more = true;
    }
    parts
}

#[tonic::async_trait]
impl Replay for Service {
    async fn get_layout(&self, _: Request<pb::GetLayoutRequest>) -> std::result::Result<Response<pb::Layout>, Status> {
        let s = &self.shared;
        s.metrics.requests.with_label_values(&["GetLayout"]).inc();
        let stores = s
            .stores
            .iter()
            .map(|st| pb::Store {
                fields: st
                    .signature()
                    .fields()
                    .iter()
                    .map(|f| pb::Field {
                        name: f.name.clone(),
                        dtype: f.dtype.name().into(),
                        shape: f.shape.iter().map(|&d| d as u64).collect(),
                        stack: f.stack,
                        padding: if f.stack > 1 { f.padding.name().into() } else { String::new() },
                    })
                    .collect(),
                capacity: st.capacity(),
                block_steps: st.block_steps(),
            })
            .collect();
        let tables = s.tables.iter().zip(&s.table_store).map(|(t, &store)| pb::TableLayout { name: t.name().into(), store }).collect();
        Ok(Response::new(pb::Layout {
            stores,
            tables,
            max_message_bytes: s.options.max_message_bytes as u64,
            max_batch_items: s.options.max_batch_items,
            protocol_version: pb::PROTOCOL_VERSION,
        }))
    }

    type InsertStream = Stream<pb::InsertResponse>;

    async fn insert(&self, req: Request<Streaming<pb::InsertRequest>>) -> std::result::Result<Response<Self::InsertStream>, Status> {
        let client = req.remote_addr().and_then(|a| self.shared.monitor.client_at(a));
        let call = self.shared.connections.call(req.remote_addr());
        let mut inbound = req.into_inner();
        let shared = self.shared.clone();
        let (tx, rx) = mpsc::channel::<std::result::Result<pb::InsertResponse, Status>>(16);
        tokio::spawn(async move {
            let _call = call;
            let mut writer: Option<Arc<Mutex<InsertSession>>> = None;
            let mut stop = shared.shutdown.subscribe();
            loop {
                let msg = match next_message(&mut inbound, &mut stop).await {
                    Ok(Some(m)) => m,
                    Ok(None) => break, // the client finished (or died: its writer is dropped below)
                    Err(status) => {
                        // Undecodable or oversized: say so (if the client still listens) and end.
                        let _ = tx.send(shared.count("Insert", Err(status))).await;
                        break;
                    }
                };
                let w = match &writer {
                    Some(w) => w.clone(),
                    None => {
                        match InsertSession::open(shared.as_ref(), &msg).map(|s| Arc::new(Mutex::new(s))) {
                            Ok(w) => {
                                writer = Some(w.clone());
                                w
                            }
                            Err(status) => {
                                let _ = tx.send(shared.count("Insert", Err(status))).await;
                                break;
                            }
                        }
                    }
                };
                let (sh, tx2, client) = (shared.clone(), tx.clone(), client.clone());
                let bytes: usize = msg
                    .ops
                    .iter()
                    .map(|op| match &op.op {
                        Some(pb::insert_op::Op::Steps(st)) => st.columns.iter().map(|c| c.len()).sum(),
                        _ => 0,
                    })
                    .sum();
                let result = blocking(move || {
                    let closed = || tx2.is_closed() || sh.stopping.load(Ordering::Relaxed);
                    let mut w = w.lock();
                    let r = w.apply(sh.as_ref(), msg.ops, &closed);
                    sh.metrics.bytes_received.with_label_values(&[w.table.as_str()]).inc_by(bytes as u64);
                    sh.monitor.bytes_received.fetch_add(bytes as u64, Ordering::Relaxed);
                    for (table, n) in w.take_created() {
                        if let (Some(c), Some(i)) = (&client, sh.monitor.table_index(&table)) {
                            c.inserted(i, n);
                        }
                    }
                    r
                })
                .await;
                let result = shared.count("Insert", result);
                match result {
                    Ok(responses) => {
                        for r in responses {
                            if tx.send(Ok(r)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                }
            }
            // Dropping the writer gives its blocks back; committed items stay.
            if let Some(w) = writer {
                let _ = tokio::task::spawn_blocking(move || w.lock().writer.close()).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type SampleStream = Stream<pb::SampleResponse>;

    async fn sample(&self, req: Request<Streaming<pb::SampleRequest>>) -> std::result::Result<Response<Self::SampleStream>, Status> {
        let peer = req.remote_addr();
        let client = peer.and_then(|a| self.shared.monitor.client_at(a));
        let call = self.shared.connections.call(peer);
        let mut inbound = req.into_inner();
        let shared = self.shared.clone();
        let (tx, rx) = mpsc::channel::<std::result::Result<pb::SampleResponse, Status>>(4);
        tokio::spawn(async move {
            let mut stop = shared.shutdown.subscribe();
            let stall = shared.options.limits.stall_timeout;
            'stream: loop {
                let msg = match next_message(&mut inbound, &mut stop).await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(status) => {
                        let _ = tx.send(shared.count("Sample", Err(status))).await;
                        break;
                    }
                };
                let table_name = msg.table.clone();
                let (sh, tx2) = (shared.clone(), tx.clone());
                let result = blocking(move || {
                    let table = sh.table(&msg.table)?.clone();
                    // A token budget draws at most as many items as the server's largest batch.
                    let n = if msg.tokens > 0 { sh.options.max_batch_items } else { msg.num_items };
                    if n == 0 || n > sh.options.max_batch_items {
                        return Err(Status::invalid_argument(format!(
                            "num_items must be from 1 to {} (the server's max_batch_items), got {n}",
                            sh.options.max_batch_items
                        )));
                    }
                    let sig = table.store().signature();
                    let fields = sig.select(&msg.fields).map_err(to_status)?;
                    let timeout = timeout_of(msg.timeout_seconds)?;
                    let closed = || tx2.is_closed() || sh.stopping.load(Ordering::Relaxed);
                    let max = sh.options.max_message_bytes;
                    // The items' keys, priorities... travel in one message: refuse before drawing.
                    let names: usize = fields.iter().map(|&c| sig.fields()[c].name.len() + 8).sum();
                    let head = n as usize * ITEM_BYTES + names + 1024;
                    if head > max {
                        return Err(Status::resource_exhausted(format!(
                            "a sample of {n} items needs {head} bytes for the items' keys, priorities and lengths alone, more than the server's max_message_bytes ({max}); ask for fewer items"
                        )));
                    }
                    let part = (max - head).min(PART_BYTES);
                    let wait = Wait { timeout, interrupt: Some(&closed) };
                    let schema = &table.config().attributes;
                    let drawn = if msg.tokens > 0 { table.sample_tokens(msg.tokens, wait) } else { table.sample(n as usize, wait) };
                    match drawn {
                        Ok(batch) => Ok(sample_parts(batch, &fields, false, part, schema)),
                        Err(Error::Timeout { partial: Partial::Sampled(batch), .. }) => Ok(sample_parts(batch.into_batch(), &fields, true, part, schema)),
                        Err(Error::Timeout { .. }) => Ok(vec![pb::SampleResponse { partial: true, ..Default::default() }]),
                        Err(e) => Err(to_status(e)),
                    }
                })
                .await;
                let parts = match shared.count("Sample", result) {
                    Ok(parts) => parts,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                };
                let sent: usize = parts.iter().map(pb::SampleResponse::column_bytes).sum();
                shared.metrics.bytes_sent.with_label_values(&[table_name.as_str()]).inc_by(sent as u64);
                shared.monitor.bytes_sent.fetch_add(sent as u64, Ordering::Relaxed);
                if let (Some(c), Some(i)) = (&client, shared.monitor.table_index(&table_name)) {
                    c.sampled(i, parts[0].keys.len() as u64);
                }
                for part in parts {
                    let sending = tx.send(Ok(part));
                    let sent = match stall {
                        Some(limit) => match tokio::time::timeout(limit, sending).await {
                            Ok(r) => r,
                            Err(_) => {
                                // The client has not taken a part for stall_timeout: its
                                // connection ends, and with it every row this stream holds.
                                tracing::warn!(target: "reprise", "closing the connection from {}: its sample stream has not been read for {:.0} s (stall_timeout)", peer.map_or("?".into(), |p| p.to_string()), limit.as_secs_f64());
                                shared.connections.refused("stall_timeout");
                                if let Some(c) = &call {
                                    c.end_connection("stall_timeout");
                                }
                                break 'stream;
                            }
                        },
                        None => sending.await,
                    };
                    if sent.is_err() {
                        break 'stream;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn update_priorities(&self, req: Request<pb::UpdatePrioritiesRequest>) -> std::result::Result<Response<pb::CountResponse>, Status> {
        let shared = self.shared.clone();
        let m = req.into_inner();
        let sh = shared.clone();
        let count = blocking(move || {
            let table = shared.table(&m.table)?;
            if m.keys.len() != m.priorities.len() {
                return Err(Status::invalid_argument(format!(
                    "{} keys but {} priorities; expected one priority per key",
                    m.keys.len(),
                    m.priorities.len()
                )));
            }
            table.update_priorities(&m.keys, &m.priorities).map_err(to_status)
        })
        .await;
        let count = sh.count("UpdatePriorities", count)?;
        Ok(Response::new(pb::CountResponse { count: count as u64 }))
    }

    async fn set_version(&self, req: Request<pb::SetVersionRequest>) -> std::result::Result<Response<pb::CountResponse>, Status> {
        let shared = self.shared.clone();
        let m = req.into_inner();
        let sh = shared.clone();
        let count = blocking(move || shared.table(&m.table)?.set_version(m.version).map_err(to_status)).await;
        let count = sh.count("SetVersion", count)?;
        Ok(Response::new(pb::CountResponse { count }))
    }

    async fn update_attribute(&self, req: Request<pb::UpdateAttributeRequest>) -> std::result::Result<Response<pb::CountResponse>, Status> {
        let shared = self.shared.clone();
        let m = req.into_inner();
        let sh = shared.clone();
        let count = blocking(move || shared.table(&m.table)?.update_attribute(&m.keys, &m.name, &m.values).map_err(to_status)).await;
        let count = sh.count("UpdateAttribute", count)?;
        Ok(Response::new(pb::CountResponse { count: count as u64 }))
    }

    async fn delete(&self, req: Request<pb::DeleteRequest>) -> std::result::Result<Response<pb::CountResponse>, Status> {
        let shared = self.shared.clone();
        let m = req.into_inner();
        let sh = shared.clone();
        let count = blocking(move || Ok(shared.table(&m.table)?.delete(&m.keys))).await;
        let count = sh.count("Delete", count)?;
        Ok(Response::new(pb::CountResponse { count: count as u64 }))
    }

    async fn reset(&self, req: Request<pb::ResetRequest>) -> std::result::Result<Response<pb::ResetResponse>, Status> {
        let shared = self.shared.clone();
        let m = req.into_inner();
        let sh = shared.clone();
        let r = blocking(move || {
            shared.table(&m.table)?.reset();
            Ok(())
        })
        .await;
        sh.count("Reset", r)?;
        Ok(Response::new(pb::ResetResponse {}))
    }

    async fn info(&self, _: Request<pb::InfoRequest>) -> std::result::Result<Response<pb::InfoResponse>, Status> {
        self.shared.metrics.requests.with_label_values(&["Info"]).inc();
        let tables = self.shared.tables.iter().map(|t| pb::TableInfo::from(t.info())).collect();
        Ok(Response::new(pb::InfoResponse { tables }))
    }

    async fn snapshot(&self, _: Request<pb::SnapshotRequest>) -> std::result::Result<Response<pb::SnapshotResponse>, Status> {
        let shared = self.shared.clone();
        let r = blocking(move || Ok(pb::SnapshotResponse { json: shared.monitor.snapshot().to_string() })).await;
        self.shared.count("Snapshot", r).map(Response::new)
    }

    async fn checkpoint(&self, _: Request<pb::CheckpointRequest>) -> std::result::Result<Response<pb::CheckpointResponse>, Status> {
        let Some(f) = self.shared.options.checkpoint.clone() else {
            let e = Status::invalid_argument("this server has no checkpoint directory: start it with checkpoint_dir");
            return self.shared.count("Checkpoint", Err(e));
        };
        let path = self.shared.count("Checkpoint", blocking(move || f().map_err(to_status)).await)?;
        Ok(Response::new(pb::CheckpointResponse { path }))
    }
}

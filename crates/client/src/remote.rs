//! The remote client: tables of a `reprise serve` / `rp.Server(address=...)` over gRPC.
//!
//! A blocking API over a small tokio runtime owned by the client. Writers batch their
//! operations (steps column-wise, item creations) into messages and send them on
//! their own `Insert` stream; `flush` waits until the server has applied everything
//! sent. Samples go through one `Sample` stream per client (reopened if it breaks);
//! a batch may arrive in parts, which [`RemoteSample`] keeps as received (the
//! columns are joined once, into the caller's arrays). Messages are compressed
//! (zstd) when [`RemoteOptions::compression`] says so: by default off loopback only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use reprise_core::error::{Error, Result};
use reprise_core::{DType, Field, Signature, StackPadding, TableInfo};
use reprise_wire::codes::from_status;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status, Streaming};

use crate::pb::{self, replay_client::ReplayClient as GrpcStub};
use reprise_core::wait::SlowWait;

use crate::{check_priority_pairs, check_sample_size, explain_wait, Drawn, Interrupt, ReplayClient, Sampler, StepWriter, POLL};
use reprise_core::Wait;

/// Bytes of queued operations that make a writer send a message.
const SEND_BYTES: usize = 1 << 20;
/// Queued operations that make a writer send a message.
const SEND_OPS: usize = 1024;
/// Most items one sample request may ask for (the server may allow fewer).
const MAX_ITEMS: u32 = 1 << 20;

#[derive(Clone)]
struct Auth(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Stub = GrpcStub<InterceptedService<Channel, Auth>>;

/// How to reach a server.
#[derive(Clone, Default)]
pub struct RemoteOptions {
    pub token: Option<String>,
    /// Use TLS, trusting this PEM CA certificate (`None`: the system's roots).
    pub tls: bool,
    pub ca_pem: Option<Vec<u8>>,
    /// The name the server's certificate is checked against (default: the host).
    pub domain: Option<String>,
    pub connect_timeout: Option<Duration>,
    /// zstd-compress every message both ways: None (the default) does so when the
    /// address is not loopback, where bandwidth is scarcer than cores.
    pub compression: Option<bool>,
}

/// A connection to a remote replay server. Cheap to share between threads.
pub struct RemoteClient {
    rt: Arc<tokio::runtime::Runtime>,
    stub: Stub,
    layout: pb::Layout,
    /// The signature of each store of `layout`, read once at connect.
    signatures: Vec<Signature>,
    address: String,
    sampler: Mutex<Option<SampleStream>>,
}

struct SampleStream {
    tx: mpsc::Sender<pb::SampleRequest>,
    rx: Streaming<pb::SampleResponse>,
}

/// A drawn batch from a remote table: per field `[n, T, row]` bytes, zero past each
/// length, as the parts it arrived in.
pub struct RemoteSample {
    /// The first part: the items, the fields and the first bytes of each column.
    pub response: pb::SampleResponse,
    /// The parts after the first (a batch larger than one message).
    pub parts: Vec<pb::SampleResponse>,
}

impl RemoteSample {
    /// The bytes of field number `f` (of `response.fields`), in order.
    pub fn chunks(&self, f: usize) -> impl Iterator<Item = &[u8]> {
        std::iter::once(&self.response).chain(&self.parts).filter_map(move |p| p.columns.get(f)).filter_map(|c| c.bytes().map(|b| b.as_ref()))
    }
}

/// Reads the parts of one batch (up to the one without `more`), checking that the
/// columns add up to no more than `[n, T, row]` of `signature`'s fields.
async fn receive(rx: &mut Streaming<pb::SampleResponse>, signature: &Signature) -> Result<RemoteSample> {
    let first = match rx.message().await {
        Ok(Some(r)) => r,
        Ok(None) => return Err(lost("the sample stream ended")),
        Err(s) => return Err(from_status(s)),
    };
    let mut sample = RemoteSample { response: first, parts: Vec::new() };
    let r = &sample.response;
    let expected: usize = r
        .fields
        .iter()
        .map(|name| {
            let i = signature.index_of(name).ok_or_else(|| Error::Corrupt(format!("the server sent unknown field '{name}'")))?;
            Ok(r.keys.len() * r.max_length as usize * signature.fields()[i].sample_bytes())
        })
        .sum::<Result<usize>>()?;
    let mut got = r.column_bytes();
    let mut more = r.more;
    while more {
        let part = match rx.message().await {
            Ok(Some(p)) => p,
            Ok(None) => return Err(lost("the sample stream ended in the middle of a batch")),
            Err(s) => return Err(from_status(s)),
        };
        got += part.column_bytes();
        if got > expected || part.columns.len() > r.fields.len() {
            return Err(Error::Corrupt(format!("the server sent more than the {expected} bytes of a batch of {} items", r.keys.len())));
        }
        more = part.more;
        sample.parts.push(part);
    }
    Ok(sample)
}

/// A remote answer as a draw: a response marked partial was cut short by its timeout.
fn drawn(sample: RemoteSample, request: &pb::SampleRequest) -> Drawn<RemoteSample> {
    let response = &sample.response;
    let cut_short = response.partial.then(|| Error::Timeout {
        message: format!(
            "sample from '{}' timed out after {} s with {} of {} items drawn",
            request.table,
            request.timeout_seconds,
            response.keys.len(),
            request.num_items
        ),
        partial: Default::default(),
    });
    Drawn { sample, cut_short }
}

/// Who a long wait asks why, once it has waited past `slow_wait`: the server's
/// figures for `table` (a sample of `want`), or for every table (a flush).
struct Slow<'a> {
    stub: &'a Stub,
    server: &'a str,
    table: Option<&'a str>,
    want: u64,
}

/// Runs `fut` on `rt`, giving up at `deadline` (Timeout) or when `interrupt` says
/// so. With `slow`, a wait past `slow_wait` says once what the server waits for.
fn wait_for<T>(
    rt: &tokio::runtime::Runtime,
    fut: impl std::future::Future<Output = Result<T>>,
    deadline: Option<Instant>,
    interrupt: Interrupt<'_>,
    what: &str,
    slow: Option<Slow<'_>>,
) -> Result<T> {
    rt.block_on(async {
        tokio::pin!(fut);
        let mut clock = SlowWait::start();
        loop {
            let wake = [deadline, Some(Instant::now() + POLL), slow.as_ref().and(clock.due())].into_iter().flatten().min();
            let step = wake.map_or(POLL, |w| w.saturating_duration_since(Instant::now()));
            match tokio::time::timeout(step, &mut fut).await {
                Ok(r) => return r,
                Err(_) => {
                    if interrupt.is_some_and(|f| f()) {
                        return Err(Error::Interrupted { partial: Default::default() });
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Error::Timeout { message: format!("{what} timed out"), partial: Default::default() });
                    }
                    if let Some(s) = slow.as_ref().filter(|_| clock.is_due()) {
                        let asked = tokio::time::timeout(Duration::from_secs(2), s.stub.clone().info(pb::InfoRequest {})).await;
                        let message = match asked {
                            Ok(Ok(r)) => {
                                let infos: Vec<TableInfo> = r.into_inner().tables.into_iter().map(TableInfo::from).collect();
                                explain_wait(what, s.server, clock.elapsed(), &infos, s.table, s.want)
                            }
                            _ => format!(
                                "{what} has waited {:.1} s for the replay server at {}, which does not answer an info request",
                                clock.elapsed().as_secs_f64(),
                                s.server
                            ),
                        };
                        clock.say(&message);
                    }
                }
            }
        }
    })
}

/// When `address` answers plain HTTP (a dashboard or metrics port, not the replay
/// service), the error that says so; None when it does not (or cannot be asked:
/// a TLS address, nothing listening). Asked only after a connection failed.
fn not_the_replay_service(address: &str, tls: bool) -> Option<Error> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    if tls {
        return None;
    }
    let to = address.to_socket_addrs().ok()?.next()?;
    let mut stream = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(format!("GET / HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).ok()?;
    let head = String::from_utf8_lossy(&head[..n]);
    let status = head.lines().next().filter(|l| l.starts_with("HTTP/1."))?.trim().to_string();
    Some(Error::InvalidArgument(format!(
        "{address} answers HTTP ('{status}'), not the replay service: it looks like a server's dashboard or metrics \
         port (dashboard_address / metrics_address). Connect to the replay address instead: `server.address` in \
         Python, or the 'at host:port' that `reprise serve` prints first"
    )))
}

fn lost(e: impl std::fmt::Display) -> Error {
    Error::Io(format!("connection to the replay server lost: {e}"))
}

impl RemoteClient {
    /// Connects to `address` (`host:port`) and reads the server's layout.
    pub fn connect(address: &str, options: RemoteOptions) -> Result<RemoteClient> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("reprise-client")
            .enable_all()
            .build()
            .map_err(|e| Error::Io(format!("cannot start the client runtime: {e}")))?;
        let port_ok = address.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if address.contains("://") || address.contains('/') || !port_ok {
            return Err(Error::InvalidArgument(format!(
                "address {address:?}: expected 'host:port' for a remote server (or 'unix:///path' for a local one)"
            )));
        }
        let scheme = if options.tls { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| Error::InvalidArgument(format!("address {address:?}: expected host:port ({e})")))?
            .connect_timeout(options.connect_timeout.unwrap_or(Duration::from_secs(10)))
            .initial_stream_window_size(Some(16 << 20))
            .initial_connection_window_size(Some(32 << 20))
            .max_frame_size(1 << 20)
            .tcp_nodelay(true);
        if options.tls {
            let mut tls = ClientTlsConfig::new();
            tls = match &options.ca_pem {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
                None => tls.with_enabled_roots(),
            };
            if let Some(d) = &options.domain {
                tls = tls.domain_name(d.clone());
            }
            endpoint = endpoint.tls_config(tls).map_err(|e| Error::InvalidArgument(format!("TLS settings: {e}")))?;
        }
        let channel = rt.block_on(endpoint.connect()).map_err(|e| {
            let plain = Error::Io(format!("cannot connect to the replay server at {address}: {e}{}", source_chain(&e)));
            not_the_replay_service(address, options.tls).unwrap_or(plain)
        })?;
        let token = match options.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse::<MetadataValue<Ascii>>()
                    .map_err(|_| Error::InvalidArgument("token must be printable ASCII".into()))?,
            ),
            None => None,
        };
        let mut stub = GrpcStub::with_interceptor(channel, Auth(token)).max_decoding_message_size(1 << 30).max_encoding_message_size(1 << 30);
        if options.compression.unwrap_or(!reprise_wire::is_loopback(address)) {
            use tonic::codec::CompressionEncoding::Zstd;
            stub = stub.send_compressed(Zstd).accept_compressed(Zstd);
        }
        let mut s = stub.clone();
        let layout = rt
            .block_on(s.get_layout(pb::GetLayoutRequest {}))
            .map_err(|status| match status.code() {
                // A server that answers but not with gRPC (an HTTP page, a metrics
                // endpoint) shows up as one of these.
                tonic::Code::Unimplemented | tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Unavailable => {
                    not_the_replay_service(address, options.tls).unwrap_or_else(|| from_status(status))
                }
                _ => from_status(status),
            })?
            .into_inner();
        if layout.protocol_version != pb::PROTOCOL_VERSION {
            return Err(Error::InvalidArgument(format!(
                "the server speaks protocol version {}, this client {}",
                layout.protocol_version,
                pb::PROTOCOL_VERSION
            )));
        }
        // Answers are bounded by what the server says it sends.
        let limit = usize::try_from(layout.max_message_bytes).unwrap_or(usize::MAX).clamp(4096, 1 << 30);
        let stub = stub.max_decoding_message_size(limit);
        let signatures = layout.stores.iter().map(store_signature).collect::<Result<_>>()?;
        Ok(RemoteClient { rt: Arc::new(rt), stub, layout, signatures, address: address.to_string(), sampler: Mutex::new(None) })
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn layout(&self) -> &pb::Layout {
        &self.layout
    }

    /// The index of the store `table` lives in (`NotFound` for an unknown name).
    fn store_index(&self, table: &str) -> Result<usize> {
        let t = self.layout.tables.iter().find(|t| t.name == table).ok_or_else(|| {
            Error::NotFound(format!("no table named '{table}'; this server has {:?}", self.table_names()))
        })?;
        let i = t.store as usize;
        if i >= self.layout.stores.len() {
            return Err(Error::Corrupt("layout: table of a missing store".into()));
        }
        Ok(i)
    }

    /// The store layout of `table` (`NotFound` for an unknown name).
    pub fn store_of(&self, table: &str) -> Result<&pb::Store> {
        Ok(&self.layout.stores[self.store_index(table)?])
    }

    /// The signature of `table`'s store, without copying it ([`ReplayClient::signature`] copies).
    pub fn signature_of(&self, table: &str) -> Result<&Signature> {
        Ok(&self.signatures[self.store_index(table)?])
    }

    /// Bytes per step of each field of `table`'s store, in signature order (what
    /// `RemoteWriter::append` takes per column).
    pub fn row_bytes(&self, table: &str) -> Result<Vec<usize>> {
        self.store_of(table)?.fields.iter().map(field_bytes).collect()
    }

    /// One batch request for `table` (`NotFound` for an unknown table).
    fn sample_request(&self, table: &str, n: u32, fields: &[String], timeout: Option<Duration>) -> Result<pb::SampleRequest> {
        check_sample_size(n, MAX_ITEMS)?;
        self.store_of(table)?;
        Ok(pb::SampleRequest {
            table: table.to_string(),
            num_items: n,
            fields: fields.to_vec(),
            timeout_seconds: timeout.map_or(-1.0, |t| t.as_secs_f64()),
            tokens: 0,
        })
    }
}

impl RemoteClient {
    /// One request on the client's `Sample` stream (reopened if it broke).
    fn draw(&self, table: &str, req: pb::SampleRequest, interrupt: Interrupt<'_>) -> Result<Drawn<RemoteSample>> {
        let n = req.num_items.max(1);
        let mut guard = self.sampler.lock();
        if guard.is_none() {
            let (tx, rx) = mpsc::channel::<pb::SampleRequest>(4);
            let mut stub = self.stub.clone();
            let responses = self.rt.block_on(stub.sample(Request::new(ReceiverStream::new(rx)))).map_err(from_status)?.into_inner();
            *guard = Some(SampleStream { tx, rx: responses });
        }
        let stream = guard.as_mut().expect("opened above");
        let signature = self.signature_of(table)?;
        let result = wait_for(
            &self.rt,
            async {
                stream.tx.send(req.clone()).await.map_err(lost)?;
                receive(&mut stream.rx, signature).await
            },
            None,
            interrupt,
            "sample",
            Some(Slow { stub: &self.stub, server: &self.address, table: Some(table), want: n as u64 }),
        );
        match result {
            Ok(r) => Ok(drawn(r, &req)),
            Err(e) => {
                *guard = None; // a broken or interrupted stream is not reused
                Err(e)
            }
        }
    }
}

impl ReplayClient for RemoteClient {
    type Writer = RemoteWriter;
    type Sample = RemoteSample;
    type Sampler = RemoteSampler;

    fn table_names(&self) -> Vec<String> {
        self.layout.tables.iter().map(|t| t.name.clone()).collect()
    }

    fn signature(&self, table: &str) -> Result<Signature> {
        self.signature_of(table).cloned()
    }

    fn writer(&self, table: Option<&str>, max_sequence_length: Option<u64>) -> Result<RemoteWriter> {
        let table = match table {
            Some(t) => t.to_string(),
            None => self.layout.tables.first().map(|t| t.name.clone()).unwrap_or_default(),
        };
        let store = self.store_of(&table)?;
        let rows: Vec<usize> = store.fields.iter().map(field_bytes).collect::<Result<_>>()?;
        let msl = match max_sequence_length {
            Some(m) => u32::try_from(m).map_err(|_| Error::InvalidArgument(format!("max_sequence_length must be < 2^32, got {m}")))?,
            None => 0,
        };
        let (tx, rx) = mpsc::channel::<pb::InsertRequest>(8);
        let mut stub = self.stub.clone();
        let responses = self
            .rt
            .block_on(stub.insert(Request::new(ReceiverStream::new(rx))))
            .map_err(from_status)?
            .into_inner();
        Ok(RemoteWriter {
            rt: self.rt.clone(),
            stub: self.stub.clone(),
            server: self.address.clone(),
            tx: Some(tx),
            responses: Some(responses),
            keys: Vec::new(),
            rows,
            pending: vec![Vec::new(); store.fields.len()],
            pending_steps: 0,
            ops: Vec::new(),
            op_bytes: 0,
            first: Some((table, msl)),
            next_flush: 1,
            episode_steps: 0,
            failed: None,
            max_message: self.layout.max_message_bytes as usize,
        })
    }

    fn sample(&self, table: &str, n: u32, fields: &[String], timeout: Option<Duration>, interrupt: Interrupt<'_>) -> Result<Drawn<RemoteSample>> {
        let req = self.sample_request(table, n, fields, timeout)?;
        self.draw(table, req, interrupt)
    }

    fn sample_tokens(&self, table: &str, tokens: u64, fields: &[String], timeout: Option<Duration>, interrupt: Interrupt<'_>) -> Result<Drawn<RemoteSample>> {
        if tokens == 0 {
            return Err(Error::InvalidArgument(format!("table '{table}': the token budget must be >= 1 step, got 0")));
        }
        let mut req = self.sample_request(table, 1, fields, timeout)?;
        (req.num_items, req.tokens) = (0, tokens);
        self.draw(table, req, interrupt)
    }

    fn set_version(&self, table: &str, version: i64) -> Result<u64> {
        let mut stub = self.stub.clone();
        let req = pb::SetVersionRequest { table: table.into(), version };
        Ok(self.rt.block_on(stub.set_version(req)).map_err(from_status)?.into_inner().count)
    }

    fn update_attribute(&self, table: &str, keys: &[u64], name: &str, values: &[u8]) -> Result<u64> {
        let mut stub = self.stub.clone();
        let req = pb::UpdateAttributeRequest { table: table.into(), name: name.into(), keys: keys.to_vec(), values: values.to_vec().into() };
        Ok(self.rt.block_on(stub.update_attribute(req)).map_err(from_status)?.into_inner().count)
    }

    /// A sampler on its own `Sample` stream that keeps up to `max_in_flight` batch
    /// requests outstanding, so the server draws and sends the next batches while the
    /// caller works on this one (flow control: never more than `max_in_flight` ahead).
    fn sampler(&self, table: &str, n: u32, fields: &[String], timeout: Option<Duration>, max_in_flight: u32) -> Result<RemoteSampler> {
        let request = self.sample_request(table, n, fields, timeout)?;
        if max_in_flight == 0 {
            return Err(Error::InvalidArgument("max_in_flight must be >= 1".into()));
        }
        let (tx, rx) = mpsc::channel::<pb::SampleRequest>(max_in_flight as usize);
        let mut stub = self.stub.clone();
        let responses = self.rt.block_on(stub.sample(Request::new(ReceiverStream::new(rx)))).map_err(from_status)?.into_inner();
        let signature = self.signature_of(table)?.clone();
        Ok(RemoteSampler { rt: self.rt.clone(), stub: self.stub.clone(), server: self.address.clone(), tx, rx: responses, request, signature, in_flight: 0, max_in_flight })
    }

    fn update_priorities(&self, table: &str, keys: &[u64], priorities: &[f64]) -> Result<u64> {
        check_priority_pairs(keys, priorities)?;
        let mut stub = self.stub.clone();
        let req = pb::UpdatePrioritiesRequest { table: table.into(), keys: keys.to_vec(), priorities: priorities.to_vec() };
        Ok(self.rt.block_on(stub.update_priorities(req)).map_err(from_status)?.into_inner().count)
    }

    fn delete(&self, table: &str, keys: &[u64]) -> Result<u64> {
        let mut stub = self.stub.clone();
        let req = pb::DeleteRequest { table: table.into(), keys: keys.to_vec() };
        Ok(self.rt.block_on(stub.delete(req)).map_err(from_status)?.into_inner().count)
    }

    fn reset(&self, table: &str) -> Result<()> {
        let mut stub = self.stub.clone();
        self.rt.block_on(stub.reset(pb::ResetRequest { table: table.into() })).map_err(from_status)?;
        Ok(())
    }

    fn checkpoint(&self) -> Result<String> {
        let mut stub = self.stub.clone();
        Ok(self.rt.block_on(stub.checkpoint(pb::CheckpointRequest {})).map_err(from_status)?.into_inner().path)
    }

    fn snapshot(&self) -> Result<String> {
        let mut stub = self.stub.clone();
        Ok(self.rt.block_on(stub.snapshot(pb::SnapshotRequest {})).map_err(from_status)?.into_inner().json)
    }

    fn info(&self) -> Result<Vec<TableInfo>> {
        let mut stub = self.stub.clone();
        let r = self.rt.block_on(stub.info(pb::InfoRequest {})).map_err(from_status)?.into_inner();
        Ok(r.tables.into_iter().map(TableInfo::from).collect())
    }

    /// Ends the client's `Sample` stream; writers and samplers keep their own streams.
    fn close(&self) {
        *self.sampler.lock() = None;
    }
}

/// Batches from one `Sample` stream, `max_in_flight` requested ahead.
pub struct RemoteSampler {
    rt: Arc<tokio::runtime::Runtime>,
    stub: Stub,
    server: String,
    tx: mpsc::Sender<pb::SampleRequest>,
    rx: Streaming<pb::SampleResponse>,
    request: pb::SampleRequest,
    signature: Signature,
    in_flight: u32,
    max_in_flight: u32,
}

impl Sampler for RemoteSampler {
    type Sample = RemoteSample;

    fn next(&mut self, interrupt: Interrupt<'_>) -> Result<Drawn<RemoteSample>> {
        let (tx, rx, request, signature) = (&self.tx, &mut self.rx, &self.request, &self.signature);
        let in_flight = &mut self.in_flight;
        let max = self.max_in_flight;
        let r = wait_for(
            &self.rt,
            async {
                while *in_flight < max {
                    tx.send(request.clone()).await.map_err(lost)?;
                    *in_flight += 1;
                }
                let r = receive(rx, signature).await?;
                *in_flight -= 1;
                Ok(r)
            },
            None,
            interrupt,
            "sample",
            Some(Slow { stub: &self.stub, server: &self.server, table: Some(&self.request.table), want: self.request.num_items as u64 }),
        )?;
        Ok(drawn(r, &self.request))
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(&format!(": {s}"));
        cur = s.source();
    }
    out
}

/// A store's signature from the server's layout (`Corrupt` when it does not make one).
fn store_signature(store: &pb::Store) -> Result<Signature> {
    let corrupt = |e: Error| Error::Corrupt(format!("the server's layout: {e}"));
    let fields = store
        .fields
        .iter()
        .map(|f| {
            let padding = if f.padding.is_empty() { StackPadding::Reset } else { StackPadding::from_name(&f.padding)? };
            Field::new(&f.name, DType::from_name(&f.dtype)?, f.shape.iter().map(|&d| d as usize).collect())?.stacked(f.stack.max(1), padding)
        })
        .collect::<Result<Vec<_>>>()
        .map_err(corrupt)?;
    Signature::new(fields).map_err(corrupt)
}

fn field_bytes(f: &pb::Field) -> Result<usize> {
    let dtype = reprise_core::DType::from_name(&f.dtype)?;
    let elements = f.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d as usize));
    elements
        .and_then(|e| e.checked_mul(dtype.itemsize()))
        .ok_or_else(|| Error::Corrupt(format!("layout: field '{}' is too large", f.name)))
}

/// A writer on its own `Insert` stream. Operations are queued and sent in messages;
/// `flush` returns once the server has applied everything before it.
pub struct RemoteWriter {
    rt: Arc<tokio::runtime::Runtime>,
    stub: Stub,
    server: String,
    tx: Option<mpsc::Sender<pb::InsertRequest>>,
    /// None once aborted: dropping it cancels the call, so the server stops
    /// waiting for this writer's items.
    responses: Option<Streaming<pb::InsertResponse>>,
    /// Keys of the items applied since the last flush returned.
    keys: Vec<u64>,
    rows: Vec<usize>,
    pending: Vec<Vec<u8>>,
    pending_steps: u32,
    ops: Vec<pb::InsertOp>,
    op_bytes: usize,
    first: Option<(String, u32)>,
    next_flush: u64,
    episode_steps: u64,
    failed: Option<String>,
    max_message: usize,
}

type Permit = mpsc::OwnedPermit<pb::InsertRequest>;

impl RemoteWriter {
    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(m) => Err(Error::Io(format!("this writer's stream failed earlier: {m}"))),
            None if self.tx.is_none() => Err(Error::InvalidArgument("this writer is closed".into())),
            None => Ok(()),
        }
    }

    /// Moves the queued steps into one `Steps` operation.
    fn seal_steps(&mut self) {
        if self.pending_steps == 0 {
            return;
        }
        let columns: Vec<Vec<u8>> = self.pending.iter_mut().map(std::mem::take).collect();
        self.op_bytes += columns.iter().map(|c| c.len()).sum::<usize>();
        self.ops.push(pb::InsertOp { op: Some(pb::insert_op::Op::Steps(pb::Steps { num_steps: self.pending_steps, columns: columns.into_iter().map(Into::into).collect() })) });
        self.pending_steps = 0;
    }

    /// Room for one message on the stream, waiting within `wait` (the stream is
    /// full while the server's rate limiter holds earlier items back). Giving up
    /// sends nothing; an interrupt aborts the writer.
    fn room(&mut self, wait: Wait<'_>) -> Result<Permit> {
        let tx = self.tx.clone().ok_or_else(|| Error::InvalidArgument("this writer is closed".into()))?;
        if let Ok(permit) = tx.clone().try_reserve_owned() {
            return Ok(permit);
        }
        let slow = Slow { stub: &self.stub, server: &self.server, table: None, want: 1 };
        let got = wait_for(&self.rt, async { tx.reserve_owned().await.map_err(|_| lost("the insert stream closed")) }, wait.deadline(), wait.interrupt, "a writer's send", Some(slow));
        match got {
            Ok(permit) => Ok(permit),
            Err(e @ Error::Interrupted { .. }) => {
                self.abort();
                Err(e)
            }
            Err(Error::Io(_)) => {
                // The server ended the stream: its status says why.
                let why = self.drain_error();
                self.failed = Some(why.to_string());
                Err(why)
            }
            Err(Error::Timeout { partial, .. }) => Err(Error::Timeout {
                message: format!(
                    "a writer's send: the insert stream to the replay server at {} had no room within {:.3} s (its rate \
                     limiter may be holding this writer's earlier items back); nothing was queued for this call",
                    self.server,
                    wait.timeout.unwrap_or_default().as_secs_f64()
                ),
                partial,
            }),
            Err(e) => Err(e),
        }
    }

    /// Sends the queued operations (and, first, the stream's header) in `permit`'s slot.
    fn send_in(&mut self, permit: Permit) {
        let (table, msl) = self.first.take().unwrap_or_default();
        let req = pb::InsertRequest { table, max_sequence_length: msl, timeout_seconds: -1.0, ops: std::mem::take(&mut self.ops) };
        self.op_bytes = 0;
        permit.send(req);
    }

    /// Sends the queued operations, waiting for room within `wait`.
    fn send(&mut self, wait: Wait<'_>) -> Result<()> {
        if self.ops.is_empty() && self.first.is_none() {
            return Ok(());
        }
        let permit = self.room(wait)?;
        self.send_in(permit);
        Ok(())
    }

    /// Queues `op`. When that fills a message, room to send it is waited for first,
    /// so a call that gives up has queued nothing.
    fn push(&mut self, op: pb::insert_op::Op, bytes: usize, wait: Wait<'_>) -> Result<()> {
        self.seal_steps();
        let full = self.op_bytes + bytes >= SEND_BYTES || self.ops.len() + 1 >= SEND_OPS;
        let permit = if full { Some(self.room(wait)?) } else { None };
        self.ops.push(pb::InsertOp { op: Some(op) });
        self.op_bytes += bytes;
        if let Some(permit) = permit {
            self.send_in(permit);
        }
        Ok(())
    }

    fn drain_error(&mut self) -> Error {
        let Some(responses) = self.responses.as_mut() else { return lost("the insert stream closed") };
        match self.rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), responses.message()).await }) {
            Ok(Err(s)) => from_status(s),
            _ => lost("the insert stream closed"),
        }
    }

    /// Whether `steps` more steps make the queued message too large, so it is sent first.
    fn must_send(&self, steps: usize) -> bool {
        let step_bytes: usize = self.rows.iter().sum();
        (self.pending_steps as usize + steps) * step_bytes + self.op_bytes + 1024 > self.max_message.min(4 * SEND_BYTES)
    }

    /// Whether the stream has no room for another message now.
    fn stream_full(&self) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.capacity() == 0)
    }
}

impl StepWriter for RemoteWriter {
    fn may_wait(&self, steps: usize) -> bool {
        self.must_send(steps)
    }

    fn items_may_wait(&self, _items: usize) -> bool {
        self.stream_full()
    }

    /// Queues `steps` steps (`columns[i]`: steps * row bytes of field i).
    fn extend(&mut self, columns: &[&[u8]], steps: usize, wait: Wait<'_>) -> Result<()> {
        self.check()?;
        if columns.len() != self.rows.len() {
            return Err(Error::InvalidArgument(format!("{} columns, expected {}", columns.len(), self.rows.len())));
        }
        for (i, (c, &row)) in columns.iter().zip(&self.rows).enumerate() {
            if c.len() != row * steps {
                return Err(Error::InvalidArgument(format!("column {i}: {} bytes, expected {} for {steps} steps", c.len(), row * steps)));
            }
        }
        let step_bytes: usize = self.rows.iter().sum();
        if step_bytes + 1024 > self.max_message {
            return Err(Error::InvalidArgument(format!(
                "one step is {step_bytes} bytes, more than the server's max_message_bytes ({}) allows; \
                 serve with a larger max_message_bytes",
                self.max_message
            )));
        }
        if step_bytes * steps + 1024 > self.max_message {
            // More than one message: in runs of steps that fit, applied in order.
            let deadline = wait.deadline();
            let per = (self.max_message - 1024) / step_bytes.max(1);
            for start in (0..steps).step_by(per) {
                let n = per.min(steps - start);
                let part: Vec<&[u8]> = columns.iter().zip(&self.rows).map(|(c, &row)| &c[start * row..(start + n) * row]).collect();
                self.extend(&part, n, wait.until(deadline)).map_err(|e| match e {
                    Error::Timeout { message, partial } => {
                        Error::Timeout { message: format!("{message}: {start} of {steps} steps were queued, the rest were not"), partial }
                    }
                    e => e,
                })?;
            }
            return Ok(());
        }
        if self.must_send(steps) {
            self.seal_steps();
            self.send(wait)?;
        }
        for (p, c) in self.pending.iter_mut().zip(columns) {
            p.extend_from_slice(c);
        }
        self.pending_steps += steps as u32;
        self.episode_steps += steps as u64;
        Ok(())
    }

    fn create_item(&mut self, table: &str, num_steps: u64, priority: f64, record: &[u8], wait: Wait<'_>) -> Result<()> {
        self.check()?;
        let num_steps = u32::try_from(num_steps).map_err(|_| Error::InvalidArgument(format!("num_steps must be < 2^32, got {num_steps}")))?;
        let op = pb::CreateItem { table: table.into(), num_steps, priority, attributes: record.to_vec().into() };
        self.push(pb::insert_op::Op::CreateItem(op), 32 + table.len() + record.len(), wait)
    }

    fn create_items(&mut self, table: &str, num_steps: u64, priorities: &[f64], records: &[u8], wait: Wait<'_>) -> Result<()> {
        self.check()?;
        let num_steps = u32::try_from(num_steps).map_err(|_| Error::InvalidArgument(format!("num_steps must be < 2^32, got {num_steps}")))?;
        let op = pb::CreateItems { table: table.into(), num_steps, priorities: priorities.to_vec(), attributes: records.to_vec().into() };
        self.push(pb::insert_op::Op::CreateItems(op), 32 + table.len() + 8 * priorities.len() + records.len(), wait)
    }

    fn end_episode(&mut self, wait: Wait<'_>) -> Result<()> {
        self.check()?;
        self.push(pb::insert_op::Op::EndEpisode(pb::EndEpisode {}), 4, wait)?;
        self.episode_steps = 0;
        Ok(())
    }

    fn episode_steps(&self) -> u64 {
        self.episode_steps
    }

    /// Sends everything queued and waits until the server has applied it; returns the
    /// keys of the items created since the last flush.
    fn flush(&mut self, wait: Wait<'_>) -> Result<Vec<u64>> {
        self.check()?;
        let deadline = wait.deadline();
        self.seal_steps();
        let permit = self.room(wait)?;
        let id = self.next_flush;
        self.next_flush += 1;
        self.ops.push(pb::InsertOp { op: Some(pb::insert_op::Op::Flush(pb::Flush { id })) });
        self.send_in(permit);
        let (Some(responses), keys) = (self.responses.as_mut(), &mut self.keys) else {
            return Err(Error::InvalidArgument("this writer is closed".into()));
        };
        let result = wait_for(
            &self.rt,
            async {
                loop {
                    match responses.message().await {
                        Ok(Some(r)) => {
                            keys.extend(r.keys);
                            if r.flush_id == id {
                                return Ok(());
                            }
                        }
                        Ok(None) => return Err(lost("the insert stream ended")),
                        Err(s) => return Err(from_status(s)),
                    }
                }
            },
            deadline,
            wait.interrupt,
            "flush",
            Some(Slow { stub: &self.stub, server: &self.server, table: None, want: 1 }),
        );
        match result {
            Ok(()) => Ok(std::mem::take(&mut self.keys)),
            Err(Error::Timeout { partial, .. }) => Err(Error::Timeout {
                message: format!(
                    "items were not all committed within {:.3} s (the writer goes on: flush again to keep waiting)",
                    wait.timeout.unwrap_or_default().as_secs_f64()
                ),
                partial,
            }),
            Err(e @ Error::Interrupted { .. }) => {
                self.abort();
                Err(e)
            }
            Err(e) => {
                self.failed = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Flushes, then ends the stream (the server releases the writer's blocks). A
    /// flush that gives up aborts. Idempotent.
    fn close(&mut self, wait: Wait<'_>) -> Result<()> {
        if self.tx.is_none() {
            return Ok(());
        }
        let flushed = if self.failed.is_none() { self.flush(wait).map(|_| ()) } else { Ok(()) };
        if flushed.is_err() {
            self.abort();
        }
        self.tx = None;
        flushed
    }

    /// Ends the call without sending what is queued: the server stops waiting for
    /// this writer's items and releases its blocks.
    fn abort(&mut self) {
        self.ops.clear();
        self.pending_steps = 0;
        self.pending.iter_mut().for_each(Vec::clear);
        self.tx = None;
        self.responses = None;
    }
}

impl Drop for RemoteWriter {
    /// Sends what is queued (the server applies it) if the stream has room for it,
    /// waiting for nothing, and ends the stream.
    fn drop(&mut self) {
        if self.tx.is_some() && self.failed.is_none() {
            self.seal_steps();
            if let Some(Ok(permit)) = self.tx.clone().map(|tx| tx.try_reserve_owned()) {
                if !self.ops.is_empty() || self.first.is_some() {
                    self.send_in(permit);
                }
            }
        }
        self.tx = None;
    }
}

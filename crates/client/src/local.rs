//! Local clients: a replay server on the same host.
//!
//! A client connects to the server's Unix socket, learns its stores (shared-memory
//! files, signatures) and tables, and maps the stores itself. A [`LocalWriter`]
//! leases blocks from the server ([`LeasedBlocks`]), appends steps straight into
//! them, and commits items in batches of small records; a [`LocalSample`] carries
//! the row windows the server selected, and the client copies the rows out of
//! shared memory itself. The server holds the sampled blocks until the client says
//! it is done.
//!
//! Each writer has its own connection, so its pipelined commits never wait behind
//! another thread's sample. If the client dies, the server releases everything
//! the connection held; items already committed stay, nothing partial appears.

use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use reprise_core::blocks::BlockSource;
use reprise_core::error::{Error, Result};
use reprise_core::item::check_priority;
use reprise_core::signature::{DType, Field, Signature, StackPadding};
use reprise_core::{Collect, Columns, SampledItem, TableInfo, Wait, Window, Writer};
use reprise_wire::codes::from_local_code;
use reprise_wire::local::{self as p, Frame, Reader};

use reprise_core::wait::{slow_wait, SlowWait};

use crate::{check_priority_pairs, check_sample_size, explain_wait, Drawn, Interrupt, ReplayClient, Sampler, StepWriter, POLL};

/// Items per commit message.
const BATCH: u32 = 256;
/// Commit messages a writer sends before it waits for the oldest reply.
const MAX_INFLIGHT: usize = 8;
/// Released blocks a writer holds back for its next message, at most.
const RELEASE_BATCH: usize = 16;

/// Spare blocks a writer may hold in a store of `blocks` blocks: none in a small
/// store (they would hold its room back), at most 1/64 of a large one.
fn spares_for(blocks: u64) -> u32 {
    (blocks / 64).min(u64::from(p::MAX_SPARES).min(32)) as u32
}

pub struct TableRef {
    pub name: String,
    pub store: u32,
}

/// What the server said in its greeting.
pub struct ServerInfo {
    pub pid: u32,
    pub stores: Vec<Arc<Columns>>,
    /// Per store: true for a durable file store (a writer's flush asks it to commit).
    pub durable: Vec<bool>,
    pub tables: Vec<TableRef>,
}

/// Who a long wait asks why, once it has waited past `slow_wait`: the server at
/// `path`, over a connection of its own (the waiting one is busy), for its figures
/// for `table` (a sample of `want`) or for every table (a flush).
struct Slow<'a> {
    path: &'a Path,
    what: &'a str,
    table: Option<&'a str>,
    want: u64,
}

impl Slow<'_> {
    fn say(&self, clock: &SlowWait) {
        let server = format!("unix://{}", self.path.display());
        let message = match LocalClient::connect(self.path).and_then(|c| c.info()) {
            Ok(infos) => explain_wait(self.what, &server, clock.elapsed(), &infos, self.table, self.want),
            Err(e) => format!("{} has waited {:.1} s for the replay server at {server}, which does not answer: {e}", self.what, clock.elapsed().as_secs_f64()),
        };
        clock.say(&message);
    }
}

/// Waits until a reply can be read, the deadline passes (`Timeout`) or the
/// interrupt check fires (`Interrupted`). The caller must then retire the
/// connection: its reply would arrive later and confuse the next call. With
/// `slow`, a wait past `slow_wait` says once what the server waits for.
fn wait_readable(stream: &UnixStream, deadline: Option<Instant>, interrupt: Interrupt<'_>, slow: Option<&Slow<'_>>) -> Result<()> {
    use std::os::fd::AsRawFd;
    if deadline.is_none() && interrupt.is_none() && (slow.is_none() || slow_wait().is_none()) {
        return Ok(());
    }
    let mut clock = SlowWait::start();
    loop {
        let now = Instant::now();
        let poll = interrupt.map(|_| now + POLL);
        let wake = [deadline, poll, slow.and(clock.due())].into_iter().flatten().min();
        let slice = wake.map_or(-1, |w| w.saturating_duration_since(now).as_millis().min(i32::MAX as u128) as i32);
        let mut fds = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for an open socket.
        if unsafe { libc::poll(&mut fds, 1, slice) } > 0 {
            return Ok(());
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::Timeout { message: "the replay server did not answer in time".into(), partial: Default::default() });
        }
        if interrupt.is_some_and(|stop| stop()) {
            return Err(Error::Interrupted { partial: Default::default() });
        }
        if let Some(s) = slow.filter(|_| clock.is_due()) {
            s.say(&clock);
        }
    }
}

fn unexpected(kind: u8) -> Error {
    Error::Corrupt(format!("unexpected reply kind {kind} from the replay server"))
}

/// Sends a request and reads its reply; an `ERROR` reply becomes the error.
fn call(stream: &mut UnixStream, frame: Frame, interrupt: Interrupt<'_>, slow: Option<&Slow<'_>>) -> Result<(u8, Vec<u8>)> {
    frame.send(stream)?;
    wait_readable(stream, None, interrupt, slow)?;
    reply(stream)
}

fn reply(stream: &mut UnixStream) -> Result<(u8, Vec<u8>)> {
    let (kind, body) = p::read_frame(stream)?;
    if kind == p::ERROR {
        let mut r = Reader::new(&body);
        return Err(from_local_code(r.u8()?, r.str()?));
    }
    Ok((kind, body))
}

fn hello(path: &Path) -> Result<(UnixStream, ServerInfo)> {
    let mut stream = UnixStream::connect(path).map_err(|e| {
        Error::Io(format!("cannot connect to a replay server at unix://{}: {e}", path.display()))
    })?;
    let mut f = Frame::new(p::HELLO);
    f.u32(p::VERSION);
    let (kind, body) = call(&mut stream, f, None, None)?;
    if kind != p::HELLO_OK {
        return Err(unexpected(kind));
    }
    let mut r = Reader::new(&body);
    let pid = r.u32()?;
    let mut stores = Vec::new();
    let mut durable = Vec::new();
    for _ in 0..r.count(1024, "stores")? {
        let path = PathBuf::from(r.str()?);
        let (capacity, block_steps) = (r.u64()?, r.u32()?);
        // A file store's columns: reads may wait for the disk (see `Columns::attach_file`).
        let flags = r.u32()?;
        let on_disk = flags & p::FILE_STORE != 0;
        durable.push(flags & p::DURABLE != 0);
        let mut fields = Vec::new();
        for _ in 0..r.count(4096, "fields")? {
            let name = r.str()?;
            let dtype = DType::from_name(&r.str()?).map_err(|e| Error::Corrupt(e.to_string()))?;
            let ndim = r.count(32, "dimensions")?;
            let shape = (0..ndim).map(|_| r.u64().map(|d| d as usize)).collect::<Result<Vec<_>>>()?;
            let level = match r.u32()? as i32 {
                0 => None,
                l => Some(l),
            };
            let stack = r.u32()?;
            let padding = match r.u32()? {
                0 => StackPadding::Reset,
                1 => StackPadding::Zero,
                p => return Err(Error::Corrupt(format!("field '{name}': unknown stack padding {p}"))),
            };
            let field = Field::new(&name, dtype, shape).and_then(|f| f.compressed(level)).and_then(|f| f.stacked(stack, padding));
            fields.push(field.map_err(|e| Error::Corrupt(e.to_string()))?);
        }
        let sig = Signature::new(fields).map_err(|e| Error::Corrupt(e.to_string()))?;
        let columns = if on_disk { Columns::attach_file } else { Columns::attach };
        stores.push(Arc::new(columns(&path, sig, capacity, block_steps)?));
    }
    let mut tables = Vec::new();
    for _ in 0..r.count(1 << 16, "tables")? {
        let name = r.str()?;
        let store = r.u32()?;
        if store as usize >= stores.len() {
            return Err(Error::Corrupt(format!("table '{name}' names store {store} of {}", stores.len())));
        }
        tables.push(TableRef { name, store });
    }
    r.done()?;
    Ok((stream, ServerInfo { pid, stores, durable, tables }))
}

impl ServerInfo {
    /// The index of the table named `name`.
    pub fn table(&self, name: &str) -> Result<u32> {
        self.tables.iter().position(|t| t.name == name).map(|i| i as u32).ok_or_else(|| {
            let names: Vec<&str> = self.tables.iter().map(|t| t.name.as_str()).collect();
            Error::NotFound(format!("the replay server has no table named '{name}'; tables: {names:?}"))
        })
    }
}

struct Shared {
    path: PathBuf,
    info: ServerInfo,
    stream: Mutex<UnixStream>,
    life: Mutex<Life>,
}

/// Whether the connection may still be used, and how many of its samples are alive.
/// The server releases what a connection held when it closes, so the socket is shut
/// only once no sample drawn on it is alive (their rows must stay unreused).
#[derive(Default)]
struct Life {
    retired: Option<&'static str>,
    live_samples: usize,
}

impl Shared {
    fn table(&self, name: &str) -> Result<u32> {
        self.info.table(name)
    }

    fn call(&self, frame: Frame, interrupt: Interrupt<'_>) -> Result<(u8, Vec<u8>)> {
        self.call_slow(frame, interrupt, None)
    }

    /// [`Shared::call`] for a call that may wait on a rate limiter (`slow`).
    fn call_slow(&self, frame: Frame, interrupt: Interrupt<'_>, slow: Option<&Slow<'_>>) -> Result<(u8, Vec<u8>)> {
        if let Some(why) = self.life.lock().retired {
            return Err(Error::Io(format!("this client's connection is {why}; make a new client")));
        }
        let result = call(&mut self.stream.lock(), frame, interrupt, slow);
        if let Err(Error::Interrupted { .. }) = result {
            self.retire("interrupted");
        }
        result
    }

    /// No more calls; the socket is shut now or when the last live sample drops.
    fn retire(&self, why: &'static str) {
        let mut life = self.life.lock();
        life.retired.get_or_insert(why);
        if life.live_samples == 0 {
            let _ = self.stream.lock().shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A draw's claim on its connection, taken before the request is sent (so a
/// concurrent `close` cannot shut the socket between the server's answer and the
/// sample that holds its rows) and given back when the sample is dropped: then
/// the server is told the draw `id` is done, and a retired connection is shut once
/// nothing holds it.
struct Hold {
    shared: Arc<Shared>,
    id: Option<u64>,
}

impl Hold {
    fn new(shared: &Arc<Shared>) -> Hold {
        shared.life.lock().live_samples += 1;
        Hold { shared: shared.clone(), id: None }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut life = self.shared.life.lock();
        life.live_samples -= 1;
        let mut stream = self.shared.stream.lock();
        if let Some(id) = self.id {
            let mut f = Frame::new(p::SAMPLE_DONE);
            f.u64(id);
            // A server that is gone has released the rows already.
            let _ = f.send(&mut *stream);
        }
        if life.retired.is_some() && life.live_samples == 0 {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A connection to a replay server on this host.
#[derive(Clone)]
pub struct LocalClient {
    shared: Arc<Shared>,
}

impl LocalClient {
    /// Connects to the server listening at `path` (its Unix socket).
    pub fn connect(path: &Path) -> Result<LocalClient> {
        let (stream, info) = hello(path)?;
        Ok(LocalClient { shared: Arc::new(Shared { path: path.to_path_buf(), info, stream: Mutex::new(stream), life: Mutex::default() }) })
    }

    pub fn server_pid(&self) -> u32 {
        self.shared.info.pid
    }

    /// The columns of the store that `table` (or the first table) lives in.
    pub fn columns(&self, table: Option<&str>) -> Result<Arc<Columns>> {
        let t = match table {
            Some(name) => self.shared.table(name)? as usize,
            None => 0,
        };
        let store = self.shared.info.tables.get(t).ok_or_else(|| Error::NotFound("the replay server has no tables".into()))?.store;
        Ok(self.shared.info.stores[store as usize].clone())
    }

    /// One draw by the server: `n` items, or with `tokens` > 0 a token budget.
    /// The rows stay where they are until the sample is collected. While the server
    /// waits, `interrupt` is checked every [`POLL`]; when it fires the connection is
    /// retired (shut once no sample drawn on it is alive).
    fn draw(&self, table: &str, n: u32, tokens: u64, fields: &[String], timeout: Option<Duration>, interrupt: Interrupt<'_>) -> Result<Drawn<LocalSample>> {
        let t = self.shared.table(table)?;
        let columns = self.shared.info.stores[self.shared.info.tables[t as usize].store as usize].clone();
        let fields = columns.signature().select(fields)?;
        let mut f = Frame::new(p::SAMPLE);
        f.u32(t).u32(n).i64(p::timeout_to_wire(timeout)).u64(tokens);
        let mut hold = Hold::new(&self.shared);
        let slow = Slow { path: &self.shared.path, what: "sample", table: Some(table), want: n.max(1) as u64 };
        let (kind, body) = self.shared.call_slow(f, interrupt, Some(&slow))?;
        if kind != p::SAMPLED {
            return Err(unexpected(kind));
        }
        let mut r = Reader::new(&body);
        let status = r.u8()?;
        let message = r.str()?;
        hold.id = Some(r.u64()?);
        let table_size = r.u64()?;
        let count = r.count(p::MAX_ITEMS, "sampled items")?;
        let mut items = Vec::with_capacity(count as usize);
        for _ in 0..count {
            items.push(SampledItem {
                key: r.u64()?,
                probability: r.f64()?,
                priority: r.f64()?,
                times_sampled: r.u32()?,
                length: r.u32()?,
                window: Window::from_ranges(r.ranges()?),
            });
        }
        let attributes = r.bytes(p::MAX_FRAME, "attribute records")?.to_vec();
        r.done()?;
        for item in &items {
            let len: u64 = item.window.ranges().iter().map(|r| r.len as u64).sum();
            let inside = item.window.ranges().iter().all(|r| r.start + r.len as u64 <= columns.capacity());
            if len != item.length as u64 || !inside {
                return Err(Error::Corrupt(format!("sampled item {} has rows outside the store", item.key)));
            }
        }
        let sample = LocalSample { items, attributes, table_size, columns, fields, _hold: hold };
        let cut_short = (status != 0).then(|| Error::Timeout { message, partial: Default::default() });
        Ok(Drawn { sample, cut_short })
    }

    /// Sends `f` and reads a `COUNT` reply.
    fn count_reply(&self, f: Frame) -> Result<u64> {
        let (kind, body) = self.shared.call(f, None)?;
        if kind != p::COUNT {
            return Err(unexpected(kind));
        }
        Reader::new(&body).u64()
    }

    fn keyed(&self, kind: u8, table: &str, keys: &[u64], priorities: Option<&[f64]>) -> Result<u64> {
        let t = self.shared.table(table)?;
        if keys.len() > p::MAX_ITEMS as usize {
            return Err(Error::InvalidArgument(format!("at most {} keys per call, got {}", p::MAX_ITEMS, keys.len())));
        }
        let mut f = Frame::new(kind);
        f.u32(t).u32(keys.len() as u32);
        keys.iter().for_each(|&k| {
            f.u64(k);
        });
        priorities.unwrap_or(&[]).iter().for_each(|&x| {
            f.f64(x);
        });
        self.count_reply(f)
    }
}

impl ReplayClient for LocalClient {
    type Writer = LocalWriter;
    type Sample = LocalSample;
    type Sampler = LocalSampler;

    fn table_names(&self) -> Vec<String> {
        self.shared.info.tables.iter().map(|t| t.name.clone()).collect()
    }

    fn signature(&self, table: &str) -> Result<Signature> {
        Ok(self.columns(Some(table))?.signature().clone())
    }

    fn writer(&self, table: Option<&str>, max_sequence_length: Option<u64>) -> Result<LocalWriter> {
        let columns = self.columns(table)?;
        let store = self.shared.info.stores.iter().position(|c| Arc::ptr_eq(c, &columns)).expect("store is listed") as u32;
        let (stream, info) = hello(&self.shared.path)?;
        let max_spares = spares_for(columns.capacity() / columns.block_steps() as u64);
        let blocks = LeasedBlocks {
            stream,
            path: self.shared.path.clone(),
            columns,
            store,
            durable: self.shared.info.durable[store as usize],
            counts: HashMap::new(),
            spares: Vec::new(),
            spares_wanted: 0,
            max_spares,
            releasing: Vec::new(),
            pending: None,
            pending_items: 0,
            inflight: VecDeque::new(),
            keys: Vec::new(),
            failed: None,
            closed: None,
        };
        Ok(LocalWriter { writer: Writer::new(blocks, max_sequence_length)?, info: Arc::new(info) })
    }

    fn sample(&self, table: &str, n: u32, fields: &[String], timeout: Option<Duration>, interrupt: Interrupt<'_>) -> Result<Drawn<LocalSample>> {
        check_sample_size(n, p::MAX_ITEMS)?;
        self.draw(table, n, 0, fields, timeout, interrupt)
    }

    fn sample_tokens(&self, table: &str, tokens: u64, fields: &[String], timeout: Option<Duration>, interrupt: Interrupt<'_>) -> Result<Drawn<LocalSample>> {
        if tokens == 0 {
            return Err(Error::InvalidArgument(format!("table '{table}': the token budget must be >= 1 step, got 0")));
        }
        self.draw(table, 0, tokens, fields, timeout, interrupt)
    }

    fn set_version(&self, table: &str, version: i64) -> Result<u64> {
        let t = self.shared.table(table)?;
        let mut f = Frame::new(p::SET_VERSION);
        f.u32(t).i64(version);
        self.count_reply(f)
    }

    fn update_attribute(&self, table: &str, keys: &[u64], name: &str, values: &[u8]) -> Result<u64> {
        let t = self.shared.table(table)?;
        if keys.len() > p::MAX_ITEMS as usize {
            return Err(Error::InvalidArgument(format!("at most {} keys per call, got {}", p::MAX_ITEMS, keys.len())));
        }
        let mut f = Frame::new(p::UPDATE_ATTRIBUTE);
        f.u32(t).str(name).u32(keys.len() as u32);
        keys.iter().for_each(|&k| {
            f.u64(k);
        });
        f.bytes(values);
        self.count_reply(f)
    }

    /// One draw after another: the server holds at most one draw per connection in
    /// flight, so `max_in_flight` is accepted and draws are not pipelined.
    fn sampler(&self, table: &str, n: u32, fields: &[String], timeout: Option<Duration>, max_in_flight: u32) -> Result<LocalSampler> {
        self.shared.table(table)?;
        check_sample_size(n, p::MAX_ITEMS)?;
        if max_in_flight == 0 {
            return Err(Error::InvalidArgument("max_in_flight must be >= 1".into()));
        }
        self.signature(table)?.select(fields)?;
        Ok(LocalSampler { client: self.clone(), table: table.to_string(), n, fields: fields.to_vec(), timeout })
    }

    fn update_priorities(&self, table: &str, keys: &[u64], priorities: &[f64]) -> Result<u64> {
        check_priority_pairs(keys, priorities)?;
        self.keyed(p::UPDATE, table, keys, Some(priorities))
    }

    fn delete(&self, table: &str, keys: &[u64]) -> Result<u64> {
        self.keyed(p::DELETE, table, keys, None)
    }

    fn reset(&self, table: &str) -> Result<()> {
        let mut f = Frame::new(p::RESET);
        f.u32(self.shared.table(table)?);
        match self.shared.call(f, None)? {
            (p::OK, _) => Ok(()),
            (kind, _) => Err(unexpected(kind)),
        }
    }

    fn checkpoint(&self) -> Result<String> {
        let (kind, body) = self.shared.call(Frame::new(p::CHECKPOINT), None)?;
        if kind != p::CHECKPOINTED {
            return Err(unexpected(kind));
        }
        let mut r = Reader::new(&body);
        let path = r.str()?;
        r.done()?;
        Ok(path)
    }

    fn snapshot(&self) -> Result<String> {
        let (kind, body) = self.shared.call(Frame::new(p::SNAPSHOT), None)?;
        if kind != p::SNAPSHOT_OK {
            return Err(unexpected(kind));
        }
        let mut r = Reader::new(&body);
        let text = r.str()?;
        r.done()?;
        Ok(text)
    }

    fn info(&self) -> Result<Vec<TableInfo>> {
        let (kind, body) = self.shared.call(Frame::new(p::INFO), None)?;
        if kind != p::INFO_OK {
            return Err(unexpected(kind));
        }
        let mut r = Reader::new(&body);
        let n = r.count(1 << 16, "tables")?;
        let infos = (0..n).map(|_| p::get_info(&mut r)).collect::<Result<Vec<_>>>()?;
        r.done()?;
        Ok(infos)
    }

    /// Later calls on this client fail; samples already taken stay valid (the
    /// connection, and with it the server's hold on their rows, ends when the last
    /// of them is dropped).
    fn close(&self) {
        self.shared.retire("closed");
    }
}

/// Draws of a local client, one after another.
pub struct LocalSampler {
    client: LocalClient,
    table: String,
    n: u32,
    fields: Vec<String>,
    timeout: Option<Duration>,
}

impl Sampler for LocalSampler {
    type Sample = LocalSample;

    fn next(&mut self, interrupt: Interrupt<'_>) -> Result<Drawn<LocalSample>> {
        self.client.sample(&self.table, self.n, &self.fields, self.timeout, interrupt)
    }
}

/// Items drawn by the server; their rows are read in place from shared memory.
/// The server keeps them from being reused until this is dropped.
pub struct LocalSample {
    items: Vec<SampledItem>,
    /// The items' attribute records, end to end.
    attributes: Vec<u8>,
    table_size: u64,
    columns: Arc<Columns>,
    fields: Vec<usize>,
    /// Keeps the server's hold on the rows until this sample is dropped.
    _hold: Hold,
}

impl LocalSample {

    /// The columns the draw asked for, in the order asked.
    pub fn fields(&self) -> &[usize] {
        &self.fields
    }
}

// SAFETY: `sample` checked that every window lies inside the store's columns, and
// the server holds a reference on every sampled block for this draw until the
// sample's `Hold` sends SAMPLE_DONE or the connection closes; the client shuts the
// connection only when no `Hold` is alive, so neither happens before `self` is gone.
unsafe impl Collect for LocalSample {
    fn items(&self) -> &[SampledItem] {
        &self.items
    }
    fn table_size(&self) -> u64 {
        self.table_size
    }
    fn columns(&self) -> &Columns {
        &self.columns
    }
    fn attributes(&self) -> &[u8] {
        &self.attributes
    }
}

/// Blocks leased from the local server over the writer's own connection.
pub struct LeasedBlocks {
    stream: UnixStream,
    /// The server's socket (a long wait for a commit asks it why on another connection).
    path: PathBuf,
    columns: Arc<Columns>,
    store: u32,
    /// A durable store: a flush ends with a `COMMIT`.
    durable: bool,
    /// This writer's references per leased block; the server holds one per block.
    counts: HashMap<u32, u32>,
    /// Blocks the server leased ahead (free ones only), handed to the writer
    /// before the next round trip: a writer of long sequences asks once per
    /// several blocks instead of once per block.
    spares: Vec<u32>,
    /// Spares the next lease asks for: doubles with each lease up to `max_spares`.
    spares_wanted: u32,
    max_spares: u32,
    /// Blocks this writer let go of, told to the server with the next message it
    /// sends (after the commits that reference them).
    releasing: Vec<u32>,
    pending: Option<Frame>,
    pending_items: u32,
    /// Items in each commit message still awaiting its reply.
    inflight: VecDeque<u32>,
    /// Keys of the items committed since the last flush.
    keys: Vec<u64>,
    /// The first error a pipelined message came back with, raised at the next call.
    failed: Option<Error>,
    /// Why the connection was shut (an abort, or a wait given up with a reply due):
    /// every later call says so.
    closed: Option<&'static str>,
}

impl LeasedBlocks {
    fn fail(&mut self, e: Error) {
        self.failed.get_or_insert(e);
    }

    /// Shuts the connection without waiting: the server stops waiting for this
    /// writer's commits, drops what it had not committed and releases its blocks.
    /// Queued items are dropped.
    fn shut(&mut self, why: &'static str) {
        if self.closed.is_none() {
            self.closed = Some(why);
            self.pending = None;
            self.pending_items = 0;
            self.inflight.clear();
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    fn check_open(&self) -> Result<()> {
        match self.closed {
            Some(why) => Err(Error::InvalidArgument(format!("this writer is closed ({why})"))),
            None => Ok(()),
        }
    }

    /// Sends the pending commit message, if any, then the releases waiting for it.
    fn send_pending(&mut self) -> Result<()> {
        if let Some(mut f) = self.pending.take() {
            f.patch_u32(8, self.pending_items);
            f.send(&mut self.stream)?;
            self.inflight.push_back(self.pending_items);
            self.pending_items = 0;
        }
        if !self.releasing.is_empty() {
            let mut f = Frame::new(p::RELEASE);
            f.u32(self.store).u32(self.releasing.len() as u32);
            for &b in &self.releasing {
                f.u32(b);
            }
            self.releasing.clear();
            f.send(&mut self.stream)?;
        }
        Ok(())
    }

    /// Waits, within `wait`, until a reply can be read. A timeout leaves the writer
    /// as it was; an interrupt shuts it (Ctrl-C means stop, not wait later).
    fn wait_reply(&mut self, wait: Wait<'_>, what: &'static str) -> Result<()> {
        let slow = Slow { path: &self.path, what, table: None, want: 1 };
        match wait_readable(&self.stream, wait.deadline(), wait.interrupt, Some(&slow)) {
            Err(e @ Error::Interrupted { .. }) => {
                self.shut("interrupted while waiting for the server; items it had not committed were dropped");
                Err(e)
            }
            Err(Error::Timeout { partial, .. }) => Err(Error::Timeout {
                message: format!(
                    "{what}: the replay server did not answer within {:.3} s (its rate limiter may be holding this writer's \
                     earlier items back; nothing was sent for this call)",
                    wait.timeout.unwrap_or_default().as_secs_f64()
                ),
                partial,
            }),
            r => r,
        }
    }

    /// Reads the reply to the oldest commit message, waiting within `wait`.
    fn read_commit_reply(&mut self, wait: Wait<'_>) -> Result<()> {
        self.wait_reply(wait, "a writer's commit")?;
        let items = self.inflight.pop_front().expect("a commit is in flight");
        match reply(&mut self.stream) {
            Ok((p::CREATED, body)) => {
                let mut r = Reader::new(&body);
                let n = r.count(p::MAX_ITEMS, "committed items")?;
                for _ in 0..n {
                    self.keys.push(r.u64()?);
                }
                r.done()
            }
            Ok((kind, _)) => Err(unexpected(kind)),
            Err(e @ Error::Io(_)) | Err(e @ Error::Corrupt(_)) => Err(e),
            Err(e) => {
                self.fail(Error::InvalidArgument(format!("{e} (a commit of {items} items was cut short there)")));
                Ok(())
            }
        }
    }

    /// Asks a durable store for a commit and waits for it (within `wait`): every item
    /// the server committed for this writer is then on disk.
    fn commit(&mut self, wait: Wait<'_>) -> Result<()> {
        let mut f = Frame::new(p::COMMIT);
        f.u32(self.store);
        f.send(&mut self.stream)?;
        if let Err(e) = self.wait_reply(wait, "a durable store's commit") {
            // The reply is still due: the connection cannot be used for anything else.
            self.shut("a durable store's commit was not answered in time");
            return Err(match e {
                Error::Timeout { partial, .. } => Error::Timeout {
                    message: format!(
                        "the durable store's commit did not end within {:.3} s: this writer's items are in their tables \
                         but may not be on disk yet, and the writer is closed",
                        wait.timeout.unwrap_or_default().as_secs_f64()
                    ),
                    partial,
                },
                e => e,
            });
        }
        match reply(&mut self.stream)? {
            (p::OK, _) => Ok(()),
            (kind, _) => Err(unexpected(kind)),
        }
    }

    /// Reads commit replies until at most `keep` messages are in flight.
    fn drain(&mut self, keep: usize, wait: Wait<'_>) -> Result<()> {
        let deadline = wait.deadline();
        while self.inflight.len() > keep {
            self.read_commit_reply(wait.until(deadline))?;
        }
        Ok(())
    }

    /// Commit messages that queueing `items` more items completes (and sends).
    fn sends_for(&self, items: usize) -> usize {
        (self.pending_items as usize + items) / BATCH as usize
    }

    /// Messages that may stay in flight before `items` more items are queued, so
    /// that queueing them waits for nothing.
    fn room_for(&self, items: usize) -> usize {
        MAX_INFLIGHT.saturating_sub(self.sends_for(items))
    }

    /// Adds an item to the pending message, sending it when full. Waits (within
    /// `wait`) only when more than [`MAX_INFLIGHT`] messages would be in flight.
    fn push_item(&mut self, table: u32, priority: f64, window: &Window, record: &[u8], wait: Wait<'_>) -> Result<()> {
        // Payload: timeout (none: the writer waits in `flush`), item count, items.
        let f = self.pending.get_or_insert_with(|| {
            let mut f = Frame::new(p::CREATE);
            f.i64(-1).u32(0);
            f
        });
        f.u32(table).f64(priority).ranges(window.ranges()).bytes(record);
        self.pending_items += 1;
        if self.pending_items >= BATCH || f.payload_len() > p::MAX_FRAME / 2 {
            self.send_pending()?;
            self.drain(MAX_INFLIGHT, wait)?;
        }
        Ok(())
    }
}

// SAFETY: the server leases a block to one connection only, from its free queue,
// and keeps its own reference until this writer sends RELEASE for it, which happens
// only when `counts` (this writer's references) drops to zero; leased blocks outside
// the store are refused in `lease`.
unsafe impl BlockSource for LeasedBlocks {
    fn columns(&self) -> &Columns {
        &self.columns
    }

    /// Replies come in order, so the commits in flight are answered first: that
    /// wait (the server's rate limiter may hold them) gives up within `wait` with
    /// nothing sent for the lease. The lease itself is answered at once (or within
    /// the store's limbo wait); giving up on it closes the writer.
    fn lease(&mut self, wait: Wait<'_>) -> Result<u32> {
        self.check_open()?;
        if let Some(block) = self.spares.pop() {
            self.counts.insert(block, 1);
            return Ok(block);
        }
        let deadline = wait.deadline();
        self.send_pending()?;
        self.drain(0, wait.until(deadline))?;
        self.spares_wanted = (self.spares_wanted * 2).max(1).min(self.max_spares);
        let mut f = Frame::new(p::LEASE);
        f.u32(self.store).u32(self.spares_wanted);
        f.send(&mut self.stream)?;
        if let Err(e) = self.wait_reply(wait.until(deadline), "a writer's lease") {
            self.shut("gave up waiting for a block; items it had not committed were dropped");
            return Err(match e {
                Error::Timeout { partial, .. } => Error::Timeout {
                    message: "a writer's lease: the replay server did not hand out a block in time; the writer is closed \
                              (the reply was due) and the items it had not committed were dropped"
                        .into(),
                    partial,
                },
                e => e,
            });
        }
        let (kind, body) = reply(&mut self.stream)?;
        if kind != p::LEASED {
            return Err(unexpected(kind));
        }
        let mut r = Reader::new(&body);
        let n = r.count(self.spares_wanted + 1, "leased blocks")?;
        let blocks = (0..n).map(|_| r.u32()).collect::<Result<Vec<u32>>>()?;
        r.done()?;
        let blocks_in_store = self.columns.capacity() / self.columns.block_steps() as u64;
        if let Some(b) = blocks.iter().find(|&&b| b as u64 >= blocks_in_store) {
            return Err(Error::Corrupt(format!("leased block {b} is outside the store")));
        }
        let Some((&block, spares)) = blocks.split_first() else {
            return Err(Error::Corrupt("a lease reply without a block".into()));
        };
        // Spares go out in the reply's order (`pop` takes from the back).
        self.spares.extend(spares.iter().rev());
        self.counts.insert(block, 1);
        Ok(block)
    }

    fn retain(&mut self, block: u32) {
        *self.counts.entry(block).or_insert(0) += 1;
    }

    fn release(&mut self, block: u32) {
        let Some(n) = self.counts.get_mut(&block) else { return };
        *n -= 1;
        if *n > 0 {
            return;
        }
        self.counts.remove(&block);
        if self.closed.is_some() {
            return; // the server released everything when the connection shut
        }
        // Told with the next message: after the commits that reference the block (the
        // server handles messages in order), and at once when many have piled up.
        self.releasing.push(block);
        if self.releasing.len() >= RELEASE_BATCH {
            if let Err(e) = self.send_pending() {
                self.fail(e);
            }
        }
    }
}

/// A writer of a local client: the core writer over blocks leased from the
/// server, committing items in batches.
pub struct LocalWriter {
    writer: Writer<LeasedBlocks>,
    info: Arc<ServerInfo>,
}

impl LocalWriter {
    fn check(&mut self) -> Result<()> {
        let blocks = self.writer.source_mut();
        blocks.check_open()?;
        match blocks.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub fn columns(&self) -> &Columns {
        &self.writer.source().columns
    }

    /// The index of `table`, which must be over this writer's store.
    fn table_of_store(&self, table: &str) -> Result<u32> {
        let t = self.info.table(table)?;
        if self.info.tables[t as usize].store != self.writer.source().store {
            return Err(Error::InvalidArgument(format!("table '{table}' is over a different store than this writer")));
        }
        Ok(t)
    }

    /// Queues one item per window. The wait for room comes first, so a call that
    /// gives up then has queued nothing; only a call of more items than
    /// [`MAX_INFLIGHT`] messages hold may wait again midway, and then says how many
    /// it queued.
    fn queue(&mut self, table: &str, t: u32, windows: &[Window], priorities: &[f64], records: &[u8], wait: Wait<'_>) -> Result<()> {
        let deadline = wait.deadline();
        let n = windows.len();
        if records.len() % n.max(1) != 0 || records.len() / n.max(1) > p::MAX_RECORD as usize {
            return Err(Error::InvalidArgument(format!(
                "table '{table}': {} bytes of attribute records for {n} items; expected one record per item",
                records.len()
            )));
        }
        let record = records.len() / n.max(1);
        let blocks = self.writer.source_mut();
        let room = blocks.room_for(windows.len());
        blocks.drain(room, wait)?;
        for (i, (window, &p)) in windows.iter().zip(priorities).enumerate() {
            let r = &records[i * record..(i + 1) * record];
            if let Err(e) = blocks.push_item(t, p, window, r, wait.until(deadline)) {
                let n = windows.len();
                return Err(match e {
                    Error::Timeout { message, partial } => Error::Timeout {
                        message: format!("{message}: {} of {n} items for table '{table}' were queued (they commit with the next flush), the rest were not", i + 1),
                        partial,
                    },
                    e => e,
                });
            }
        }
        Ok(())
    }
}

impl StepWriter for LocalWriter {
    fn append(&mut self, columns: &[&[u8]], wait: Wait<'_>) -> Result<()> {
        self.check()?;
        self.writer.append(columns, wait)
    }

    fn extend(&mut self, columns: &[&[u8]], steps: usize, wait: Wait<'_>) -> Result<()> {
        self.check()?;
        self.writer.extend(columns, steps, wait)
    }

    /// A new block is one round trip, after the commits in flight are answered.
    fn may_wait(&self, steps: usize) -> bool {
        self.writer.needs_block(steps)
    }

    fn items_may_wait(&self, items: usize) -> bool {
        let blocks = self.writer.source();
        blocks.inflight.len() > blocks.room_for(items) || blocks.sends_for(items) > MAX_INFLIGHT
    }

    /// The item is sent with the next batch of commits.
    fn create_item(&mut self, table: &str, num_steps: u64, priority: f64, record: &[u8], wait: Wait<'_>) -> Result<()> {
        self.check()?;
        let t = self.table_of_store(table)?;
        check_priority(priority, || format!("table '{table}' new item"))?;
        let window = self.writer.window(table, num_steps)?;
        self.queue(table, t, std::slice::from_ref(&window), &[priority], record, wait)
    }

    fn create_items(&mut self, table: &str, num_steps: u64, priorities: &[f64], records: &[u8], wait: Wait<'_>) -> Result<()> {
        self.check()?;
        let t = self.table_of_store(table)?;
        for (i, &p) in priorities.iter().enumerate() {
            check_priority(p, || format!("table '{table}' item {i}"))?;
        }
        let windows = self.writer.windows(table, num_steps, priorities.len() as u64)?;
        self.queue(table, t, &windows, priorities, records, wait)
    }

    /// Waits for nothing: the episode's blocks are released with the next message.
    fn end_episode(&mut self, _wait: Wait<'_>) -> Result<()> {
        self.check()?;
        self.writer.end_episode();
        self.check()
    }

    fn episode_steps(&self) -> u64 {
        self.writer.episode_steps()
    }

    /// `wait`'s interrupt is checked every [`POLL`] while the server has not answered.
    fn flush(&mut self, wait: Wait<'_>) -> Result<Vec<u64>> {
        self.check()?;
        let blocks = self.writer.source_mut();
        blocks.send_pending()?;
        blocks.drain(0, wait).map_err(|e| match e {
            Error::Timeout { partial, .. } => Error::Timeout {
                message: format!(
                    "items were not all committed within {:.3} s (the writer goes on: flush again to keep waiting)",
                    wait.timeout.unwrap_or_default().as_secs_f64()
                ),
                partial,
            },
            e => e,
        })?;
        self.check()?;
        let blocks = self.writer.source_mut();
        if blocks.durable {
            blocks.commit(wait)?;
        }
        Ok(std::mem::take(&mut self.writer.source_mut().keys))
    }

    fn close(&mut self, wait: Wait<'_>) -> Result<()> {
        if self.writer.source().closed.is_some() {
            return Ok(());
        }
        let flushed = self.flush(wait);
        if flushed.is_err() {
            self.abort();
        }
        self.writer.close();
        self.writer.source_mut().shut("closed");
        flushed.map(|_| ())
    }

    fn abort(&mut self) {
        self.writer.source_mut().shut("aborted; items it had not committed were dropped");
        self.writer.close();
    }
}

//! Same-host clients of a replay server.
//!
//! A client connects to the server's Unix socket, learns its stores (shared-memory
//! files, signatures) and tables, and maps the stores itself. A [`ClientWriter`]
//! leases blocks from the server, appends steps straight into them, and commits
//! items in batches of small records; a [`ClientSample`] carries the row windows
//! the server selected, and the client copies the rows out of shared memory
//! itself. The server holds the sampled blocks until the client says it is done.
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
use reprise_core::signature::{DType, Field, Signature};
use reprise_core::{Collect, Columns, SampledItem, TableInfo, Window, Writer};

use crate::protocol::{self as p, Frame, Reader};

/// Items per commit message.
const BATCH: u32 = 256;
/// Commit messages a writer sends before it waits for the oldest reply.
const MAX_INFLIGHT: usize = 8;

pub struct TableRef {
    pub name: String,
    pub store: u32,
}

/// What the server said in its greeting.
pub struct ServerInfo {
    pub pid: u32,
    pub stores: Vec<Arc<Columns>>,
    pub tables: Vec<TableRef>,
}

/// Checked while waiting for a reply; true means "give up" (Ctrl-C).
pub type Interrupt<'a> = Option<&'a (dyn Fn() -> bool + Sync)>;

/// Waits until a reply can be read, the deadline passes (`Timeout`) or the
/// interrupt check fires. An interrupted connection is shut down: its reply would
/// arrive later and confuse the next call, and the server, seeing the client go,
/// stops waiting and releases what the connection held.
fn wait_readable(stream: &UnixStream, deadline: Option<Instant>, interrupt: Interrupt<'_>) -> Result<()> {
    use std::os::fd::AsRawFd;
    if deadline.is_none() && interrupt.is_none() {
        return Ok(());
    }
    loop {
        let mut slice = if interrupt.is_some() { 50 } else { i32::MAX };
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128) as i32;
            slice = slice.min(left);
        }
        let mut fds = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for an open socket.
        if unsafe { libc::poll(&mut fds, 1, slice) } > 0 {
            return Ok(());
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::Timeout { message: "the replay server did not answer in time".into(), partial: Default::default() });
        }
        if interrupt.is_some_and(|stop| stop()) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return Err(Error::Interrupted { partial: Default::default() });
        }
    }
}

fn unexpected(kind: u8) -> Error {
    Error::Corrupt(format!("unexpected reply kind {kind} from the replay server"))
}

/// Sends a request and reads its reply; an `ERROR` reply becomes the error.
fn call(stream: &mut UnixStream, frame: Frame, interrupt: Interrupt<'_>) -> Result<(u8, Vec<u8>)> {
    frame.send(stream)?;
    wait_readable(stream, None, interrupt)?;
    reply(stream)
}

fn reply(stream: &mut UnixStream) -> Result<(u8, Vec<u8>)> {
    let (kind, body) = p::read_frame(stream)?;
    if kind == p::ERROR {
        let mut r = Reader::new(&body);
        return Err(p::error_from(r.u8()?, r.str()?));
    }
    Ok((kind, body))
}

fn hello(path: &Path) -> Result<(UnixStream, ServerInfo)> {
    let mut stream = UnixStream::connect(path).map_err(|e| {
        Error::Io(format!("cannot connect to a replay server at unix://{}: {e}", path.display()))
    })?;
    let mut f = Frame::new(p::HELLO);
    f.u32(p::VERSION);
    let (kind, body) = call(&mut stream, f, None)?;
    if kind != p::HELLO_OK {
        return Err(unexpected(kind));
    }
    let mut r = Reader::new(&body);
    let pid = r.u32()?;
    let mut stores = Vec::new();
    for _ in 0..r.count(1024, "stores")? {
        let path = PathBuf::from(r.str()?);
        let (capacity, block_steps) = (r.u64()?, r.u32()?);
        let mut fields = Vec::new();
        for _ in 0..r.count(4096, "fields")? {
            let name = r.str()?;
            let dtype = DType::from_name(&r.str()?).map_err(|e| Error::Corrupt(e.to_string()))?;
            let ndim = r.count(32, "dimensions")?;
            let shape = (0..ndim).map(|_| r.u64().map(|d| d as usize)).collect::<Result<Vec<_>>>()?;
            fields.push(Field::new(&name, dtype, shape).map_err(|e| Error::Corrupt(e.to_string()))?);
        }
        let sig = Signature::new(fields).map_err(|e| Error::Corrupt(e.to_string()))?;
        stores.push(Arc::new(Columns::attach(&path, sig, capacity, block_steps)?));
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
    Ok((stream, ServerInfo { pid, stores, tables }))
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
}

impl Shared {
    fn table(&self, name: &str) -> Result<u32> {
        self.info.table(name)
    }

    fn call(&self, frame: Frame) -> Result<(u8, Vec<u8>)> {
        call(&mut self.stream.lock(), frame, None)
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
        Ok(LocalClient { shared: Arc::new(Shared { path: path.to_path_buf(), info, stream: Mutex::new(stream) }) })
    }

    /// Closes this client's connection (writers have their own). Later calls on
    /// it fail; samples already taken stay valid.
    pub fn close(&self) {
        let _ = self.shared.stream.lock().shutdown(std::net::Shutdown::Both);
    }

    pub fn server_pid(&self) -> u32 {
        self.shared.info.pid
    }

    pub fn table_names(&self) -> Vec<String> {
        self.shared.info.tables.iter().map(|t| t.name.clone()).collect()
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

    /// A writer (on its own connection) into the store of `table` (default: the
    /// first table's store). Items can go to any table over that store.
    pub fn writer(&self, table: Option<&str>, max_sequence_length: Option<u64>) -> Result<ClientWriter> {
        let columns = self.columns(table)?;
        let store = self.shared.info.stores.iter().position(|c| Arc::ptr_eq(c, &columns)).expect("store is listed") as u32;
        let (stream, info) = hello(&self.shared.path)?;
        let blocks = RemoteBlocks {
            stream,
            columns,
            store,
            counts: HashMap::new(),
            pending: None,
            pending_items: 0,
            inflight: VecDeque::new(),
            failed: None,
        };
        Ok(ClientWriter { writer: Writer::new(blocks, max_sequence_length)?, info: Arc::new(info) })
    }

    /// Draws `n` items. When the deadline passes after some were drawn, returns
    /// them together with the `Timeout` error. While the server waits, `interrupt`
    /// is checked every 50 ms; when it fires the connection is closed.
    pub fn sample(&self, table: &str, n: u32, timeout: Option<Duration>, interrupt: Interrupt<'_>) -> Result<(ClientSample, Option<Error>)> {
        let t = self.shared.table(table)?;
        if n == 0 || n > p::MAX_ITEMS {
            return Err(Error::InvalidArgument(format!("sample size must be between 1 and {}, got {n}", p::MAX_ITEMS)));
        }
        let mut f = Frame::new(p::SAMPLE);
        f.u32(t).u32(n).i64(p::timeout_to_wire(timeout));
        let (kind, body) = call(&mut self.shared.stream.lock(), f, interrupt)?;
        if kind != p::SAMPLED {
            return Err(unexpected(kind));
        }
        let mut r = Reader::new(&body);
        let status = r.u8()?;
        let message = r.str()?;
        let id = r.u64()?;
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
        r.done()?;
        let columns = self.shared.info.stores[self.shared.info.tables[t as usize].store as usize].clone();
        for item in &items {
            let len: u64 = item.window.ranges().iter().map(|r| r.len as u64).sum();
            let inside = item.window.ranges().iter().all(|r| r.start + r.len as u64 <= columns.capacity());
            if len != item.length as u64 || !inside {
                return Err(Error::Corrupt(format!("sampled item {} has rows outside the store", item.key)));
            }
        }
        let sample = ClientSample { items, table_size, id, columns, client: self.shared.clone() };
        let error = (status != 0).then(|| Error::Timeout { message, partial: Default::default() });
        Ok((sample, error))
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
        let (kind, body) = self.shared.call(f)?;
        if kind != p::COUNT {
            return Err(unexpected(kind));
        }
        Reader::new(&body).u64()
    }

    /// Sets priorities by key; returns how many keys were still present.
    pub fn update_priorities(&self, table: &str, keys: &[u64], priorities: &[f64]) -> Result<u64> {
        if keys.len() != priorities.len() {
            return Err(Error::InvalidArgument(format!("{} keys but {} priorities; expected one per key", keys.len(), priorities.len())));
        }
        self.keyed(p::UPDATE, table, keys, Some(priorities))
    }

    /// Removes items by key; returns how many were still present.
    pub fn delete(&self, table: &str, keys: &[u64]) -> Result<u64> {
        self.keyed(p::DELETE, table, keys, None)
    }

    pub fn reset(&self, table: &str) -> Result<()> {
        let mut f = Frame::new(p::RESET);
        f.u32(self.shared.table(table)?);
        match self.shared.call(f)? {
            (p::OK, _) => Ok(()),
            (kind, _) => Err(unexpected(kind)),
        }
    }

    /// Asks the server to write a checkpoint of its tables; returns its path.
    pub fn checkpoint(&self) -> Result<String> {
        let (kind, body) = self.shared.call(Frame::new(p::CHECKPOINT))?;
        if kind != p::CHECKPOINTED {
            return Err(unexpected(kind));
        }
        let mut r = Reader::new(&body);
        let path = r.str()?;
        r.done()?;
        Ok(path)
    }

    pub fn info(&self) -> Result<Vec<TableInfo>> {
        let (kind, body) = self.shared.call(Frame::new(p::INFO))?;
        if kind != p::INFO_OK {
            return Err(unexpected(kind));
        }
        let mut r = Reader::new(&body);
        let n = r.count(1 << 16, "tables")?;
        let infos = (0..n).map(|_| p::get_info(&mut r)).collect::<Result<Vec<_>>>()?;
        r.done()?;
        Ok(infos)
    }
}

/// Items drawn by the server; their rows are read in place from shared memory.
/// The server keeps them from being reused until this is dropped.
pub struct ClientSample {
    items: Vec<SampledItem>,
    table_size: u64,
    id: u64,
    columns: Arc<Columns>,
    client: Arc<Shared>,
}

impl Collect for ClientSample {
    fn items(&self) -> &[SampledItem] {
        &self.items
    }
    fn table_size(&self) -> u64 {
        self.table_size
    }
    fn columns(&self) -> &Columns {
        &self.columns
    }
}

impl Drop for ClientSample {
    fn drop(&mut self) {
        let mut f = Frame::new(p::SAMPLE_DONE);
        f.u64(self.id);
        // A server that is gone has released the rows already.
        let _ = f.send(&mut *self.client.stream.lock());
    }
}

/// Blocks leased from the server over the writer's own connection.
pub struct RemoteBlocks {
    stream: UnixStream,
    columns: Arc<Columns>,
    store: u32,
    /// This writer's references per leased block; the server holds one per block.
    counts: HashMap<u32, u32>,
    pending: Option<Frame>,
    pending_items: u32,
    /// Items in each commit message still awaiting its reply.
    inflight: VecDeque<u32>,
    /// The first error a pipelined message came back with, raised at the next call.
    failed: Option<Error>,
}

impl RemoteBlocks {
    fn fail(&mut self, e: Error) {
        self.failed.get_or_insert(e);
    }

    /// Sends the pending commit message, if any.
    fn send_pending(&mut self) -> Result<()> {
        if let Some(mut f) = self.pending.take() {
            f.patch_u32(8, self.pending_items);
            f.send(&mut self.stream)?;
            self.inflight.push_back(self.pending_items);
            self.pending_items = 0;
        }
        Ok(())
    }

    /// Reads the reply to the oldest commit message.
    fn read_commit_reply(&mut self) -> Result<()> {
        let items = self.inflight.pop_front().expect("a commit is in flight");
        match reply(&mut self.stream) {
            Ok((p::CREATED, _)) => Ok(()),
            Ok((kind, _)) => Err(unexpected(kind)),
            Err(e @ Error::Io(_)) | Err(e @ Error::Corrupt(_)) => Err(e),
            Err(e) => {
                self.fail(Error::InvalidArgument(format!("{e} (a commit of {items} items was cut short there)")));
                Ok(())
            }
        }
    }

    fn drain(&mut self, keep: usize) -> Result<()> {
        while self.inflight.len() > keep {
            self.read_commit_reply()?;
        }
        Ok(())
    }

    fn push_item(&mut self, table: u32, priority: f64, window: &Window) -> Result<()> {
        // Payload: timeout (none: the writer waits in `flush`), item count, items.
        let f = self.pending.get_or_insert_with(|| {
            let mut f = Frame::new(p::CREATE);
            f.i64(-1).u32(0);
            f
        });
        f.u32(table).f64(priority).ranges(window.ranges());
        self.pending_items += 1;
        if self.pending_items >= BATCH || f.payload_len() > p::MAX_FRAME / 2 {
            self.send_pending()?;
            self.drain(MAX_INFLIGHT)?;
        }
        Ok(())
    }
}

impl BlockSource for RemoteBlocks {
    fn columns(&self) -> &Columns {
        &self.columns
    }

    fn lease(&mut self) -> Result<u32> {
        self.send_pending()?;
        let mut f = Frame::new(p::LEASE);
        f.u32(self.store);
        f.send(&mut self.stream)?;
        self.drain(0)?;
        let (kind, body) = reply(&mut self.stream)?;
        if kind != p::LEASED {
            return Err(unexpected(kind));
        }
        let block = Reader::new(&body).u32()?;
        if block as u64 * self.columns.block_steps() as u64 >= self.columns.capacity() {
            return Err(Error::Corrupt(format!("leased block {block} is outside the store")));
        }
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
        // Commits that reference the block go first; the server handles messages in order.
        let sent = self.send_pending().and_then(|_| {
            let mut f = Frame::new(p::RELEASE);
            f.u32(self.store).u32(1).u32(block);
            f.send(&mut self.stream)
        });
        if let Err(e) = sent {
            self.fail(e);
        }
    }
}

/// A writer of a same-host client: the core writer over blocks leased from the
/// server, committing items in batches.
pub struct ClientWriter {
    writer: Writer<RemoteBlocks>,
    info: Arc<ServerInfo>,
}

impl ClientWriter {
    fn check(&mut self) -> Result<()> {
        match self.writer.source_mut().failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub fn columns(&self) -> &Columns {
        &self.writer.source().columns
    }

    pub fn append(&mut self, columns: &[&[u8]]) -> Result<()> {
        self.check()?;
        self.writer.append(columns)
    }

    pub fn extend(&mut self, columns: &[&[u8]], steps: usize) -> Result<()> {
        self.check()?;
        self.writer.extend(columns, steps)
    }

    /// Queues an item over the last `num_steps` steps for `table`. It is sent with
    /// the next batch; `flush` waits until every queued item is in its table.
    pub fn create_item(&mut self, table: &str, num_steps: u64, priority: f64) -> Result<()> {
        self.check()?;
        let t = self.table_of_store(table)?;
        check_priority(priority, || format!("table '{table}' new item"))?;
        let window = self.writer.window(table, num_steps)?;
        self.writer.source_mut().push_item(t, priority, &window)
    }

    /// Queues one item per priority over `num_steps` steps ending at each of the
    /// last `priorities.len()` steps (oldest first), as `Writer::create_items`.
    pub fn create_items(&mut self, table: &str, num_steps: u64, priorities: &[f64]) -> Result<()> {
        self.check()?;
        let t = self.table_of_store(table)?;
        for (i, &p) in priorities.iter().enumerate() {
            check_priority(p, || format!("table '{table}' item {i}"))?;
        }
        let windows = self.writer.windows(table, num_steps, priorities.len() as u64)?;
        for (window, &p) in windows.iter().zip(priorities) {
            self.writer.source_mut().push_item(t, p, window)?;
        }
        Ok(())
    }

    /// The index of `table`, which must be over this writer's store.
    fn table_of_store(&self, table: &str) -> Result<u32> {
        let t = self.info.table(table)?;
        if self.info.tables[t as usize].store != self.writer.source().store {
            return Err(Error::InvalidArgument(format!("table '{table}' is over a different store than this writer")));
        }
        Ok(t)
    }

    /// Sends queued items and waits until the server has put every one in its
    /// table (up to `timeout`; `interrupt` as for `LocalClient::sample`).
    pub fn flush(&mut self, timeout: Option<Duration>, interrupt: Interrupt<'_>) -> Result<()> {
        self.check()?;
        let deadline = timeout.map(|t| Instant::now() + t);
        let blocks = self.writer.source_mut();
        blocks.send_pending()?;
        while !blocks.inflight.is_empty() {
            wait_readable(&blocks.stream, deadline, interrupt).map_err(|e| match e {
                Error::Timeout { .. } => Error::Timeout {
                    message: format!("items were not all committed within {:.3} s", timeout.unwrap_or_default().as_secs_f64()),
                    partial: Default::default(),
                },
                other => other,
            })?;
            blocks.read_commit_reply()?;
        }
        self.check()
    }

    pub fn end_episode(&mut self) -> Result<()> {
        self.check()?;
        self.writer.end_episode();
        self.check()
    }

    pub fn episode_steps(&self) -> u64 {
        self.writer.episode_steps()
    }

    /// Commits what is queued, ends the episode and gives back every block.
    pub fn close(&mut self) -> Result<()> {
        let flushed = self.flush(None, None);
        self.writer.close();
        flushed
    }
}

//! The local server: tables served to local clients (same host) over a Unix socket.
//!
//! One thread accepts connections; each connection gets a thread that handles its
//! requests in order. A connection holds references on the blocks it leased and
//! on the rows of the samples it has not finished reading; when it closes —
//! cleanly or because the client was killed — all of them are released, so a
//! dead client's blocks return to the allocator and nothing it had not committed
//! becomes visible. Commits are checked: an item may only reference rows of blocks
//! its own connection holds.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use reprise_wire::codes::local_code;
use reprise_wire::local::{self as p, Frame, Reader};
use reprise_core::blocks::BlockSource;
use reprise_core::error::{Error, Partial, Result};
use reprise_core::item::{for_each_block, NewItem};
use reprise_core::{SampleBatch, Store, Table, Wait, Window};

use crate::checkpoint::Checkpointer;
use crate::monitor::{ClientGuard, Monitor};
use crate::naming;

static SERVER_COUNTER: AtomicU64 = AtomicU64::new(0);

struct Shared {
    tables: Vec<Table>,
    monitor: Arc<Monitor>,
    checkpoint: Option<Checkpointer>,
    stores: Vec<Store>,
    table_store: Vec<u32>,
    stopping: AtomicBool,
    conns: Mutex<HashMap<u64, UnixStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A running local server; stops (and removes its socket and lock file) when
/// dropped.
pub struct LocalServer {
    name: String,
    path: PathBuf,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    /// Holds the name (see `naming::claim_name`) until the server stops.
    lock: Option<naming::NameLock>,
}

impl LocalServer {
    /// Serves `tables` under `name` (default `reprise-<pid>-<n>`). Fails if a live
    /// server already uses the name; cleans up after dead ones (their sockets and
    /// lock files, whatever their names, and their shared-memory files).
    pub fn start(tables: Vec<Table>, name: Option<&str>) -> Result<LocalServer> {
        Self::start_with(tables, name, None)
    }

    /// [`LocalServer::start`] with a checkpointer for clients' CHECKPOINT requests
    /// (the built-in one: [`crate::checkpoint::to_directory`]).
    pub fn start_with(tables: Vec<Table>, name: Option<&str>, checkpoint: Option<Checkpointer>) -> Result<LocalServer> {
        Self::start_monitored(tables, name, checkpoint, None)
    }

    /// [`LocalServer::start_with`] reporting its clients to `monitor` (shared with
    /// a remote server over the same tables; None: a monitor of its own).
    pub fn start_monitored(tables: Vec<Table>, name: Option<&str>, checkpoint: Option<Checkpointer>, monitor: Option<Arc<Monitor>>) -> Result<LocalServer> {
        let (stores, table_store) = crate::stores_of(&tables)?;
        let monitor = monitor.unwrap_or_else(|| Monitor::new(tables.clone()));
        let name = match name {
            Some(n) => n.to_string(),
            None => format!("reprise-{}-{}", std::process::id(), SERVER_COUNTER.fetch_add(1, Ordering::Relaxed)),
        };
        naming::check_name(&name)?;
        let dir = naming::socket_dir()?;
        let lock = naming::claim_name(&dir, &name)?;
        naming::remove_stale_names(&dir);
        let path = dir.join(format!("{name}.sock"));
        if let Some(dir) = stores[0].path().parent() {
            naming::remove_stale_stores(dir);
        }
        let listener = UnixListener::bind(&path).map_err(|e| Error::Io(format!("cannot listen at {}: {e}", path.display())))?;
        // From here a failure removes the socket (the lock file goes with `lock`).
        let unbind = |e: Error| {
            let _ = std::fs::remove_file(&path);
            e
        };
        listener.set_nonblocking(true).map_err(|e| unbind(Error::Io(format!("cannot configure {}: {e}", path.display()))))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| unbind(Error::Io(format!("cannot make {} private: {e}", path.display()))))?;
        monitor.set_local_name(&name);
        let shared = Arc::new(Shared {
            tables,
            monitor,
            checkpoint,
            stores,
            table_store,
            stopping: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        });
        let accept = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("reprise-accept-{name}"))
                .spawn(move || accept_loop(listener, shared))
                .map_err(|e| unbind(Error::Io(format!("cannot start the server thread: {e}"))))?
        };
        Ok(LocalServer { name, path, shared, accept: Some(accept), lock: Some(lock) })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The socket clients connect to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `unix://<socket path>`.
    pub fn address(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    /// Stops accepting, closes every connection (releasing what they held) and
    /// removes the socket, then the lock file (releasing the name). Idempotent.
    pub fn stop(&mut self) {
        let Some(accept) = self.accept.take() else { return };
        // The accept loop polls the flag; then wake every connection's read or wait.
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = accept.join();
        for s in self.shared.conns.lock().values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        let threads = std::mem::take(&mut *self.shared.threads.lock());
        for t in threads {
            let _ = t.join();
        }
        // The socket goes while the name is still ours, so a server that claims
        // the name next never loses its own socket to this removal.
        let _ = std::fs::remove_file(&self.path);
        self.lock = None;
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Accepts connections until the server stops, checking the stop flag at least
/// every `Wait::POLL` (the listener is non-blocking), so stopping never depends on
/// the socket file still being there.
fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    use std::os::fd::AsRawFd;
    let mut next = 0u64;
    while !shared.stopping.load(Ordering::SeqCst) {
        let mut fds = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the open listener.
        if unsafe { libc::poll(&mut fds, 1, Wait::POLL.as_millis() as i32) } <= 0 {
            continue;
        }
        let Ok((stream, _)) = listener.accept() else { continue };
        if stream.set_nonblocking(false).is_err() {
            continue;
        }
        // The socket is 0600 already; the peer check also stops a process that
        // got hold of it some other way.
        let Some((uid, pid)) = naming::peer_cred(&stream) else { continue };
        if uid != naming::my_uid() {
            continue;
        }
        let id = next;
        next += 1;
        let Ok(clone) = stream.try_clone() else { continue };
        shared.conns.lock().insert(id, clone);
        let s = shared.clone();
        let spawned = std::thread::Builder::new().name(format!("reprise-conn-{id}")).spawn(move || {
            let client = s.monitor.connect("local", format!("pid {pid}"), None);
            Connection { shared: s.clone(), stream, held: HashMap::new(), samples: HashMap::new(), next_sample: 0, client }.run();
            s.conns.lock().remove(&id);
        });
        match spawned {
            Ok(h) => {
                let mut threads = shared.threads.lock();
                threads.retain(|t| !t.is_finished());
                threads.push(h);
            }
            Err(_) => {
                shared.conns.lock().remove(&id);
            }
        }
    }
}

struct Connection {
    shared: Arc<Shared>,
    stream: UnixStream,
    /// References this connection holds, per (store, block).
    held: HashMap<(u32, u32), u32>,
    /// Samples whose rows the client is still reading.
    samples: HashMap<u64, SampleBatch>,
    next_sample: u64,
    /// This client in the server's monitor (removed when the connection ends).
    client: ClientGuard,
}

fn error_frame(e: &Error) -> Frame {
    let mut f = Frame::new(p::ERROR);
    f.u8(local_code(e)).str(&e.to_string());
    f
}

impl Connection {
    fn run(mut self) {
        loop {
            let Ok((kind, body)) = p::read_frame(&mut self.stream) else { break };
            match self.handle(kind, &body) {
                Ok(None) => {}
                Ok(Some(reply)) => {
                    if reply.send(&mut self.stream).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    let fatal = matches!(e, Error::Corrupt(_) | Error::Io(_) | Error::Interrupted { .. });
                    if error_frame(&e).send(&mut self.stream).is_err() || fatal {
                        break;
                    }
                }
            }
        }
        self.release_all();
    }

    fn release_all(&mut self) {
        for (&(store, block), &n) in &self.held {
            let mut s = self.shared.stores[store as usize].clone();
            (0..n).for_each(|_| s.release(block));
        }
        self.held.clear();
        self.samples.clear();
    }

    fn table(&self, t: u32) -> Result<&Table> {
        self.shared.tables.get(t as usize).ok_or_else(|| Error::NotFound(format!("no table number {t}")))
    }

    fn store(&self, s: u32) -> Result<&Store> {
        self.shared.stores.get(s as usize).ok_or_else(|| Error::NotFound(format!("no store number {s}")))
    }

    fn handle(&mut self, kind: u8, body: &[u8]) -> Result<Option<Frame>> {
        let mut r = Reader::new(body);
        let reply = match kind {
            p::HELLO => self.hello(&mut r)?,
            p::LEASE => {
                let store = r.u32()?;
                let spares = r.u32()?;
                r.done()?;
                if spares > p::MAX_SPARES {
                    return Err(Error::InvalidArgument(format!("a lease asked for {spares} spare blocks; at most {}", p::MAX_SPARES)));
                }
                let mut s = self.store(store)?.clone();
                let block = {
                    let stop = self.wait_stop();
                    s.lease(Wait { timeout: None, interrupt: Some(&stop) })?
                };
                // Spares only from free blocks: asking for them never evicts an item.
                let blocks: Vec<u32> = std::iter::once(block).chain((0..spares).map_while(|_| s.lease_free())).collect();
                let mut f = Frame::new(p::LEASED);
                f.u32(blocks.len() as u32);
                for &b in &blocks {
                    *self.held.entry((store, b)).or_insert(0) += 1;
                    f.u32(b);
                }
                Some(f)
            }
            p::RELEASE => {
                let store = r.u32()?;
                for _ in 0..r.count(p::MAX_ITEMS, "blocks")? {
                    let block = r.u32()?;
                    if let Some(n) = self.held.get_mut(&(store, block)) {
                        *n -= 1;
                        if *n == 0 {
                            self.held.remove(&(store, block));
                        }
                        self.shared.stores[store as usize].clone().release(block);
                    }
                }
                r.done()?;
                None
            }
            p::CREATE => Some(self.create(&mut r)?),
            p::SAMPLE => Some(self.sample(&mut r)?),
            p::SAMPLE_DONE => {
                let id = r.u64()?;
                r.done()?;
                self.samples.remove(&id);
                None
            }
            p::UPDATE | p::DELETE => {
                let table = self.table(r.u32()?)?.clone();
                let n = r.count(p::MAX_ITEMS, "keys")?;
                let keys = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
                let count = if kind == p::UPDATE {
                    let priorities = (0..n).map(|_| r.f64()).collect::<Result<Vec<_>>>()?;
                    r.done()?;
                    table.update_priorities(&keys, &priorities)? as u64
                } else {
                    r.done()?;
                    table.delete(&keys) as u64
                };
                let mut f = Frame::new(p::COUNT);
                f.u64(count);
                Some(f)
            }
            p::SET_VERSION => {
                let table = self.table(r.u32()?)?.clone();
                let version = r.i64()?;
                r.done()?;
                let mut f = Frame::new(p::COUNT);
                f.u64(table.set_version(version)?);
                Some(f)
            }
            p::UPDATE_ATTRIBUTE => {
                let table = self.table(r.u32()?)?.clone();
                let name = r.str()?;
                let n = r.count(p::MAX_ITEMS, "keys")?;
                let keys = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
                let values = r.bytes(8 * p::MAX_ITEMS as usize, "attribute values")?.to_vec();
                r.done()?;
                let mut f = Frame::new(p::COUNT);
                f.u64(table.update_attribute(&keys, &name, &values)? as u64);
                Some(f)
            }
            p::INFO => {
                r.done()?;
                let mut f = Frame::new(p::INFO_OK);
                f.u32(self.shared.tables.len() as u32);
                for t in &self.shared.tables {
                    p::put_info(&mut f, &t.info());
                }
                Some(f)
            }
            p::SNAPSHOT => {
                r.done()?;
                let mut f = Frame::new(p::SNAPSHOT_OK);
                f.str(&self.shared.monitor.snapshot().to_string());
                Some(f)
            }
            p::RESET => {
                let table = self.table(r.u32()?)?;
                r.done()?;
                table.reset();
                Some(Frame::new(p::OK))
            }
            p::COMMIT => {
                let store = r.u32()?;
                r.done()?;
                self.store(store)?.commit()?;
                Some(Frame::new(p::OK))
            }
            p::CHECKPOINT => {
                r.done()?;
                let Some(checkpoint) = self.shared.checkpoint.clone() else {
                    return Err(Error::InvalidArgument("this server has no checkpoint directory (checkpoint_dir)".into()));
                };
                let path = checkpoint()?;
                let mut f = Frame::new(p::CHECKPOINTED);
                f.str(&path);
                Some(f)
            }
            other => return Err(Error::Corrupt(format!("unknown request kind {other}"))),
        };
        Ok(reply)
    }

    fn hello(&self, r: &mut Reader<'_>) -> Result<Option<Frame>> {
        let version = r.u32()?;
        r.done()?;
        if version != p::VERSION {
            return Err(Error::Corrupt(format!("client speaks protocol version {version}, this server {}", p::VERSION)));
        }
        let mut f = Frame::new(p::HELLO_OK);
        f.u32(std::process::id()).u32(self.shared.stores.len() as u32);
        for s in &self.shared.stores {
            f.str(&s.path().to_string_lossy()).u64(s.capacity()).u32(s.block_steps());
            let durable = if s.durable().is_some() { p::DURABLE } else { 0 };
            f.u32(if s.persistent() { p::FILE_STORE } else { 0 } | durable);
            f.u32(s.signature().len() as u32);
            for field in s.signature().fields() {
                f.str(&field.name).str(field.dtype.name()).u32(field.shape.len() as u32);
                field.shape.iter().for_each(|&d| {
                    f.u64(d as u64);
                });
                f.u32(field.compress.unwrap_or(0) as u32);
                f.u32(field.stack).u32(match field.padding {
                    reprise_core::StackPadding::Reset => 0,
                    reprise_core::StackPadding::Zero => 1,
                });
            }
        }
        f.u32(self.shared.tables.len() as u32);
        for (t, &s) in self.shared.tables.iter().zip(&self.shared.table_store) {
            f.str(t.name()).u32(s);
        }
        Ok(Some(f))
    }

    /// Waits that give up when the server stops or the client goes away.
    fn wait_stop(&self) -> impl Fn() -> bool + Sync + '_ {
        move || self.shared.stopping.load(Ordering::SeqCst) || naming::peer_closed(&self.stream)
    }

    fn create(&mut self, r: &mut Reader<'_>) -> Result<Frame> {
        let timeout = p::timeout_from_wire(r.i64()?);
        let n = r.count(p::MAX_ITEMS, "items")?;
        let mut items: Vec<(u32, NewItem)> = Vec::with_capacity(n as usize);
        let mut records: Vec<&[u8]> = Vec::with_capacity(n as usize);
        for i in 0..n {
            let t = r.u32()?;
            let priority = r.f64()?;
            let ranges = r.ranges()?;
            records.push(r.bytes(p::MAX_RECORD as usize, "an item's attribute record")?);
            let table = self.table(t)?;
            let store = self.shared.table_store[t as usize];
            let capacity = table.store().capacity();
            let bs = table.store().block_steps();
            if ranges.is_empty() || ranges.iter().any(|x| x.len == 0 || x.start + x.len as u64 > capacity) {
                return Err(Error::InvalidArgument(format!("item {i} for table '{}' has rows outside the store", table.name())));
            }
            let mut owned = true;
            for_each_block(&ranges, bs, |b| owned &= self.held.contains_key(&(store, b)));
            if !owned {
                return Err(Error::InvalidArgument(format!(
                    "item {i} for table '{}' references rows of blocks this client does not hold",
                    table.name()
                )));
            }
            items.push((t, NewItem { window: Window::from_ranges(ranges), priority }));
        }
        r.done()?;
        let stop = self.wait_stop();
        let mut done = 0;
        let mut keys = Vec::with_capacity(items.len());
        while done < items.len() {
            // Consecutive items for the same table go in one insert.
            let t = items[done].0;
            let end = items[done..].iter().position(|(u, _)| *u != t).map_or(items.len(), |k| done + k);
            let batch: Vec<NewItem> = items[done..end].iter().map(|(_, it)| it.clone()).collect();
            let table = &self.shared.tables[t as usize];
            // The records are checked by the table (one whole record per item).
            let record_bytes = records[done..end].concat();
            let result = table.insert(&batch, &record_bytes, Wait { timeout, interrupt: Some(&stop) });
            let inserted = match &result {
                Ok(k) | Err(Error::Timeout { partial: Partial::Inserted(k), .. }) => k.len(),
                Err(_) => 0,
            };
            self.client.entry().inserted(t as usize, inserted as u64);
            match result {
                Ok(k) => {
                    keys.extend(k);
                    done = end
                }
                Err(Error::Timeout { message, partial: Partial::Inserted(k) }) => {
                    return Err(Error::Timeout { message: format!("{message}; {} of {} items committed", done + k.len(), items.len()), partial: Partial::Nothing })
                }
                Err(e) => return Err(e),
            }
        }
        let mut f = Frame::new(p::CREATED);
        f.u32(keys.len() as u32);
        keys.iter().for_each(|&k| {
            f.u64(k);
        });
        Ok(f)
    }

    fn sample(&mut self, r: &mut Reader<'_>) -> Result<Frame> {
        let t = r.u32()?;
        let table = self.table(t)?.clone();
        let n = r.count(p::MAX_ITEMS, "samples")?;
        let timeout = p::timeout_from_wire(r.i64()?);
        let tokens = r.u64()?;
        r.done()?;
        let stop = self.wait_stop();
        let wait = Wait { timeout, interrupt: Some(&stop) };
        let drawn = if tokens > 0 { table.sample_tokens(tokens, wait) } else { table.sample(n as usize, wait) };
        let (mut batch, message) = match drawn {
            Ok(b) => (b, None),
            Err(Error::Timeout { message, partial: Partial::Sampled(b) }) => (b.into_batch(), Some(message)),
            Err(e) => return Err(e),
        };
        drop(stop);
        self.client.entry().sampled(t as usize, batch.items.len() as u64);
        let id = self.next_sample;
        self.next_sample += 1;
        let mut f = Frame::new(p::SAMPLED);
        f.u8(message.is_some() as u8).str(message.as_deref().unwrap_or("")).u64(id).u64(batch.table_size).u32(batch.items.len() as u32);
        for it in &batch.items {
            f.u64(it.key).f64(it.probability).f64(it.priority).u32(it.times_sampled).u32(it.length).ranges(it.window.ranges());
        }
        f.bytes(&std::mem::take(&mut batch.attributes));
        self.samples.insert(id, batch);
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reprise_core::{DType, Field, RateLimiterConfig, SelectorSpec, Signature, TableConfig};

    fn table(store: &Store) -> Table {
        let config = TableConfig {
            name: "replay".into(),
            sampler: SelectorSpec::Fifo,
            remover: SelectorSpec::Fifo,
            max_size: 8,
            max_times_sampled: 0,
            rate_limiter: RateLimiterConfig::min_size(1).expect("a valid limiter"),
            seed: Some(0),
            evict_when_store_full: true,
            external_selection: false,
            extensions: reprise_core::ExtensionSpec::defaults(),
            attributes: Default::default(),
            max_staleness: None,
            groups: None,
        };
        Table::new(config, store).expect("a valid table")
    }

    #[test]
    fn a_stopped_server_has_removed_its_socket_and_lock_file_before_it_is_dropped() {
        let sig = Signature::new(vec![Field::new("v", DType::Int64, vec![]).unwrap()]).unwrap();
        let store = Store::new(sig, 64, 8, None).unwrap();
        let name = format!("t-stopfiles-{}", std::process::id());
        let table = table(&store);
        let mut server = LocalServer::start(vec![table.clone()], Some(&name)).unwrap();
        let lock = server.path().with_extension("lock");
        assert!(server.path().exists() && lock.exists());
        server.stop();
        assert!(!server.path().exists(), "the socket is still there");
        assert!(!lock.exists(), "the lock file is still there");
        // The name is free again while the stopped server is still alive.
        let again = LocalServer::start(vec![table], Some(&name)).unwrap();
        drop(again);
        assert!(!lock.exists(), "a dropped server left its lock file");
    }
}

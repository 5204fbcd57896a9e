//! Stores: the columns of step data ([`Columns`], in shared memory) plus the block
//! allocator and the tables over them.
//!
//! # Lock order
//! The engine's locks are taken in this order and never the other way, so no two
//! threads can wait on each other:
//!
//! 1. `store.bulk`: the store's bulk cursor ([`Store::claim_rows`] holds it while it
//!    leases blocks, which may evict);
//! 2. `store.tables`: the list of tables over the store (held only to copy the list
//!    or to register a name; eviction runs after it is released);
//! 3. `table.state`: one table's index (`table::Shared::state`), held for index work
//!    only, never while step data is copied; at most one table's at a time;
//! 4. the block allocator's lock (`blocks::BlockAllocator`), taken innermost to
//!    retain or release blocks, e.g. while a table removes an item.
//!
//! Condition variables wait on `table.state` alone. Step data is copied with no lock
//! held: a block's rows belong to the one writer that leased it until it commits.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::blocks::{BlockAllocator, BlockSource, Cursor};
use crate::error::{Error, Result};
use crate::invalid;
use crate::item::RowRange;
use crate::columns::Columns;
use crate::memory::default_directory;
use crate::signature::Signature;
use crate::wait::Wait;

/// What the store asks of each table over it when it must make room (see
/// [`Store::lease_block`]). The table module implements it; the store holds its
/// tables only as `Weak<dyn TableOverStore>`, so this module sits below `table`.
pub(crate) trait TableOverStore: Send + Sync {
    /// References that the table's items hold on `block`.
    fn item_refs(&self, block: u32) -> u32;
    /// False for tables made with `evict_when_store_full = false` (queues, stacks).
    fn evicts_when_store_full(&self) -> bool;
    /// Evicts every item that references `block`.
    fn evict_block(&self, block: u32, store: &Store);
    /// The table itself, for the table module to downcast.
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// A durable store's commits as the store sees them: [`crate::durable`] implements
/// them, and the store holds them as a trait object so that this module sits below
/// `checkpoint` and `durable`, which its commits use.
pub trait Commits: Send + Sync {
    /// Returns once every item in `store`'s tables when it was called is on disk.
    fn commit(&self, store: &Store) -> Result<()>;
    fn stats(&self) -> CommitStats;
}

/// What [`Commits::stats`] reports: successful commits and the time spent in them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommitStats {
    pub commits: u64,
    pub seconds: f64,
    pub last_seconds: f64,
}

/// Blocks a full durable store evicts before one commit frees them all: 1/64 of its
/// blocks, at least 1 and at most 64.
pub(crate) fn durable_eviction_group(num_blocks: u32) -> usize {
    (num_blocks as usize / 64).clamp(1, 64)
}

pub(crate) struct StoreInner {
    columns: Columns,
    pub(crate) allocator: BlockAllocator,
    bulk: Mutex<Cursor>,
    tables: Mutex<Vec<(String, Weak<dyn TableOverStore>)>>,
    /// Times a lease found every block held (nothing free, nothing evictable): writers
    /// that keep their whole episode by default then keep only what their items need.
    pressure: std::sync::atomic::AtomicU64,
    /// A file store: its file stays (see [`Store::create_file`]).
    persistent: bool,
    /// A durable file store's commits (see [`crate::durable`]).
    durable: std::sync::OnceLock<Box<dyn Commits>>,
}

/// How long a lease waits in all for blocks in limbo before it evicts anyway
/// (device reads take micro- to milliseconds; this bounds a stalled one).
pub const LIMBO_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A pinned epoch of a store (see [`Store::pin`] and `blocks`' module doc);
/// dropping it unpins.
pub struct Epoch {
    store: Store,
    epoch: u64,
}

impl Drop for Epoch {
    fn drop(&mut self) {
        self.store.inner.allocator.unpin(self.epoch);
    }
}

/// A cheap handle to one store; clones share it.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<StoreInner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({}, capacity={})", self.signature().describe(), self.capacity())
    }
}

impl Store {
    /// Creates a store of at least `capacity` steps (rounded up to whole blocks) in
    /// a new 0600 file under `directory` (default /dev/shm).
    pub fn new(
        signature: Signature,
        capacity: u64,
        block_steps: u32,
        directory: Option<&Path>,
    ) -> Result<Store> {
        Store::create(signature, capacity, block_steps, directory, false)
    }

    /// [`Store::new`], and with `huge_pages` the columns must be backed by huge
    /// pages: a `directory` that cannot give them is refused (see [`crate::memory`]).
    pub fn create(
        signature: Signature,
        capacity: u64,
        block_steps: u32,
        directory: Option<&Path>,
        huge_pages: bool,
    ) -> Result<Store> {
        let capacity = Self::whole_blocks(capacity, block_steps)?;
        let dir: PathBuf = directory.map(Path::to_path_buf).unwrap_or_else(default_directory);
        let columns = Columns::create(signature, capacity, block_steps, &dir, huge_pages)?;
        Ok(Store::over(columns, false))
    }

    /// Creates a *file store*: its columns in a new file at `path` (on a disk: the
    /// page cache caches them) that stays when the store goes, for
    /// [`Store::open_file`] to map again. Its blocks start free.
    pub fn create_file(signature: Signature, capacity: u64, block_steps: u32, path: &Path) -> Result<Store> {
        let capacity = Self::whole_blocks(capacity, block_steps)?;
        let columns = Columns::create_file(signature, capacity, block_steps, path)?;
        Ok(Store::over(columns, true))
    }

    /// Maps the columns of a file store made by [`Store::create_file`] with the
    /// same signature, capacity and `block_steps`. Every block starts free; a
    /// restore of the store's tables reserves theirs in place
    /// ([`Store::reserve_blocks_in_place`]).
    pub fn open_file(path: &Path, signature: Signature, capacity: u64, block_steps: u32) -> Result<Store> {
        let columns = Columns::attach_file(path, signature, capacity, block_steps)?;
        Ok(Store::over(columns, true))
    }

    fn whole_blocks(capacity: u64, block_steps: u32) -> Result<u64> {
        if capacity == 0 {
            return Err(invalid!("capacity must be >= 1 step, got 0"));
        }
        if block_steps == 0 {
            return Err(invalid!("block_steps must be >= 1, got 0"));
        }
        let num_blocks = capacity.div_ceil(block_steps as u64);
        if num_blocks > u32::MAX as u64 {
            return Err(invalid!(
                "capacity {capacity} with block_steps {block_steps} needs {num_blocks} blocks; \
                 at most {} are supported: raise block_steps",
                u32::MAX
            ));
        }
        Ok(num_blocks * block_steps as u64)
    }

    fn over(columns: Columns, persistent: bool) -> Store {
        let num_blocks = (columns.capacity() / columns.block_steps() as u64) as u32;
        let block_steps = columns.block_steps();
        Store {
            inner: Arc::new(StoreInner {
                columns,
                allocator: BlockAllocator::new(num_blocks, block_steps),
                bulk: Mutex::new(Cursor::default()),
                tables: Mutex::new(Vec::new()),
                pressure: std::sync::atomic::AtomicU64::new(0),
                persistent,
                durable: std::sync::OnceLock::new(),
            }),
        }
    }

    /// True for a file store: its file stays when it goes, and `unlink` leaves it.
    pub fn persistent(&self) -> bool {
        self.inner.persistent
    }

    /// Gives this store its commits (`durable::make_durable`, which checks the store);
    /// refused when it has them already.
    pub(crate) fn set_commits(&self, commits: Box<dyn Commits>) -> Result<()> {
        self.inner.durable.set(commits).map_err(|_| invalid!("this store is already durable"))
    }

    /// The commits of a durable store; None for any other.
    pub fn durable(&self) -> Option<&dyn Commits> {
        self.inner.durable.get().map(|c| c.as_ref())
    }

    /// For a durable store, returns once every item in its tables when it was
    /// called is on disk (a group commit, see [`crate::durable`]); for any other
    /// store, at once.
    pub fn commit(&self) -> Result<()> {
        match self.durable() {
            Some(d) => d.commit(self),
            None => Ok(()),
        }
    }

    pub fn signature(&self) -> &Signature {
        self.inner.columns.signature()
    }

    /// Capacity in steps (whole blocks).
    pub fn capacity(&self) -> u64 {
        self.inner.columns.capacity()
    }

    pub fn block_steps(&self) -> u32 {
        self.inner.columns.block_steps()
    }

    pub fn num_blocks(&self) -> u32 {
        self.inner.allocator.num_blocks()
    }

    pub fn free_blocks(&self) -> usize {
        self.inner.allocator.free_blocks()
    }

    pub fn block_refcount(&self, block: u32) -> u32 {
        self.inner.allocator.refcount(block)
    }

    /// The shared-memory file that backs the columns.
    pub fn path(&self) -> &Path {
        self.inner.columns.path()
    }

    /// Removes the shared-memory file now. The memory stays mapped (and usable)
    /// until the last handle to the store is gone; no new process can attach. A
    /// file store's file stays.
    pub fn unlink(&self) {
        if !self.inner.persistent {
            let _ = std::fs::remove_file(self.inner.columns.path());
        }
    }

    /// Bytes of one row of column `col`.
    pub fn row_bytes(&self, col: usize) -> usize {
        self.inner.columns.row_bytes(col)
    }

    /// The columns (layout and raw row access).
    pub fn columns(&self) -> &Columns {
        &self.inner.columns
    }

    pub(crate) fn allocator(&self) -> &BlockAllocator {
        &self.inner.allocator
    }

    /// Pins an epoch for a sample whose rows are read after the draw returns (a
    /// device's gather): no block whose last reference goes while the [`Epoch`]
    /// lives is reused. Pin before drawing.
    pub fn pin(&self) -> Epoch {
        Epoch { epoch: self.inner.allocator.pin(), store: self.clone() }
    }

    /// Blocks whose last reference went while epochs were pinned, not reusable yet.
    pub fn limbo_blocks(&self) -> usize {
        self.inner.allocator.limbo_blocks()
    }

    /// True once a sample of this store pinned an epoch: a writer's lease may then
    /// wait for one to end, and callers holding a lock the epoch's owner needs to
    /// end it (Python's GIL) must release it first.
    pub fn pinned_ever(&self) -> bool {
        self.inner.allocator.pinned_ever()
    }

    /// True when both handles are the same store.
    pub fn same(&self, other: &Store) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Claims `rows` fresh rows through the store's shared bulk cursor. The claim
    /// holds a reference on every block it touches until it is dropped.
    pub(crate) fn claim_rows(&self, rows: u64) -> Result<Claim> {
        let mut claim = Claim { store: self.clone(), runs: Vec::new(), blocks: Vec::new() };
        let alloc = &self.inner.allocator;
        let mut source = self.clone();
        let mut cursor = self.inner.bulk.lock();
        let mut left = rows;
        while left > 0 {
            let run = cursor.take(&mut source, left.min(u32::MAX as u64) as u32, Wait::default())?;
            alloc.retain(run.block);
            claim.blocks.push(run.block);
            left -= run.len as u64;
            match claim.runs.last_mut() {
                // Consecutive blocks are adjacent in memory: one range, one copy.
                Some(last) if last.start + last.len as u64 == run.start && last.len as u64 + run.len as u64 <= u32::MAX as u64 => {
                    last.len += run.len
                }
                _ => claim.runs.push(RowRange { start: run.start, len: run.len }),
            }
        }
        Ok(claim)
    }

    /// A block from the free queue, if one is free now; never waits or evicts (a
    /// local writer's spare blocks, see the local protocol's `LEASE`).
    pub fn lease_free(&self) -> Option<u32> {
        self.inner.allocator.lease().ok()
    }

    /// Leases a free block; when there is none, makes room as a ring buffer would:
    /// the items of the block with the oldest lease are evicted from every table
    /// (if all the tables referencing it allow eviction and nothing else — a writer
    /// or a sample being collected — holds it), and so on to younger blocks.
    ///
    /// Blocks in limbo (their last reference went while a device read of a sample
    /// was in flight, see [`Epoch`]) come free when those reads end, within moments:
    /// a lease waits for them (up to [`LIMBO_WAIT`] in all) before it evicts, and
    /// evicts one block at a time while they are pending, so no item is evicted
    /// for a block that only had to wait. When the wait runs out it fails rather
    /// than evict more (every block it freed would wait as well).
    ///
    /// Those waits end early at `wait`'s deadline (`Timeout`) or when its interrupt
    /// check fires (`Interrupted`, checked every [`Wait::POLL`]); either way nothing
    /// was evicted for the block not leased.
    pub(crate) fn lease_block(&self, wait: Wait<'_>) -> Result<u32> {
        let alloc = &self.inner.allocator;
        if let Ok(b) = alloc.lease() {
            return Ok(b);
        }
        if let Some(durable) = self.durable() {
            return self.lease_durable(durable);
        }
        let limbo_end = std::time::Instant::now() + LIMBO_WAIT;
        let caller_end = wait.deadline();
        // True when a block came free, false when the limbo wait ran out.
        let wait_for_limbo = || -> Result<bool> {
            loop {
                let now = std::time::Instant::now();
                let end = caller_end.map_or(limbo_end, |d| d.min(limbo_end));
                let left = end.saturating_duration_since(now);
                if left.is_zero() {
                    if caller_end.is_some_and(|d| d <= now) && alloc.limbo_blocks() > 0 {
                        return Err(Error::Timeout {
                            message: format!(
                                "no block came free within {}: {} blocks wait for device reads of samples in flight",
                                wait.describe(),
                                alloc.limbo_blocks()
                            ),
                            partial: Default::default(),
                        });
                    }
                    return Ok(false);
                }
                let slice = if wait.interrupt.is_some() { left.min(Wait::POLL) } else { left };
                if alloc.wait_for_limbo(slice) {
                    return Ok(true);
                }
                if alloc.limbo_blocks() == 0 {
                    return Ok(false);
                }
                if wait.interrupted() {
                    return Err(Error::Interrupted { partial: Default::default() });
                }
            }
        };
        if wait_for_limbo()? {
            if let Ok(b) = alloc.lease() {
                return Ok(b);
            }
        }
        let tables = self.named_tables();
        for _ in 0..alloc.num_blocks() {
            let Some(block) = alloc.oldest_leased() else { break };
            self.evict_for_room(block, &tables);
            if let Ok(b) = alloc.lease() {
                return Ok(b);
            }
            if alloc.limbo_blocks() > 0 {
                // Blocks are waiting for epochs: evicting more would only add to them.
                if !wait_for_limbo()? {
                    break;
                }
                if let Ok(b) = alloc.lease() {
                    return Ok(b);
                }
            }
        }
        self.inner.pressure.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err(self.full_error(&tables))
    }

    /// [`Store::lease_block`] of a durable store: blocks whose items went wait in
    /// limbo for the next commit (see [`crate::durable`]), so a lease commits rather
    /// than wait, and evicts a group of the oldest blocks per commit.
    fn lease_durable(&self, durable: &dyn Commits) -> Result<u32> {
        let alloc = &self.inner.allocator;
        let tables = self.named_tables();
        let group = durable_eviction_group(alloc.num_blocks());
        // Other writers may take the blocks a commit frees before this one leases:
        // evict and commit again while that makes room, as often as there are blocks.
        for _ in 0..=alloc.num_blocks() {
            let mut gone = 0;
            if alloc.limbo_blocks() == 0 {
                for _ in 0..alloc.num_blocks() {
                    let Some(block) = alloc.oldest_leased() else { break };
                    gone += self.evict_for_room(block, &tables) as usize;
                    if gone >= group {
                        break;
                    }
                }
            }
            if gone == 0 && alloc.limbo_blocks() == 0 {
                if let Ok(b) = alloc.lease() {
                    return Ok(b);
                }
                break;
            }
            durable.commit(self)?;
            if let Ok(b) = alloc.lease() {
                return Ok(b);
            }
        }
        self.inner.pressure.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err(self.full_error(&tables))
    }

    /// Evicts the items of `block` from every table when that frees it (all its
    /// references are items of tables that allow eviction), and puts it back at the
    /// end of the lease order when it is still held. Returns whether it was freed.
    fn evict_for_room(&self, block: u32, tables: &[(String, Arc<dyn TableOverStore>)]) -> bool {
        let alloc = &self.inner.allocator;
        let mut item_refs = 0;
        let mut evictable = true;
        for (_, t) in tables {
            let refs = t.item_refs(block);
            item_refs += refs;
            evictable &= refs == 0 || t.evicts_when_store_full();
        }
        // Evict only when that frees the block; otherwise items would be lost for nothing.
        if evictable && item_refs > 0 && item_refs == alloc.refcount(block) {
            for (_, t) in tables {
                t.evict_block(block, &self.clone());
            }
        }
        if alloc.refcount(block) > 0 {
            alloc.requeue(block);
            return false;
        }
        true
    }

    /// Times the store has been found full (every block held by something that
    /// cannot be evicted).
    pub fn pressure(&self) -> u64 {
        self.inner.pressure.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Says what holds the blocks of a full store, and the fix for each holder.
    fn full_error(&self, tables: &[(String, Arc<dyn TableOverStore>)]) -> Error {
        let alloc = &self.inner.allocator;
        let (mut queued, mut other) = (0u64, 0u64);
        let mut keepers: Vec<&str> = Vec::new();
        for block in 0..alloc.num_blocks() {
            let mut item_refs = 0;
            let mut kept_by_table = false;
            for (name, t) in tables {
                let r = t.item_refs(block);
                item_refs += r;
                if r > 0 && !t.evicts_when_store_full() {
                    kept_by_table = true;
                    if !keepers.contains(&name.as_str()) {
                        keepers.push(name);
                    }
                }
            }
            if kept_by_table {
                queued += 1;
            } else if alloc.refcount(block) > item_refs {
                other += 1;
            }
        }
        let steps = alloc.num_blocks() as u64 * alloc.block_steps() as u64;
        let mut held = Vec::new();
        if other > 0 {
            held.push(format!(
                "{other} by writers' episode history or samples being collected (a writer keeps its whole episode until the store fills, \
                 then only as many steps as its longest item; end_episode() or writer(max_sequence_length=N) lets the rest go, \
                 and a sample's rows return when it is dropped)"
            ));
        }
        if queued > 0 {
            held.push(format!(
                "{queued} by items of tables that keep their items when the store is full ({}: sample them or lower their max_size)",
                keepers.join(", ")
            ));
        }
        let limbo = alloc.limbo_blocks();
        if limbo > 0 && self.durable().is_some() {
            held.push(format!("{limbo} wait for this durable store's next commit (their items went after the last one)"));
        } else if limbo > 0 {
            held.push(format!(
                "{limbo} wait for device reads of samples in flight (GPU gathers; they come free when those finish, \
                 and did not within {} s)",
                LIMBO_WAIT.as_secs_f64()
            ));
        }
        let held = if held.is_empty() { String::new() } else { format!(": {}", held.join("; ")) };
        Error::ResourceExhausted(format!(
            "store is full: all {} blocks ({steps} steps) are held{held}; or give the store a larger capacity",
            alloc.num_blocks()
        ))
    }

    pub(crate) fn register_table(&self, name: &str, table: Weak<dyn TableOverStore>) -> Result<()> {
        let mut tables = self.inner.tables.lock();
        tables.retain(|(_, w)| w.strong_count() > 0);
        if tables.iter().any(|(n, _)| n == name) {
            return Err(invalid!("a table named '{name}' already exists on this store"));
        }
        tables.push((name.to_string(), table));
        Ok(())
    }

    /// The live tables over this store with their names, in the order they were registered.
    fn named_tables(&self) -> Vec<(String, Arc<dyn TableOverStore>)> {
        self.inner.tables.lock().iter().filter_map(|(n, w)| Some((n.clone(), w.upgrade()?))).collect()
    }

    /// The live tables over this store, in the order they were registered.
    pub(crate) fn tables(&self) -> Vec<Arc<dyn TableOverStore>> {
        self.named_tables().into_iter().map(|(_, t)| t).collect()
    }

    pub(crate) fn find_table(&self, name: &str) -> Option<Arc<dyn TableOverStore>> {
        self.inner.tables.lock().iter().find(|(n, _)| n == name).and_then(|(_, w)| w.upgrade())
    }

    /// Names of the live tables over this store.
    pub fn table_names(&self) -> Vec<String> {
        let tables = self.inner.tables.lock();
        tables.iter().filter(|(_, w)| w.strong_count() > 0).map(|(n, _)| n.clone()).collect()
    }
}

// SAFETY: `lease_block` hands out a block only from the allocator's free queue
// (refcount 0, no item, writer or sample holds it); the allocator frees a block only
// when its refcount returns to 0, which `retain`/`release` keep exact.
unsafe impl BlockSource for Store {
    fn columns(&self) -> &Columns {
        &self.inner.columns
    }

    fn lease(&mut self, wait: Wait<'_>) -> Result<u32> {
        self.lease_block(wait)
    }

    fn retain(&mut self, block: u32) {
        self.inner.allocator.retain(block)
    }

    fn release(&mut self, block: u32) {
        self.inner.allocator.release(block)
    }

    fn pressure(&self) -> u64 {
        Store::pressure(self)
    }
}

/// Rows claimed through the bulk cursor, in memory order (adjacent blocks merged
/// into one range); every block touched is referenced until the claim is dropped.
pub(crate) struct Claim {
    store: Store,
    pub runs: Vec<RowRange>,
    blocks: Vec<u32>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        for &b in &self.blocks {
            self.store.inner.allocator.release(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::{DType, Field};

    fn store(capacity: u64, bs: u32) -> Store {
        let sig = Signature::new(vec![
            Field::new("a", DType::Float32, vec![3]).unwrap(),
            Field::new("b", DType::UInt8, vec![]).unwrap(),
        ])
        .unwrap();
        Store::new(sig, capacity, bs, None).unwrap()
    }

    #[test]
    fn capacity_rounds_up_to_whole_blocks() {
        let s = store(10, 4);
        assert_eq!(s.capacity(), 12);
        assert_eq!(s.num_blocks(), 3);
    }

    #[test]
    fn written_rows_read_back() {
        let s = store(8, 4);
        let claim = s.claim_rows(3).unwrap();
        let run = claim.runs[0];
        assert_eq!(run.len, 3);
        let src: Vec<u8> = (0..36).collect();
        // SAFETY: the run is this test's own claim, not yet referenced by any item.
        unsafe { s.columns().write_rows(0, run.start, &src) };
        let mut dst = vec![0u8; 24];
        // SAFETY: the claim still holds the block.
        unsafe { s.columns().read_ranges(0, &[RowRange { start: run.start + 1, len: 2 }], &mut dst) };
        assert_eq!(dst, src[12..36]);
    }

    #[test]
    fn claims_hold_blocks_until_dropped() {
        let s = store(8, 4);
        let claim = s.claim_rows(6).unwrap();
        // Blocks 0 and 1 are adjacent: one range.
        assert_eq!(claim.runs, vec![RowRange { start: 0, len: 6 }]);
        assert_eq!(s.free_blocks(), 0);
        drop(claim);
        // The bulk cursor still holds its current (second) block.
        assert_eq!(s.free_blocks(), 1);
    }

    #[test]
    fn zero_sizes_are_rejected() {
        let sig = Signature::new(vec![Field::new("a", DType::Int8, vec![]).unwrap()]).unwrap();
        assert!(Store::new(sig.clone(), 0, 4, None).unwrap_err().to_string().contains("capacity"));
        assert!(Store::new(sig, 4, 0, None).unwrap_err().to_string().contains("block_steps"));
    }
}

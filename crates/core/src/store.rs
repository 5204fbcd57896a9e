//! Stores: the columns of step data plus the block allocator.
//!
//! All columns live in one shared-memory region: column `c` starts at a 64-byte
//! aligned offset and holds `capacity` rows of `row_bytes(c)` bytes. Row `r` of every
//! column belongs to the same step, and rows are owned block by block:
//!
//! * a writer (or a bulk claim) writes only rows of runs it took from its own
//!   [`Cursor`], which no one else can take until the block is freed;
//! * rows are read only while the reader holds a reference on their block (an item
//!   in a table, or a [`crate::SampleBatch`] being collected), so they are not
//!   reused under the reader.
//!
//! Those two rules make the raw copies below sound; this module and `memory.rs`
//! are the only ones with `unsafe`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::blocks::{BlockAllocator, Cursor};
use crate::error::Result;
use crate::invalid;
use crate::item::RowRange;
use crate::memory::{default_directory, Region};
use crate::signature::Signature;
use crate::table::Shared as TableShared;

const COLUMN_ALIGN: usize = 64;

#[derive(Clone, Copy, Debug)]
struct Column {
    offset: usize,
    row_bytes: usize,
}

pub(crate) struct StoreInner {
    signature: Signature,
    block_steps: u32,
    capacity: u64,
    columns: Vec<Column>,
    region: Region,
    pub(crate) allocator: BlockAllocator,
    bulk: Mutex<Cursor>,
    tables: Mutex<Vec<(String, Weak<TableShared>)>>,
}

/// A cheap handle to one store; clones share it.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<StoreInner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({}, capacity={})", self.inner.signature.describe(), self.inner.capacity)
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
        let capacity = num_blocks * block_steps as u64;
        let mut columns = Vec::with_capacity(signature.len());
        let mut offset = 0usize;
        for f in signature.fields() {
            let row_bytes = f.row_bytes();
            let bytes = (row_bytes as u64).checked_mul(capacity).filter(|&b| b <= isize::MAX as u64);
            let Some(bytes) = bytes else {
                return Err(invalid!(
                    "field '{}' ({}) x {capacity} steps does not fit in memory",
                    f.name,
                    f.describe()
                ));
            };
            columns.push(Column { offset, row_bytes });
            offset = (offset + bytes as usize).next_multiple_of(COLUMN_ALIGN);
        }
        let dir: PathBuf = directory.map(Path::to_path_buf).unwrap_or_else(default_directory);
        let region = Region::create(&dir, offset)?;
        Ok(Store {
            inner: Arc::new(StoreInner {
                signature,
                block_steps,
                capacity,
                columns,
                region,
                allocator: BlockAllocator::new(num_blocks as u32, block_steps),
                bulk: Mutex::new(Cursor::default()),
                tables: Mutex::new(Vec::new()),
            }),
        })
    }

    pub fn signature(&self) -> &Signature {
        &self.inner.signature
    }

    /// Capacity in steps (whole blocks).
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    pub fn block_steps(&self) -> u32 {
        self.inner.block_steps
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
        self.inner.region.path()
    }

    /// Removes the shared-memory file now. The memory stays mapped (and usable)
    /// until the last handle to the store is gone; no new process can attach.
    pub fn unlink(&self) {
        let _ = std::fs::remove_file(self.inner.region.path());
    }

    /// Bytes of one row of column `col`.
    pub fn row_bytes(&self, col: usize) -> usize {
        self.inner.columns[col].row_bytes
    }

    /// Address of row 0 of column `col` (for zero-copy views; rows are valid only
    /// under the ownership rules in the module docs).
    pub fn column_ptr(&self, col: usize) -> *const u8 {
        // SAFETY: `offset` is inside the region by construction in `new`.
        unsafe { self.inner.region.base().add(self.inner.columns[col].offset) }
    }

    pub(crate) fn allocator(&self) -> &BlockAllocator {
        &self.inner.allocator
    }

    pub(crate) fn same(&self, other: &Store) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Copies `src` (whole rows) into column `col` starting at `row`. The rows must
    /// belong to a run the caller took from its own cursor and has not published.
    pub(crate) fn write_rows(&self, col: usize, row: u64, src: &[u8]) {
        let c = self.inner.columns[col];
        let rows = (src.len() / c.row_bytes.max(1)) as u64;
        assert!(src.len() % c.row_bytes.max(1) == 0, "partial row write");
        assert!(row + rows <= self.inner.capacity, "row write past capacity");
        // SAFETY: the destination is inside column `col` (bounds asserted above), the
        // rows belong to the caller's unpublished run so nothing reads or writes them
        // concurrently, and `src` cannot overlap the mapping's private rows.
        unsafe {
            let dst = self.inner.region.base().add(c.offset + row as usize * c.row_bytes);
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
        }
    }

    /// Copies the rows of `ranges` of column `col`, back to back, into `dst`, which
    /// must hold exactly that many rows. The caller holds references on their blocks.
    pub fn read_ranges(&self, col: usize, ranges: &[RowRange], dst: &mut [u8]) {
        let c = self.inner.columns[col];
        let mut at = 0usize;
        for r in ranges {
            let bytes = r.len as usize * c.row_bytes;
            assert!(r.start + r.len as u64 <= self.inner.capacity, "row read past capacity");
            // SAFETY: the source rows are inside the column (asserted), published and
            // referenced by the caller so no writer touches them; `dst[at..at+bytes]`
            // is a valid exclusive slice (indexing panics otherwise).
            unsafe {
                let src = self.inner.region.base().add(c.offset + r.start as usize * c.row_bytes);
                std::ptr::copy_nonoverlapping(src, dst[at..at + bytes].as_mut_ptr(), bytes);
            }
            at += bytes;
        }
        assert_eq!(at, dst.len(), "destination size does not match the ranges");
    }

    /// Hints the CPU to start loading the first `max_bytes` of `range` in column
    /// `col`, so that a gather of many random rows overlaps their memory latency.
    pub fn prefetch(&self, col: usize, range: &RowRange, max_bytes: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let c = self.inner.columns[col];
            if range.start + range.len as u64 > self.inner.capacity {
                return;
            }
            let bytes = (range.len as usize * c.row_bytes).min(max_bytes);
            let base = self.inner.region.base() as usize + c.offset + range.start as usize * c.row_bytes;
            for line in (0..bytes).step_by(64) {
                // SAFETY: a prefetch never faults and changes no memory; the address is
                // inside the mapped column (bounds checked above).
                unsafe { _mm_prefetch::<_MM_HINT_T0>((base + line) as *const i8) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (col, range, max_bytes);
    }

    /// Claims `rows` fresh rows through the store's shared bulk cursor. The claim
    /// holds a reference on every block it touches until it is dropped.
    pub(crate) fn claim_rows(&self, rows: u64) -> Result<Claim> {
        let mut claim = Claim { store: self.clone(), runs: Vec::new(), blocks: Vec::new() };
        let alloc = &self.inner.allocator;
        let mut cursor = self.inner.bulk.lock();
        let mut left = rows;
        while left > 0 {
            let run = cursor.take(alloc, || self.lease_block(), left.min(u32::MAX as u64) as u32)?;
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

    /// Leases a free block; when there is none, makes room as a ring buffer would:
    /// the items of the block with the oldest lease are evicted from every table
    /// (if all the tables referencing it allow eviction and nothing else — a writer
    /// or a sample being collected — holds it), and so on to younger blocks.
    pub(crate) fn lease_block(&self) -> Result<u32> {
        let alloc = &self.inner.allocator;
        if let Ok(b) = alloc.lease() {
            return Ok(b);
        }
        let tables: Vec<Arc<TableShared>> = self.inner.tables.lock().iter().filter_map(|(_, w)| w.upgrade()).collect();
        for _ in 0..alloc.num_blocks() {
            let Some(block) = alloc.oldest_leased() else { break };
            let mut item_refs = 0;
            let mut evictable = true;
            for t in &tables {
                let refs = t.item_refs(block);
                item_refs += refs;
                evictable &= refs == 0 || t.evicts_when_store_full();
            }
            // Evict only when that frees the block; otherwise items would be lost for nothing.
            if evictable && item_refs > 0 && item_refs == alloc.refcount(block) {
                for t in &tables {
                    t.evict_block(block, &self.clone());
                }
            }
            if alloc.refcount(block) > 0 {
                alloc.requeue(block);
            }
            if let Ok(b) = alloc.lease() {
                return Ok(b);
            }
        }
        Err(alloc.full_error())
    }

    pub(crate) fn register_table(&self, name: &str, table: Weak<TableShared>) -> Result<()> {
        let mut tables = self.inner.tables.lock();
        tables.retain(|(_, w)| w.strong_count() > 0);
        if tables.iter().any(|(n, _)| n == name) {
            return Err(invalid!("a table named '{name}' already exists on this store"));
        }
        tables.push((name.to_string(), table));
        Ok(())
    }

    pub(crate) fn find_table(&self, name: &str) -> Option<Arc<TableShared>> {
        self.inner.tables.lock().iter().find(|(n, _)| n == name).and_then(|(_, w)| w.upgrade())
    }

    /// Names of the live tables over this store.
    pub fn table_names(&self) -> Vec<String> {
        let tables = self.inner.tables.lock();
        tables.iter().filter(|(_, w)| w.strong_count() > 0).map(|(n, _)| n.clone()).collect()
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
        s.write_rows(0, run.start, &src);
        let mut dst = vec![0u8; 24];
        s.read_ranges(0, &[RowRange { start: run.start + 1, len: 2 }], &mut dst);
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

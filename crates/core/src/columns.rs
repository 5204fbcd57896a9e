//! Columns: the layout of a store's step data in one shared-memory region, and
//! the raw row copies in and out of it.
//!
//! Column `c` starts at a 64-byte aligned offset and holds `capacity` rows of
//! `row_bytes(c)` bytes. Row `r` of every column belongs to the same step. The
//! owner creates the region; local clients (same host) attach to it by path and compute
//! the same layout from the signature.
//!
//! Rows are owned block by block, and these rules make the raw copies sound:
//!
//! * a writer writes only rows of runs its own cursor took from blocks leased to
//!   it, which no one else can take until the block is freed;
//! * rows are read only while the reader holds a reference on their block (an item
//!   in a table, or a sample being collected), so they are not reused under it.
//!
//! This module and `memory.rs` are the only ones that touch raw memory. The two
//! copies whose soundness depends on those rules are `unsafe fn`s
//! ([`Columns::write_rows`], [`Columns::read_ranges`]), and the traits whose
//! implementors hand out rows are `unsafe trait`s (`blocks::BlockSource`,
//! `sample::Collect`): the rules show at every call site.

use std::path::Path;

use crate::error::{Error, Result};
use crate::invalid;
use crate::item::RowRange;
use crate::memory::Region;
use crate::signature::Signature;

const COLUMN_ALIGN: usize = 64;

#[derive(Clone, Copy, Debug)]
struct Column {
    offset: usize,
    row_bytes: usize,
}

pub struct Columns {
    signature: Signature,
    block_steps: u32,
    capacity: u64,
    columns: Vec<Column>,
    region: Region,
}

/// Column offsets and the total size for `capacity` rows.
fn layout(signature: &Signature, capacity: u64) -> Result<(Vec<Column>, usize)> {
    let mut columns = Vec::with_capacity(signature.len());
    let mut offset = 0usize;
    for f in signature.fields() {
        let row_bytes = f.row_bytes();
        let bytes = (row_bytes as u64).checked_mul(capacity).filter(|&b| b <= isize::MAX as u64 / 2);
        let Some(bytes) = bytes else {
            return Err(invalid!("field '{}' ({}) x {capacity} steps does not fit in memory", f.name, f.describe()));
        };
        columns.push(Column { offset, row_bytes });
        offset = (offset + bytes as usize).next_multiple_of(COLUMN_ALIGN);
    }
    Ok((columns, offset))
}

impl Columns {
    /// Creates the region for `capacity` rows (a multiple of `block_steps`), on
    /// huge pages if asked (see [`crate::memory`]).
    pub fn create(
        signature: Signature,
        capacity: u64,
        block_steps: u32,
        directory: &Path,
        huge_pages: bool,
    ) -> Result<Columns> {
        let (columns, len) = layout(&signature, capacity)?;
        let region = Region::create(directory, len, huge_pages)?;
        Ok(Columns { signature, block_steps, capacity, columns, region })
    }

    /// Maps an existing region created by [`Columns::create`] with the same
    /// signature and capacity (by another process of the same user).
    pub fn attach(path: &Path, signature: Signature, capacity: u64, block_steps: u32) -> Result<Columns> {
        let (columns, len) = layout(&signature, capacity)?;
        let region = Region::open(path, len)?;
        if block_steps == 0 || capacity % block_steps as u64 != 0 {
            return Err(Error::Corrupt(format!("store at {}: capacity {capacity} is not whole blocks of {block_steps}", path.display())));
        }
        Ok(Columns { signature, block_steps, capacity, columns, region })
    }

    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn block_steps(&self) -> u32 {
        self.block_steps
    }

    pub fn path(&self) -> &Path {
        self.region.path()
    }

    /// The whole mapped region: base address and length in bytes (for registering
    /// it with a GPU; rows are valid only under the ownership rules above).
    pub fn memory(&self) -> (*mut u8, usize) {
        (self.region.base(), self.region.len())
    }

    /// Bytes of the region this process reaches through huge pages now.
    pub fn huge_page_bytes(&self) -> u64 {
        self.region.huge_page_bytes()
    }

    /// Byte offset of column `col` in the region.
    pub fn offset(&self, col: usize) -> usize {
        self.columns[col].offset
    }

    /// Bytes of one row of column `col`.
    pub fn row_bytes(&self, col: usize) -> usize {
        self.columns[col].row_bytes
    }

    /// Address of row 0 of column `col` (for zero-copy views; rows are valid only
    /// under the ownership rules in the module docs).
    pub fn column_ptr(&self, col: usize) -> *const u8 {
        // SAFETY: `offset` is inside the region by construction in `layout`.
        unsafe { self.region.base().add(self.columns[col].offset) }
    }

    /// Copies `src` (whole rows) into column `col` starting at `row`. Panics when
    /// the rows run past the column or `src` is not whole rows.
    ///
    /// # Safety
    /// The rows must belong to a run the caller's cursor took from a block leased to
    /// it and not yet referenced by any item or sample (the writer rule in the module
    /// docs): no other thread or process may read or write them during the copy.
    pub unsafe fn write_rows(&self, col: usize, row: u64, src: &[u8]) {
        let c = self.columns[col];
        let rows = (src.len() / c.row_bytes.max(1)) as u64;
        assert!(src.len() % c.row_bytes.max(1) == 0, "partial row write");
        assert!(row + rows <= self.capacity, "row write past capacity");
        // SAFETY: the destination is inside column `col` (bounds asserted above), the
        // rows belong to the caller's unpublished run so nothing reads or writes them
        // concurrently, and `src` cannot overlap the mapping's private rows.
        unsafe {
            let dst = self.region.base().add(c.offset + row as usize * c.row_bytes);
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
        }
    }

    /// The rows of `range` in column `col`, as a slice of the mapping. Panics when the
    /// range runs past the column.
    ///
    /// # Safety
    /// As for [`Columns::read_ranges`]: the caller holds a reference on every block
    /// `range` touches for as long as the slice lives, so no writer reuses the rows.
    pub unsafe fn rows(&self, col: usize, range: &RowRange) -> &[u8] {
        let c = self.columns[col];
        assert!(range.start + range.len as u64 <= self.capacity, "row read past capacity");
        // SAFETY: inside the column (asserted), published, and kept from writers by the
        // caller's reference (this function's contract).
        unsafe {
            let src = self.region.base().add(c.offset + range.start as usize * c.row_bytes);
            std::slice::from_raw_parts(src, range.len as usize * c.row_bytes)
        }
    }

    /// Copies the rows of `ranges` of column `col`, back to back, into `dst`, which
    /// must hold exactly that many rows. Panics when a range runs past the column or
    /// the sizes differ.
    ///
    /// # Safety
    /// The caller must hold a reference on every block `ranges` touches (an item in a
    /// table, a sample being collected, a pin) for the whole copy, so no writer reuses
    /// those rows under it (the reader rule in the module docs).
    pub unsafe fn read_ranges(&self, col: usize, ranges: &[RowRange], dst: &mut [u8]) {
        let c = self.columns[col];
        let mut at = 0usize;
        for r in ranges {
            let bytes = r.len as usize * c.row_bytes;
            assert!(r.start + r.len as u64 <= self.capacity, "row read past capacity");
            // SAFETY: the source rows are inside the column (asserted), published and
            // referenced by the caller so no writer touches them; `dst[at..at+bytes]`
            // is a valid exclusive slice (indexing panics otherwise).
            unsafe {
                let src = self.region.base().add(c.offset + r.start as usize * c.row_bytes);
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
            let c = self.columns[col];
            if range.start + range.len as u64 > self.capacity {
                return;
            }
            let bytes = (range.len as usize * c.row_bytes).min(max_bytes);
            let base = self.region.base() as usize + c.offset + range.start as usize * c.row_bytes;
            for line in (0..bytes).step_by(64) {
                // SAFETY: a prefetch never faults and changes no memory; the address is
                // inside the mapped column (bounds checked above).
                unsafe { _mm_prefetch::<_MM_HINT_T0>((base + line) as *const i8) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (col, range, max_bytes);
    }
}

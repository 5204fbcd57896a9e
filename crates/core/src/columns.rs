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
//! # Compressed columns
//! A field made with `compress` keeps a block's rows raw while the block is being
//! written (the open block), and as one zstd frame per row once the writer that
//! leased it has written its last row: each block counts the rows written to it,
//! and the write that completes the block compresses it before it returns (the
//! writer still holds the block then). A block given up part-filled (a writer's
//! close) or restored from a checkpoint is compressed whole
//! ([`Columns::compress_block`]). Every compressed column has, after the raw
//! columns, one *slot* per block (an offset table of `block_steps + 1` u32 and the
//! frames) and per block a state word — [`RAW`], [`KEPT`] (did not shrink by an
//! eighth: stays raw) or the payload's length — and the count of rows written. Once a block's frames are in place its state says so and its raw pages
//! are given back to the file system; the slot's pages go back when the block is
//! leased again ([`Columns::reset_block`]). So a block takes either its raw bytes
//! or its compressed ones, never both for long, and the file stays sparse. All of
//! it lies in the shared region, so local clients (other processes) compress the
//! blocks they fill and read compressed rows the same way.
//!
//! A reader may find a block raw and read it while its writer compresses it and
//! punches the raw pages: it reads the state again after the copy (a seqlock) and,
//! if the block was compressed meanwhile, reads the frames instead. Frames are
//! decompressed row by row, so a sample of random rows costs one frame per row.
//!
//! This module and `memory.rs` are the only ones that touch raw memory. The two
//! copies whose soundness depends on those rules are `unsafe fn`s
//! ([`Columns::write_rows`], [`Columns::read_ranges`]), and the traits whose
//! implementors hand out rows are `unsafe trait`s (`blocks::BlockSource`,
//! `sample::Collect`): the rules show at every call site.

use std::cell::RefCell;
use std::path::Path;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::invalid;
use crate::item::RowRange;
use crate::memory::Region;
use crate::signature::Signature;

const COLUMN_ALIGN: usize = 64;
const PAGE: usize = 4096;

/// A compressed column's block state: raw (open, or not yet compressed).
pub const RAW: u64 = 0;
/// ... kept raw for good: its frames would not have saved an eighth of it.
pub const KEPT: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
struct Column {
    offset: usize,
    row_bytes: usize,
    /// Rows a sample reads per step: the step's and the `stack - 1` before it.
    stack: u32,
    /// Where a compressed column's slots and block states are (None: raw column).
    packed: Option<Packed>,
}

#[derive(Clone, Copy, Debug)]
struct Packed {
    level: i32,
    /// Offset of block 0's slot; block `b`'s is `slots + b * slot_bytes`.
    slots: usize,
    slot_bytes: usize,
    /// Offset of the per-block words: state and rows written (u64 each).
    states: usize,
}

pub struct Columns {
    signature: Signature,
    block_steps: u32,
    capacity: u64,
    columns: Vec<Column>,
    region: Region,
    /// A file store's columns: a read of rows not in the page cache waits for the
    /// disk, so gathers overlap many of them (see `sample::gather`).
    on_disk: bool,
}

/// Column offsets, the total size for `capacity` rows, and the bytes allocated at
/// most at once (a compressed column's block is raw or compressed, not both).
fn layout(signature: &Signature, capacity: u64, block_steps: u32) -> Result<(Vec<Column>, usize, usize)> {
    let mut columns = Vec::with_capacity(signature.len());
    let mut offset = 0usize;
    let mut need = 0usize;
    for f in signature.fields() {
        let row_bytes = f.row_bytes();
        let bytes = (row_bytes as u64).checked_mul(capacity).filter(|&b| b <= isize::MAX as u64 / 4);
        let Some(bytes) = bytes else {
            return Err(invalid!("field '{}' ({}) x {capacity} steps does not fit in memory", f.name, f.describe()));
        };
        // A compressed column's blocks start on pages where they can, so that its raw
        // pages go back whole.
        let align = if f.compress.is_some() { PAGE } else { COLUMN_ALIGN };
        offset = offset.next_multiple_of(align);
        columns.push(Column { offset, row_bytes, stack: f.stack, packed: None });
        offset = (offset + bytes as usize).next_multiple_of(COLUMN_ALIGN);
        need += bytes as usize;
    }
    if let Some(f) = signature.fields().iter().find(|f| f.stack > block_steps) {
        return Err(invalid!(
            "field '{}' stacks {} frames, and a block of {block_steps} steps cannot hold a step's frames: every \
             step's frames lie in its block, so block_steps must be at least the stack (and several times it, as \
             each block a writer continues an episode in starts with copies of the stack - 1 frames before it)",
            f.name,
            f.stack
        ));
    }
    let blocks = (capacity / block_steps.max(1) as u64) as usize;
    for (c, f) in signature.fields().iter().enumerate() {
        let Some(level) = f.compress else { continue };
        let raw = block_steps as usize * f.row_bytes();
        let slot_bytes = (4 * (block_steps as usize + 1) + raw).next_multiple_of(PAGE);
        if slot_bytes > u32::MAX as usize {
            return Err(invalid!(
                "field '{}' ({}): a compressed block of {block_steps} steps takes {slot_bytes} bytes, and at most \
                 4 GiB are supported: lower block_steps",
                f.name,
                f.describe()
            ));
        }
        let slots = offset.next_multiple_of(PAGE);
        let states = (slots + blocks * slot_bytes).next_multiple_of(COLUMN_ALIGN);
        offset = states + blocks * 16;
        columns[c].packed = Some(Packed { level, slots, slot_bytes, states });
        need += blocks * 16 + 4 * PAGE;
    }
    Ok((columns, offset.next_multiple_of(COLUMN_ALIGN), need))
}

/// The rows a read of `range` of column `c` touches, `(first, count)`: a stacked
/// step reads the `stack - 1` rows before it too (for hints; the read itself stops
/// at the block's start, which these may pass: a hint cannot fault).
fn read_span(c: &Column, range: &RowRange) -> (u64, u64) {
    let before = range.start.min(c.stack as u64 - 1);
    (range.start - before, range.len as u64 + before)
}

/// This thread's zstd contexts (a context costs hundreds of KB to make).
struct Zstd {
    compressor: Option<(i32, zstd::bulk::Compressor<'static>)>,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
}

thread_local! {
    static ZSTD: RefCell<Zstd> = const { RefCell::new(Zstd { compressor: None, decompressor: None }) };
    /// A compressed stacked column's rows, decompressed once per block of a read.
    static STACK_ROWS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
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
        if huge_pages && signature.fields().iter().any(|f| f.compress.is_some()) {
            return Err(invalid!(
                "compressed fields cannot be on huge pages (a compressed block gives its raw pages back, and a huge \
                 page cannot be given back in part): pass huge_pages=False or store the fields raw"
            ));
        }
        let (columns, len, need) = layout(&signature, capacity, block_steps)?;
        let region = Region::create_sparse(directory, len, need, huge_pages)?;
        Ok(Columns { signature, block_steps, capacity, columns, region, on_disk: false })
    }

    /// Creates the columns in a new file at `path` that stays when the store goes
    /// (a file store; see [`crate::Store::create_file`]).
    pub fn create_file(signature: Signature, capacity: u64, block_steps: u32, path: &Path) -> Result<Columns> {
        let (columns, len, need) = layout(&signature, capacity, block_steps)?;
        let region = Region::create_file(path, len, need)?;
        region.advise_random();
        Ok(Columns { signature, block_steps, capacity, columns, region, on_disk: true })
    }

    /// Maps an existing region created by [`Columns::create`] with the same
    /// signature and capacity (by another process of the same user).
    pub fn attach(path: &Path, signature: Signature, capacity: u64, block_steps: u32) -> Result<Columns> {
        if block_steps == 0 || capacity % block_steps as u64 != 0 {
            return Err(Error::Corrupt(format!("store at {}: capacity {capacity} is not whole blocks of {block_steps}", path.display())));
        }
        let (columns, len, _) = layout(&signature, capacity, block_steps)?;
        let region = Region::open(path, len)?;
        Ok(Columns { signature, block_steps, capacity, columns, region, on_disk: false })
    }

    /// [`Columns::attach`] for a file store's columns file (reads may wait for the disk).
    pub fn attach_file(path: &Path, signature: Signature, capacity: u64, block_steps: u32) -> Result<Columns> {
        let columns = Columns { on_disk: true, ..Columns::attach(path, signature, capacity, block_steps)? };
        columns.region.advise_random();
        Ok(columns)
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

    /// Bytes of one row of column `col` (one frame of a stacked field).
    pub fn row_bytes(&self, col: usize) -> usize {
        self.columns[col].row_bytes
    }

    /// Bytes a sample takes per step of column `col`: `stack` rows for a stacked
    /// field (see [`Columns::read_ranges`]), one row otherwise.
    pub fn sample_bytes(&self, col: usize) -> usize {
        self.columns[col].row_bytes * self.columns[col].stack as usize
    }

    /// True when a sample's rows of column `col` are the column's bytes as they lie
    /// (neither compressed nor stacked): they can be viewed or gathered in place.
    pub fn in_place(&self, col: usize) -> bool {
        let c = &self.columns[col];
        c.packed.is_none() && c.stack == 1
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
        if let Some(p) = c.packed {
            // Count the rows into their blocks; the write that completes a block
            // compresses it (every other row of it was written before its count).
            let bs = self.block_steps as u64;
            let (mut at, end) = (row, row + rows);
            while at < end {
                let block = at / bs;
                let n = (bs - at % bs).min(end - at);
                if self.written(&p, block).fetch_add(n, Ordering::AcqRel) + n == bs {
                    // SAFETY: all `bs` rows of the block are written (counted), and
                    // the caller still holds it (this function's contract).
                    unsafe { self.compress_column_block(&c, &p, block as u32) };
                }
                at += n;
            }
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
        assert!(self.in_place(col), "a compressed or stacked column's rows are read with read_ranges");
        assert!(range.start + range.len as u64 <= self.capacity, "row read past capacity");
        // SAFETY: inside the column (asserted), published, and kept from writers by the
        // caller's reference (this function's contract).
        unsafe {
            let src = self.region.base().add(c.offset + range.start as usize * c.row_bytes);
            std::slice::from_raw_parts(src, range.len as usize * c.row_bytes)
        }
    }

    /// Copies the steps of `ranges` of column `col`, back to back, into `dst`, which
    /// must hold exactly [`Columns::sample_bytes`] per step. A step of a stacked
    /// column is its row and the `stack - 1` rows before it in its block, oldest
    /// first (a writer puts them there; a row too near its block's start to have
    /// them repeats the block's first row). Panics when a range runs past the
    /// column or the sizes differ.
    ///
    /// # Safety
    /// The caller must hold a reference on every block `ranges` touches (an item in a
    /// table, a sample being collected, a pin) for the whole copy, so no writer reuses
    /// those rows under it (the reader rule in the module docs).
    pub unsafe fn read_ranges(&self, col: usize, ranges: &[RowRange], dst: &mut [u8]) {
        if self.columns[col].stack > 1 {
            // SAFETY: this function's contract.
            return unsafe { self.read_stacked(col, ranges, dst) };
        }
        // SAFETY: this function's contract.
        unsafe { self.read_stored(col, ranges, dst) }
    }

    /// The steps of `ranges` of stacked column `col` into `dst` (see
    /// [`Columns::read_ranges`]): per block, the rows from `stack - 1` before the
    /// first step are read once (decompressed once), then each step's frames are
    /// copied out of them.
    ///
    /// # Safety
    /// As [`Columns::read_ranges`]; the rows before a step lie in its block, which
    /// the caller references.
    #[inline(never)]
    unsafe fn read_stacked(&self, col: usize, ranges: &[RowRange], dst: &mut [u8]) {
        let c = self.columns[col];
        let (k, rb, bs) = (c.stack as u64, c.row_bytes, self.block_steps as u64);
        let step_bytes = k as usize * rb;
        let mut at = 0usize;
        STACK_ROWS.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            for r in ranges {
                assert!(r.start + r.len as u64 <= self.capacity, "row read past capacity");
                let (mut row, end) = (r.start, r.start + r.len as u64);
                while row < end {
                    let block_start = row / bs * bs;
                    let piece_end = end.min(block_start + bs);
                    let first = row.saturating_sub(k - 1).max(block_start);
                    let stored = RowRange { start: first, len: (piece_end - first) as u32 };
                    let rows: &[u8] = if c.packed.is_some() {
                        scratch.resize(stored.len as usize * rb, 0);
                        // SAFETY: the rows lie in the referenced block (this function's contract).
                        unsafe { self.read_stored(col, std::slice::from_ref(&stored), &mut scratch) };
                        &scratch
                    } else {
                        // SAFETY: as above; a raw column is read in place.
                        unsafe {
                            std::slice::from_raw_parts(self.region.base().add(c.offset + first as usize * rb), stored.len as usize * rb)
                        }
                    };
                    for q in row..piece_end {
                        let out = &mut dst[at..at + step_bytes];
                        let oldest = q as i64 - (k as i64 - 1);
                        if oldest >= first as i64 {
                            let from = (oldest as u64 - first) as usize * rb;
                            out.copy_from_slice(&rows[from..from + step_bytes]);
                        } else {
                            for (j, frame) in out.chunks_exact_mut(rb.max(1)).enumerate() {
                                let src = (oldest + j as i64).max(first as i64) as u64 - first;
                                frame.copy_from_slice(&rows[src as usize * rb..(src as usize + 1) * rb]);
                            }
                        }
                        at += step_bytes;
                    }
                    row = piece_end;
                }
            }
        });
        assert_eq!(at, dst.len(), "destination size does not match the ranges");
    }

    /// Copies the rows of `ranges` of column `col` as stored (one frame per step of
    /// a stacked column), back to back, into `dst`, which must hold exactly that
    /// many rows: what checkpoints save and restore.
    ///
    /// # Safety
    /// As [`Columns::read_ranges`].
    #[inline]
    pub unsafe fn read_stored(&self, col: usize, ranges: &[RowRange], dst: &mut [u8]) {
        let c = self.columns[col];
        let mut at = 0usize;
        for r in ranges {
            let bytes = r.len as usize * c.row_bytes;
            assert!(r.start + r.len as u64 <= self.capacity, "row read past capacity");
            if let Some(p) = c.packed {
                // SAFETY: as below (the caller references the rows' blocks).
                unsafe { self.read_packed(&c, &p, r, &mut dst[at..at + bytes]) };
                at += bytes;
                continue;
            }
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
            if c.packed.is_some() || range.start + range.len as u64 > self.capacity {
                return;
            }
            let (first, rows) = read_span(&c, range);
            let bytes = (rows as usize * c.row_bytes).min(max_bytes);
            let base = self.row_address(&c, first);
            for line in (0..bytes).step_by(64) {
                // SAFETY: a prefetch never faults and changes no memory; the address is
                // inside the mapped column (bounds checked above).
                unsafe { _mm_prefetch::<_MM_HINT_T0>((base + line) as *const i8) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (col, range, max_bytes);
    }

    /// Writes the columns' dirty pages to their file and waits (a file store's
    /// close, before its index is written).
    pub fn sync(&self) -> Result<()> {
        self.region.sync()
    }

    /// True when column `col` is stored compressed (its rows are not where
    /// [`Columns::column_ptr`] says: read them with [`Columns::read_ranges`]).
    pub fn is_compressed(&self, col: usize) -> bool {
        self.columns[col].packed.is_some()
    }

    /// Whether the first page of `range` in column `col` is in memory now (mincore):
    /// for a file store's gathers to tell whether its rows will wait for the disk.
    pub fn resident(&self, col: usize, range: &RowRange) -> bool {
        let c = self.columns[col];
        if c.packed.is_some() || range.start >= self.capacity {
            return true;
        }
        let at = self.row_address(&c, range.start);
        let page = at & !(PAGE - 1);
        let mut vec = 0u8;
        // SAFETY: the page lies inside the mapping (the row does); mincore only reports.
        let rc = unsafe { libc::mincore(page as *mut libc::c_void, PAGE, &mut vec) };
        rc != 0 || vec & 1 == 1
    }

    /// Asks the kernel to read `range` of column `col` in now, in one request
    /// (`MADV_WILLNEED`): a row of many pages of a file store then costs one disk
    /// read instead of a fault per page. Only a hint.
    pub fn will_need(&self, col: usize, range: &RowRange) {
        let c = self.columns[col];
        if c.packed.is_some() || range.start + range.len as u64 > self.capacity {
            return;
        }
        let (first, rows) = read_span(&c, range);
        let at = self.row_address(&c, first);
        let start = at & !(PAGE - 1);
        let end = at + rows as usize * c.row_bytes;
        // SAFETY: the pages lie inside the mapping; MADV_WILLNEED changes no data.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_WILLNEED) };
    }

    /// The address of row `row` of column `c` in this process's mapping (for hints
    /// to the CPU and the kernel; the caller checks the row is inside the column).
    fn row_address(&self, c: &Column, row: u64) -> usize {
        self.region.base() as usize + c.offset + row as usize * c.row_bytes
    }

    /// True for a file store's columns (on a disk, cached by the page cache).
    pub fn on_disk(&self) -> bool {
        self.on_disk
    }

    fn state(&self, p: &Packed, block: u64) -> &AtomicU64 {
        self.block_word(p, block, 0)
    }

    fn written(&self, p: &Packed, block: u64) -> &AtomicU64 {
        self.block_word(p, block, 1)
    }

    fn block_word(&self, p: &Packed, block: u64, word: usize) -> &AtomicU64 {
        assert!(block < self.capacity / self.block_steps as u64, "block {block} past the store");
        // SAFETY: the words are inside the region (`layout`), 8-byte aligned (their
        // area starts 64-aligned), and only ever accessed atomically.
        unsafe { &*(self.region.base().add(p.states + block as usize * 16 + word * 8) as *const AtomicU64) }
    }

    /// A compressed column's block state ([`RAW`], [`KEPT`] or the payload's
    /// length); [`RAW`] for a raw column.
    pub fn block_state(&self, col: usize, block: u32) -> u64 {
        self.columns[col].packed.map_or(RAW, |p| self.state(&p, block as u64).load(Ordering::Acquire))
    }

    /// Compresses `block` of every compressed column that still holds it raw:
    /// one zstd frame per row into the block's slot, then the raw pages go back.
    /// A block whose frames would not save an eighth stays raw ([`KEPT`]).
    ///
    /// # Safety
    /// Every row of the block has been written and none will be again until the
    /// block is leased anew: its leaseholder has filled it (or given it up), or it
    /// was reserved and written whole by a restore. Readers may read it meanwhile.
    pub unsafe fn compress_block(&self, block: u32) {
        for c in &self.columns {
            if let Some(p) = c.packed {
                // SAFETY: this function's contract.
                unsafe { self.compress_column_block(c, &p, block) };
            }
        }
    }

    /// [`Columns::compress_block`] for one column.
    ///
    /// # Safety
    /// As [`Columns::compress_block`], for this column's rows of the block.
    unsafe fn compress_column_block(&self, c: &Column, p: &Packed, block: u32) {
        let bs = self.block_steps as usize;
        let state = self.state(p, block as u64);
        if state.load(Ordering::Acquire) != RAW {
            return;
        }
        let raw_at = c.offset + block as usize * bs * c.row_bytes;
        let slot_at = p.slots + block as usize * p.slot_bytes;
        // SAFETY: the raw rows and the slot lie inside the region (`layout`); the
        // rows are written and stay unchanged (this function's contract), and the
        // slot of a RAW block is touched by no one but its leaseholder, us.
        let (rows, slot) = unsafe {
            (
                std::slice::from_raw_parts(self.region.base().add(raw_at), bs * c.row_bytes),
                std::slice::from_raw_parts_mut(self.region.base().add(slot_at), p.slot_bytes),
            )
        };
        let header = 4 * (bs + 1);
        let limit = (header + rows.len() - rows.len() / 8).min(slot.len());
        let written = ZSTD.with(|z| {
            let mut z = z.borrow_mut();
            if z.compressor.as_ref().is_none_or(|(l, _)| *l != p.level) {
                z.compressor = Some((p.level, zstd::bulk::Compressor::new(p.level).ok()?));
            }
            let (_, compressor) = z.compressor.as_mut()?;
            let mut at = header;
            for (i, row) in rows.chunks_exact(c.row_bytes.max(1)).enumerate() {
                slot[4 * i..4 * i + 4].copy_from_slice(&(at as u32).to_le_bytes());
                at += compressor.compress_to_buffer(row, &mut slot[at..limit]).ok()?;
            }
            slot[4 * bs..header].copy_from_slice(&(at as u32).to_le_bytes());
            Some(at)
        });
        match written {
            Some(len) => {
                // Frames first, then the state (a reader that sees it finds them
                // whole), then the raw pages go: a reader copying them meanwhile
                // sees the state change when it checks again (`read_packed`).
                state.store(len as u64, Ordering::SeqCst);
                // SAFETY: the block's readers read the frames from now on or retry
                // there; its rows are not written until it is leased again.
                unsafe { self.region.remove(raw_at, rows.len()) };
            }
            None => {
                state.store(KEPT, Ordering::SeqCst);
                // SAFETY: the slot of a KEPT block is never read.
                unsafe { self.region.remove(slot_at, p.slot_bytes) };
            }
        }
    }

    /// Makes `block` raw again in every compressed column, giving its slot's pages
    /// back: for its new leaseholder, before it writes a row.
    ///
    /// # Safety
    /// The caller has just leased or reserved the block: nobody else holds, reads
    /// or writes it.
    pub unsafe fn reset_block(&self, block: u32) {
        for c in &self.columns {
            let Some(p) = c.packed else { continue };
            self.written(&p, block as u64).store(0, Ordering::Relaxed);
            let was = self.state(&p, block as u64).swap(RAW, Ordering::AcqRel);
            if was != RAW && was != KEPT {
                // SAFETY: nobody reads the block (this function's contract).
                unsafe { self.region.remove(p.slots + block as usize * p.slot_bytes, was as usize) };
            }
        }
    }

    /// Rows `r` of compressed column `c` into `dst`, block by block.
    ///
    /// # Safety
    /// As [`Columns::read_ranges`].
    unsafe fn read_packed(&self, c: &Column, p: &Packed, r: &RowRange, dst: &mut [u8]) {
        let bs = self.block_steps as u64;
        let (mut row, end, mut at) = (r.start, r.start + r.len as u64, 0usize);
        while row < end {
            let (block, first) = (row / bs, (row % bs) as usize);
            let n = (bs - first as u64).min(end - row) as usize;
            let out = &mut dst[at..at + n * c.row_bytes];
            let state = self.state(p, block);
            loop {
                let seen = state.load(Ordering::SeqCst);
                if seen == RAW || seen == KEPT {
                    // SAFETY: inside the column; referenced by the caller, so not
                    // rewritten; the raw pages may be punched under us, which the
                    // state check below catches.
                    unsafe {
                        let src = self.region.base().add(c.offset + row as usize * c.row_bytes);
                        std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len());
                    }
                    fence(Ordering::SeqCst);
                    if seen == KEPT || state.load(Ordering::SeqCst) == RAW {
                        break;
                    }
                    continue; // compressed meanwhile: read the frames
                }
                // SAFETY: a compressed block's slot is immutable until the block is
                // leased again, which the caller's reference prevents.
                let slot = unsafe {
                    std::slice::from_raw_parts(
                        self.region.base().add(p.slots + block as usize * p.slot_bytes),
                        (seen as usize).min(p.slot_bytes),
                    )
                };
                self.unpack_rows(slot, first, c.row_bytes, out);
                break;
            }
            row += n as u64;
            at += n * c.row_bytes;
        }
    }

    /// Decompresses rows `first..` of a block's `slot` into `out` (whole rows).
    /// A frame that does not decompress to exactly one row (a store file damaged
    /// from outside) leaves that row zeroed and is logged.
    fn unpack_rows(&self, slot: &[u8], first: usize, row_bytes: usize, out: &mut [u8]) {
        let offset = |i: usize| -> usize {
            slot.get(4 * i..4 * i + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        };
        ZSTD.with(|z| {
            let mut z = z.borrow_mut();
            if z.decompressor.is_none() {
                z.decompressor = zstd::bulk::Decompressor::new().ok();
            }
            for (k, dst) in out.chunks_exact_mut(row_bytes.max(1)).enumerate() {
                let (a, b) = (offset(first + k), offset(first + k + 1));
                let frame = slot.get(a..b).unwrap_or(&[]);
                let ok = z.decompressor.as_mut().and_then(|d| d.decompress_to_buffer(frame, dst).ok());
                if ok != Some(row_bytes) {
                    dst.fill(0);
                    tracing::error!(target: "reprise", "a compressed row of store {} does not decompress: \
                                    the store file was changed from outside", self.path().display());
                }
            }
        });
    }

    /// `(raw, stored)`: bytes the columns would take uncompressed, and bytes their
    /// file takes now (compressed blocks, raw ones, slots' and states' pages).
    pub fn memory_bytes(&self) -> (u64, u64) {
        let raw = self.columns.iter().map(|c| c.row_bytes as u64 * self.capacity).sum();
        (raw, self.region.allocated_bytes())
    }

    /// `(blocks compressed, their raw bytes, their compressed bytes)` of column
    /// `col` (zeros for a raw column).
    pub fn compression(&self, col: usize) -> (u64, u64, u64) {
        let c = self.columns[col];
        let Some(p) = c.packed else { return (0, 0, 0) };
        let raw_block = self.block_steps as u64 * c.row_bytes as u64;
        let (mut n, mut packed) = (0u64, 0u64);
        for b in 0..self.capacity / self.block_steps as u64 {
            let s = self.state(&p, b).load(Ordering::Relaxed);
            if s != RAW && s != KEPT {
                n += 1;
                packed += s;
            }
        }
        (n, n * raw_block, packed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::default_directory;
    use crate::signature::{DType, Field};

    fn frames(rows: usize, row_bytes: usize, seed: u8) -> Vec<u8> {
        // Atari-like: mostly flat with a few moving bytes, so it compresses well.
        (0..rows * row_bytes).map(|i| if i % 97 < 3 { (i / 7) as u8 ^ seed } else { 87 }).collect()
    }

    fn columns(capacity: u64, bs: u32, level: Option<i32>) -> Columns {
        let sig = Signature::new(vec![
            Field::new("obs", DType::UInt8, vec![64, 64]).unwrap().compressed(level).unwrap(),
            Field::new("r", DType::Float32, vec![]).unwrap(),
        ])
        .unwrap();
        Columns::create(sig, capacity, bs, &default_directory(), false).unwrap()
    }

    fn read(c: &Columns, col: usize, start: u64, len: u32) -> Vec<u8> {
        let mut out = vec![0u8; len as usize * c.row_bytes(col)];
        // SAFETY: tests own every block of these stores.
        unsafe { c.read_ranges(col, &[RowRange { start, len }], &mut out) };
        out
    }

    #[test]
    fn a_filled_block_is_compressed_reads_back_exactly_and_gives_its_raw_pages_back() {
        let c = columns(64, 16, Some(3));
        let data = frames(40, 4096, 1);
        // SAFETY: the test owns the store; rows are written once.
        unsafe { c.write_rows(0, 0, &data[..10 * 4096]) };
        assert_eq!(c.block_state(0, 0), RAW, "a part-filled block stays raw");
        assert_eq!(read(&c, 0, 0, 10), data[..10 * 4096]);
        // SAFETY: as above.
        unsafe { c.write_rows(0, 10, &data[10 * 4096..]) };
        let s0 = c.block_state(0, 0);
        assert!(s0 != RAW && s0 != KEPT && s0 < 16 * 4096 / 4, "block 0 compressed to {s0} bytes");
        assert!(c.block_state(0, 1) != RAW, "block 1 is full too");
        assert_eq!(c.block_state(0, 2), RAW, "block 2 holds 8 of 16 rows");
        // Every row, across blocks and from the middle of one.
        assert_eq!(read(&c, 0, 0, 40), data);
        assert_eq!(read(&c, 0, 13, 7), data[13 * 4096..20 * 4096]);
        let (raw, after) = c.memory_bytes();
        assert_eq!(raw, 64 * (4096 + 4));
        assert!(after < 16 * 4096, "40 raw rows take 160 KiB; compressed blocks gave theirs back: {after}");
        let (n, raw_bytes, packed) = c.compression(0);
        assert_eq!((n, raw_bytes), (2, 2 * 16 * 4096));
        assert!(packed * 4 < raw_bytes, "{packed} of {raw_bytes}");
        assert_eq!(c.compression(1), (0, 0, 0), "a raw column reports nothing");
    }

    #[test]
    fn data_that_does_not_shrink_stays_raw_and_reads_back() {
        let c = columns(32, 16, Some(1));
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..16 * 4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        // SAFETY: the test owns the store.
        unsafe { c.write_rows(0, 0, &noise) };
        assert_eq!(c.block_state(0, 0), KEPT);
        assert_eq!(read(&c, 0, 0, 16), noise);
    }

    #[test]
    fn a_block_leased_again_is_raw_and_holds_new_rows() {
        let c = columns(32, 16, Some(3));
        let (a, b) = (frames(16, 4096, 1), frames(16, 4096, 2));
        // SAFETY: the test owns the store; reset_block stands for a new lease.
        unsafe {
            c.write_rows(0, 0, &a);
            assert!(c.block_state(0, 0) != RAW);
            c.reset_block(0);
            assert_eq!(c.block_state(0, 0), RAW);
            c.write_rows(0, 0, &b[..8 * 4096]);
            assert_eq!(read(&c, 0, 0, 8), b[..8 * 4096]);
            c.write_rows(0, 8, &b[8 * 4096..]);
        }
        assert!(c.block_state(0, 0) != RAW);
        assert_eq!(read(&c, 0, 0, 16), b);
    }

    #[test]
    fn a_block_given_up_part_filled_is_compressed_whole() {
        let c = columns(32, 16, Some(3));
        let a = frames(5, 4096, 3);
        // SAFETY: the test owns the store; nothing writes block 0 again.
        unsafe {
            c.write_rows(0, 0, &a);
            c.compress_block(0);
        }
        assert!(c.block_state(0, 0) != RAW);
        assert_eq!(read(&c, 0, 0, 5), a);
    }

    #[test]
    fn readers_racing_the_compression_always_read_what_was_written() {
        // A reader copies a block's rows while its writer completes and compresses
        // it (punching the raw pages): the seqlock retry reads the frames instead.
        for round in 0..20u8 {
            let c = std::sync::Arc::new(columns(64, 16, Some(1)));
            let data = frames(16, 4096, round);
            // SAFETY: the test owns the store.
            unsafe { c.write_rows(0, 0, &data[..15 * 4096]) };
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let reader = {
                let (c, stop, want) = (c.clone(), stop.clone(), data[..15 * 4096].to_vec());
                std::thread::spawn(move || {
                    let mut reads = 0;
                    while !stop.load(Ordering::Relaxed) || reads < 10 {
                        assert_eq!(read(&c, 0, 0, 15), want);
                        reads += 1;
                    }
                })
            };
            std::thread::sleep(std::time::Duration::from_micros(200));
            // SAFETY: the last row of block 0; the reader reads only rows 0..15.
            unsafe { c.write_rows(0, 15, &data[15 * 4096..]) };
            stop.store(true, Ordering::Relaxed);
            reader.join().unwrap();
            assert!(c.block_state(0, 0) != RAW);
        }
    }

    #[test]
    fn every_dtype_round_trips_through_compression() {
        for dtype in DType::ALL {
            let sig = Signature::new(vec![Field::new("x", dtype, vec![5]).unwrap().compressed(Some(1)).unwrap()]).unwrap();
            let c = Columns::create(sig, 8, 4, &default_directory(), false).unwrap();
            let bytes: Vec<u8> = (0..8 * c.row_bytes(0)).map(|i| (i % 3) as u8).collect();
            // SAFETY: the test owns the store.
            unsafe { c.write_rows(0, 0, &bytes) };
            assert!(c.block_state(0, 1) != RAW, "{dtype:?}");
            assert_eq!(read(&c, 0, 0, 8), bytes, "{dtype:?}");
        }
    }

    #[test]
    fn compressed_fields_refuse_huge_pages() {
        let sig = Signature::new(vec![Field::new("x", DType::UInt8, vec![8]).unwrap().compressed(Some(1)).unwrap()]).unwrap();
        let e = Columns::create(sig, 8, 4, &default_directory(), true).err().unwrap().to_string();
        assert!(e.contains("compressed") && e.contains("huge_pages"), "{e}");
    }
}

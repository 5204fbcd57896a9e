//! Samples: what a table hands out, holding its rows until they are collected.

use crate::columns::Columns;
use crate::error::PartialSample;
use crate::item::{for_each_block, Window};
use crate::store::{Epoch, Store};

impl PartialSample {
    pub fn new(batch: SampleBatch) -> PartialSample {
        PartialSample(Box::new(batch))
    }

    /// The items drawn.
    pub fn batch(&self) -> &SampleBatch {
        self.0.downcast_ref().expect("a PartialSample is made only from a SampleBatch")
    }

    pub fn into_batch(self) -> SampleBatch {
        *self.0.downcast().expect("a PartialSample is made only from a SampleBatch")
    }
}

/// One drawn item.
#[derive(Clone, Debug)]
pub struct SampledItem {
    pub key: u64,
    pub probability: f64,
    pub priority: f64,
    /// Times sampled, this draw included.
    pub times_sampled: u32,
    pub length: u32,
    pub window: Window,
}

/// A batch of drawn items. Its items' rows stay valid (are not reused by writers)
/// until it is dropped, even when the items are evicted from the table in the
/// meantime: it holds a reference on every block its items touch, or, made with
/// [`SampleBatch::pinned`], one pinned epoch for them all (see `blocks`).
pub struct SampleBatch {
    store: Store,
    pub items: Vec<SampledItem>,
    /// The drawn items' attribute records, end to end (as they were at the draw).
    pub attributes: Vec<u8>,
    /// Items in the table when the draw began.
    pub table_size: u64,
    epoch: Option<Epoch>,
}

impl std::fmt::Debug for SampleBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SampleBatch({} items, table_size={})", self.items.len(), self.table_size)
    }
}

impl SampleBatch {
    pub(crate) fn new(store: Store, table_size: u64) -> SampleBatch {
        SampleBatch { store, items: Vec::new(), attributes: Vec::new(), table_size, epoch: None }
    }

    /// An empty batch that holds its rows by an epoch pinned now, before any draw,
    /// instead of a reference per block: for a collector that reads the rows after
    /// the draw (a device's gather) and drops the batch when that read has ended.
    pub fn pinned(store: &Store) -> SampleBatch {
        let epoch = Some(store.pin());
        SampleBatch { store: store.clone(), items: Vec::new(), attributes: Vec::new(), table_size: 0, epoch }
    }

    /// True when the rows are held by an epoch.
    pub fn is_pinned(&self) -> bool {
        self.epoch.is_some()
    }

    /// Adds a drawn item and its attribute record; the caller holds the table
    /// lock, so its blocks are live.
    #[inline(always)]
    pub(crate) fn push(&mut self, item: SampledItem, record: &[u8]) {
        if self.epoch.is_none() {
            let alloc = self.store.allocator();
            for_each_block(item.window.ranges(), self.store.block_steps(), |b| alloc.retain(b));
        }
        self.items.push(item);
        if !record.is_empty() {
            self.attributes.extend_from_slice(record);
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Hands `out`, in order, the bytes of items `items` of column `col` laid out
    /// `[len, t_max, row]` (zero past each item's length): slices of the store and
    /// of zeros, for a sender to copy straight into its message. Panics when
    /// `items` runs past the batch or an item is longer than `t_max`.
    pub fn for_each_slice(&self, col: usize, t_max: u32, items: std::ops::Range<usize>, mut out: impl FnMut(&[u8])) {
        static ZEROS: [u8; 4096] = [0; 4096];
        let columns = self.store.columns();
        let row = columns.sample_bytes(col);
        let mut scratch = Vec::new();
        for item in &self.items[items] {
            for range in item.window.ranges() {
                if !columns.in_place(col) {
                    scratch.resize(range.len as usize * row, 0);
                    // SAFETY: as below.
                    unsafe { columns.read_ranges(col, std::slice::from_ref(range), &mut scratch) };
                    out(&scratch);
                    continue;
                }
                // SAFETY: the batch holds a reference on every block of its items'
                // windows until it is dropped (`push`), and `self` outlives the slice.
                out(unsafe { columns.rows(col, range) });
            }
            let mut pad = (t_max - item.length) as usize * row;
            while pad > 0 {
                let n = pad.min(ZEROS.len());
                out(&ZEROS[..n]);
                pad -= n;
            }
        }
    }
}

/// Drawn items whose rows can be copied out: a [`SampleBatch`] in process, or a
/// local client's sample read straight from the shared columns.
///
/// # Safety
/// [`Collect::gather`] reads the items' rows with
/// [`Columns::read_ranges`], relying on this contract: every window of `items()`
/// lies inside `columns()`, and for as long as `self` lives a reference on every
/// block those windows touch is held, or an epoch pinned before the items were drawn
/// (so no writer reuses the rows while they are read).
pub unsafe trait Collect: Sync {
    fn items(&self) -> &[SampledItem];
    fn table_size(&self) -> u64;
    fn columns(&self) -> &Columns;

    /// The items' attribute records, end to end (empty without attributes).
    fn attributes(&self) -> &[u8] {
        &[]
    }

    /// The longest item, in steps: the `T` of `[n, T, ...]` arrays.
    fn max_length(&self) -> u32 {
        self.items().iter().map(|i| i.length).max().unwrap_or(0)
    }

    /// True when some item is shorter than the longest (the output needs padding).
    fn ragged(&self) -> bool {
        let t = self.max_length();
        self.items().iter().any(|i| i.length != t)
    }

    /// Copies every column of item `i` into `dst`, column `c` at `offsets[c]`
    /// (the item's `length` rows, nothing past them): one packed row of cluster
    /// mode's exchange. Panics when a column does not fit in `dst`.
    fn copy_item(&self, i: usize, offsets: &[usize], dst: &mut [u8]) {
        let (item, columns) = (&self.items()[i], self.columns());
        for (col, &at) in offsets.iter().enumerate() {
            let bytes = item.length as usize * columns.sample_bytes(col);
            // SAFETY: `copy_item` runs only on a `Collect` implementor, which holds
            // references on its items' blocks (the trait's contract).
            unsafe { columns.read_ranges(col, item.window.ranges(), &mut dst[at..at + bytes]) };
        }
    }

    /// Copies column `col` into `dst` packed: the items' rows end to end, with no
    /// padding (the varlen layout attention kernels take). `dst` holds exactly the
    /// items' total steps. Large copies are split across threads as in `gather`.
    fn gather_packed(&self, col: usize, dst: &mut [u8]) {
        let (items, columns) = (self.items(), self.columns());
        let row = columns.sample_bytes(col);
        let total: usize = items.iter().map(|i| i.length as usize).sum();
        assert_eq!(dst.len(), total * row, "packed gather destination has the wrong size");
        let threads = gather_threads(columns, items, col, dst.len());
        if threads < 2 {
            return gather_runs(columns, items, col, dst);
        }
        // Split at item boundaries into parts of about equal bytes.
        let per = dst.len().div_ceil(threads);
        let mut parts: Vec<(&[SampledItem], &mut [u8])> = Vec::with_capacity(threads);
        let (mut rest_items, mut rest) = (items, dst);
        while !rest_items.is_empty() {
            let (mut k, mut bytes) = (0, 0);
            while k < rest_items.len() && (bytes < per || k == 0) {
                bytes += rest_items[k].length as usize * row;
                k += 1;
            }
            let (its, more_items) = rest_items.split_at(k);
            let (out, more) = std::mem::take(&mut rest).split_at_mut(bytes);
            parts.push((its, out));
            (rest_items, rest) = (more_items, more);
        }
        std::thread::scope(|s| {
            let mut parts = parts.into_iter();
            let first = parts.next();
            for (its, out) in parts {
                s.spawn(move || gather_runs(columns, its, col, out));
            }
            if let Some((its, out)) = first {
                gather_runs(columns, its, col, out);
            }
        });
    }

    /// Copies column `col` into `dst`, laid out `[n, t_max, row]`, and zeroes the
    /// rows past each item's length (so `dst` may be uninitialized memory: a zeroed
    /// allocation of a large sample costs as much as its copy).
    /// Large copies are split across threads (at least [`PARALLEL_BYTES`] each, at
    /// most one per available core): one core cannot saturate memory bandwidth.
    fn gather(&self, col: usize, t_max: u32, dst: &mut [u8]) {
        let (items, columns) = (self.items(), self.columns());
        let stride = t_max as usize * columns.sample_bytes(col);
        assert_eq!(dst.len(), stride * items.len(), "gather destination has the wrong size");
        let threads = gather_threads(columns, items, col, dst.len());
        if threads < 2 {
            return gather_items(columns, items, col, stride, dst);
        }
        let per = items.len().div_ceil(threads);
        std::thread::scope(|s| {
            let mut parts = items.chunks(per).zip(dst.chunks_mut(per * stride));
            let first = parts.next();
            for (its, out) in parts {
                s.spawn(move || gather_items(columns, its, col, stride, out));
            }
            if let Some((its, out)) = first {
                gather_items(columns, its, col, stride, out);
            }
        });
    }
}

/// Bytes a gather thread copies at least (below that, one thread).
pub const PARALLEL_BYTES: usize = 4 << 20;

/// Threads a gather of column `col` of `items` into `bytes` bytes spreads over:
/// [`DISK_THREADS`] when a file store's rows wait for the disk (after asking the
/// kernel for rows of several pages in one request each), else one per
/// [`parallel_bytes`] (at least two of them to split), at most one per core and
/// per item.
fn gather_threads(columns: &Columns, items: &[SampledItem], col: usize, bytes: usize) -> usize {
    if columns.on_disk() && !resident(columns, items, col) {
        // Rows of a file store that wait for the disk: overlap the waits, and read
        // each row of several pages in one request.
        if columns.row_bytes(col) > 4096 {
            for item in items {
                item.window.ranges().iter().for_each(|r| columns.will_need(col, r));
            }
        }
        return DISK_THREADS.min(items.len());
    }
    let least = parallel_bytes(columns, col);
    if bytes < 2 * least {
        return 1;
    }
    (bytes / least).clamp(1, cores()).min(items.len())
}

/// Whether the first rows of a few items are in memory (the page cache): if so, a
/// gather from a file store copies on one thread as from shared memory.
fn resident(columns: &Columns, items: &[SampledItem], col: usize) -> bool {
    items.iter().take(8).all(|i| i.window.ranges().iter().all(|r| columns.resident(col, r)))
}

/// Threads a gather from a file store's columns spreads its items over: a row not in
/// the page cache blocks its thread on the disk, and NVMe drives serve dozens of
/// reads at once.
pub const DISK_THREADS: usize = 16;

/// Bytes a gather thread of column `col` produces at least: [`PARALLEL_BYTES`]
/// for a copy, a sixteenth of it where each row is decompressed (a core
/// decompresses about a sixteenth as fast as it copies).
fn parallel_bytes(columns: &Columns, col: usize) -> usize {
    if columns.is_compressed(col) {
        PARALLEL_BYTES / 16
    } else {
        PARALLEL_BYTES
    }
}

/// Cores this process may use (read once: the lookup parses cgroup files).
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Copies column `col` of `items` into `dst` end to end (packed).
fn gather_runs(columns: &Columns, items: &[SampledItem], col: usize, dst: &mut [u8]) {
    let mut next = 0;
    copy_items(columns, items, col, dst, |_, bytes| {
        let at = next;
        next += bytes;
        at
    });
}

/// Copies column `col` of `items` into `dst` (`stride` bytes per item), zeros past
/// each item's steps.
fn gather_items(columns: &Columns, items: &[SampledItem], col: usize, stride: usize, dst: &mut [u8]) {
    copy_items(columns, items, col, dst, |i, _| i * stride);
    let row = columns.sample_bytes(col);
    for (item, out) in items.iter().zip(dst.chunks_exact_mut(stride.max(1))) {
        out[(item.length as usize * row).min(stride)..].fill(0);
    }
}

/// Copies column `col` of each item `i` (`bytes` of it) to `dst` at `at(i, bytes)`,
/// prefetching a few items ahead so random rows' memory latency overlaps. Runs only
/// inside `Collect::gather` and `Collect::gather_packed`, whose implementor holds
/// references on these items' blocks (the trait's contract).
#[inline(always)]
fn copy_items(columns: &Columns, items: &[SampledItem], col: usize, dst: &mut [u8], mut at: impl FnMut(usize, usize) -> usize) {
    const AHEAD: usize = 8;
    let row = columns.sample_bytes(col);
    let prefetch = |i: usize| {
        if let Some(item) = items.get(i) {
            columns.prefetch(col, &item.window.ranges()[0], 1024);
        }
    };
    (0..AHEAD).for_each(prefetch);
    for (i, item) in items.iter().enumerate() {
        prefetch(i + AHEAD);
        let bytes = item.length as usize * row;
        let at = at(i, bytes);
        // SAFETY: see above: the caller's `Collect` holds the items' blocks.
        unsafe { columns.read_ranges(col, item.window.ranges(), &mut dst[at..at + bytes]) };
    }
}

// SAFETY: `push` retains every block of an item's window (taken while the table's
// lock kept the item, and so its blocks, alive) and `Drop` releases them; or the
// batch pinned an epoch before its first draw, so a block of its items whose last
// reference goes stays in limbo, unused, until the epoch is dropped with the batch.
// The windows are rows of `store`'s columns.
unsafe impl Collect for SampleBatch {
    fn items(&self) -> &[SampledItem] {
        &self.items
    }
    fn table_size(&self) -> u64 {
        self.table_size
    }
    fn columns(&self) -> &Columns {
        self.store.columns()
    }
    fn attributes(&self) -> &[u8] {
        &self.attributes
    }
}

impl Drop for SampleBatch {
    fn drop(&mut self) {
        if self.epoch.is_some() {
            return; // the epoch unpins as it drops
        }
        let alloc = self.store.allocator();
        for item in &self.items {
            for_each_block(item.window.ranges(), self.store.block_steps(), |b| alloc.release(b));
        }
    }
}

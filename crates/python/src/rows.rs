//! `SampleRows`: drawn items whose rows are still held, for collectors that read
//! the rows themselves (the GPU path in `reprise.torch`). Holding it keeps the
//! rows from being reused by writers; `release()` lets them go.

use numpy::{PyArray1, PyArrayMethods};
use parking_lot::Mutex;
use pyo3::prelude::*;
use reprise_client::LocalSample;
use reprise_core::{Collect, SampleBatch};

use crate::errors::invalid;
use crate::sample::sample_object;

/// Drawn items whose rows are held: drawn in process, or by a local client.
pub enum HeldRows {
    InProcess(SampleBatch),
    Local(LocalSample),
}

impl HeldRows {
    pub fn collect(&self) -> &dyn Collect {
        match self {
            HeldRows::InProcess(b) => b,
            HeldRows::Local(c) => c,
        }
    }
}

#[pyclass(name = "SampleRows", module = "reprise._native", frozen)]
pub struct PySampleRows {
    inner: Mutex<Option<HeldRows>>,
}

impl PySampleRows {
    pub fn new(drawn: HeldRows) -> PySampleRows {
        PySampleRows { inner: Mutex::new(Some(drawn)) }
    }

    /// Takes the in-process batch out (to extend it); the object is released.
    pub fn take_local(&self, py: Python<'_>) -> PyResult<SampleBatch> {
        match self.inner.lock().take() {
            Some(HeldRows::InProcess(b)) => Ok(b),
            Some(other) => {
                *self.inner.lock() = Some(other);
                Err(invalid(py, "this sample was drawn through a client; it cannot be extended".into()))
            }
            None => Err(released(py)),
        }
    }

    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&dyn Collect) -> R) -> PyResult<R> {
        let guard = self.inner.lock();
        match guard.as_ref() {
            Some(d) => Ok(f(d.collect())),
            None => Err(released(py)),
        }
    }
}

/// Converts a core error of a draw whose rows a collector will read: a partial
/// result becomes a `SampleRows` (the caller collects it as it would the whole
/// sample, on the same device and fields), not a host `Sample`.
pub fn rows_error(py: Python<'_>, e: reprise_core::Error, signal: Option<PyErr>) -> PyErr {
    use reprise_core::error::{Error, Partial};
    let (e, partial) = match e {
        Error::Timeout { message, partial: Partial::Sampled(b) } if !b.batch().is_empty() => {
            (Error::Timeout { message, partial: Partial::Nothing }, Some(b.into_batch()))
        }
        Error::Interrupted { partial: Partial::Sampled(b) } if !b.batch().is_empty() => (Error::Interrupted { partial: Partial::Nothing }, Some(b.into_batch())),
        other => (other, None),
    };
    let err = crate::raise::to_py(py, e, None, signal);
    if let Some(batch) = partial {
        let rows = match Bound::new(py, PySampleRows::new(HeldRows::InProcess(batch))) {
            Ok(r) => r,
            Err(e) => return e,
        };
        if let Err(e) = err.value(py).setattr("partial", rows) {
            return e;
        }
    }
    err
}

/// Bytes of a packed row's header (see `pack`); its item's length, its CRC-32 and
/// its flag word (1: filled) sit at `LENGTH_AT`, `CRC_AT` and `FLAGS_AT`.
pub const HEADER: usize = 48;
pub const LENGTH_AT: usize = 28;
pub const CRC_AT: usize = 40;
pub const FLAGS_AT: usize = 44;

/// The CRC-32 a packed row carries: of every byte of the row but the CRC word itself
/// (header and data, so a flipped key, probability or flag fails it as a flipped value does).
pub fn row_crc(row: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&row[..CRC_AT]);
    h.update(&row[CRC_AT + 4..]);
    h.finalize()
}

/// Writes a packed row's CRC-32 (`row_crc`) into its CRC word.
fn seal(row: &mut [u8]) {
    let crc = row_crc(row);
    row[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

fn released(py: Python<'_>) -> PyErr {
    invalid(py, "this sample's rows were released".into())
}

type Meta<'py> = (
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<i64>>,
    u64,
    Bound<'py, PyArray1<i64>>,
);

type Indexed<'py> = (
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<i64>>,
    u64,
    Bound<'py, PyArray1<i64>>,
    usize,
    usize,
    bool,
    bool,
);

type PackedIndex<'py> = (
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<i64>>,
    u64,
    Bound<'py, PyArray1<i64>>,
    usize,
    bool,
);

/// `(keys, probabilities, priorities, times_sampled, table_size, lengths)` of `c`'s items.
fn meta_of<'py>(py: Python<'py>, c: &dyn Collect) -> Meta<'py> {
    let items = c.items();
    (
        PyArray1::from_iter(py, items.iter().map(|i| i.key)),
        PyArray1::from_iter(py, items.iter().map(|i| i.probability)),
        PyArray1::from_iter(py, items.iter().map(|i| i.priority)),
        PyArray1::from_iter(py, items.iter().map(|i| i.times_sampled as i64)),
        c.table_size(),
        PyArray1::from_iter(py, items.iter().map(|i| i.length as i64)),
    )
}

/// Writes the row numbers of every step of `c`'s items, end to end, into `dst`;
/// `Ok(total steps)`, or `Err(total)` when `dst` is shorter than that.
fn write_packed_index(c: &dyn Collect, dst: &mut [i64]) -> Result<usize, usize> {
    let total: usize = c.items().iter().map(|i| i.length as usize).sum();
    if dst.len() < total {
        return Err(total);
    }
    let mut at = 0;
    for item in c.items() {
        for r in item.window.ranges() {
            for k in 0..r.len as u64 {
                dst[at] = (r.start + k) as i64;
                at += 1;
            }
        }
    }
    Ok(total)
}

/// Writes the row numbers `[n, T]` of `c`'s items into `dst` (-1 past an item's
/// end); `Ok((n, T, ragged))`, or `Err(n * T)` when `dst` is shorter than that.
fn write_index(c: &dyn Collect, dst: &mut [i64]) -> Result<(usize, usize, bool), usize> {
    let (n, t) = (c.items().len(), c.max_length() as usize);
    if dst.len() < n * t {
        return Err(n * t);
    }
    let mut ragged = false;
    for (i, item) in c.items().iter().enumerate() {
        let mut at = i * t;
        for r in item.window.ranges() {
            for k in 0..r.len as u64 {
                dst[at] = (r.start + k) as i64;
                at += 1;
            }
        }
        if at < (i + 1) * t {
            ragged = true;
            dst[at..(i + 1) * t].fill(-1);
        }
    }
    Ok((n, t, ragged))
}

/// Bytes of status at the start of each source's part of an exchange: its status
/// word (int64, 0: rows follow) and how many of its rows are filled (int64).
pub const STATUS: usize = 16;

/// Each target's item among the drawn items (the count of filled targets before
/// it; None: not filled), and how many are filled.
fn items_of(filled: &[bool]) -> (Vec<Option<usize>>, usize) {
    let mut next = 0usize;
    let items = filled
        .iter()
        .map(|&f| {
            let item = f.then_some(next);
            next += f as usize;
            item
        })
        .collect();
    (items, next)
}

/// Checks that `c` holds `drawn` items and that rows of `stride` bytes at
/// `offsets` fit them (see `pack`); the error's text follows the caller's name.
fn check_packing(c: &dyn Collect, drawn: usize, stride: usize, offsets: &[usize], record: usize, locate: bool) -> Result<(), String> {
    if c.items().len() != drawn {
        return Err(format!(": {} items drawn but {drawn} targets filled", c.items().len()));
    }
    let columns = c.columns();
    if c.attributes().len() != drawn * record {
        return Err(format!(": {} bytes of attribute records for {drawn} items of {record}", c.attributes().len()));
    }
    let widest = c.items().iter().map(|i| i.length as usize).max().unwrap_or(0);
    if locate {
        if offsets.len() != 1 || offsets[0] < HEADER + record || offsets[0] % 8 != 0 || offsets[0] + widest * 8 > stride {
            return Err(format!("(locate): one 8-byte aligned offset past the header and the record, with room for {widest} row numbers in a row of {stride}, is needed"));
        }
        return Ok(());
    }
    if offsets.len() != columns.signature().fields().len() || offsets.first().is_some_and(|&o| o < HEADER + record) || offsets.windows(2).any(|w| w[0] > w[1]) {
        return Err(": one offset per field, ascending, past the header and the record, is needed".into());
    }
    for (col, &at) in offsets.iter().enumerate() {
        if at + widest * columns.sample_bytes(col) > stride {
            return Err(format!(": field {col} of {widest} steps does not fit its row of {stride} bytes"));
        }
    }
    Ok(())
}

/// Writes the packed row (see `pack`) of drawn item `item` of `c` into `row`
/// (every byte of it), or for an unfilled target (None) zeros and its CRC. The
/// layout was checked (`check_packing`).
fn write_row(c: &dyn Collect, row: &mut [u8], offsets: &[usize], shard: u32, item: Option<usize>, record: usize, locate: bool) {
    let Some(i) = item else {
        row.fill(0);
        seal(row);
        return;
    };
    let item = &c.items()[i];
    let first = offsets.first().copied().unwrap_or(row.len());
    if locate {
        let mut words = row[first..].chunks_exact_mut(8);
        for r in item.window.ranges() {
            // The range first: zip asks it before taking a word.
            for (k, w) in (0..r.len as u64).zip(words.by_ref()) {
                w.copy_from_slice(&((r.start + k) as i64).to_le_bytes());
            }
        }
        for w in words {
            w.copy_from_slice(&(-1i64).to_le_bytes());
        }
    } else {
        let columns = c.columns();
        c.copy_item(i, offsets, row);
        // Zeros past each field's steps, up to the next field (or the row's end).
        for (col, &at) in offsets.iter().enumerate() {
            let end = offsets.get(col + 1).copied().unwrap_or(row.len());
            row[at + item.length as usize * columns.sample_bytes(col)..end].fill(0);
        }
    }
    let records = c.attributes();
    row[HEADER..HEADER + record].copy_from_slice(&records[i * record..(i + 1) * record]);
    row[HEADER + record..first].fill(0);
    let (_, _, slot) = reprise_core::cluster::split_key(item.key);
    row[0..8].copy_from_slice(&reprise_core::cluster::global_key(shard, item.key).to_le_bytes());
    row[8..16].copy_from_slice(&item.probability.to_le_bytes());
    row[16..24].copy_from_slice(&item.priority.to_le_bytes());
    for (k, v) in [item.times_sampled, item.length, shard, slot, 0, 1].into_iter().enumerate() {
        row[24 + 4 * k..28 + 4 * k].copy_from_slice(&v.to_le_bytes());
    }
    seal(row);
}

#[pymethods]
impl PySampleRows {
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |c| c.items().len())
    }

    /// `(keys, probabilities, priorities, times_sampled, table_size, lengths)`.
    /// The items' attribute records, end to end (empty without attributes).
    fn records<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let records = self.with(py, |c| c.attributes().to_vec())?;
        Ok(pyo3::types::PyBytes::new(py, &records))
    }

    fn meta<'py>(&self, py: Python<'py>) -> PyResult<Meta<'py>> {
        let guard = self.inner.lock();
        Ok(meta_of(py, guard.as_ref().ok_or_else(|| released(py))?.collect()))
    }

    /// Writes the row numbers `[n, T]` (T = longest item) of every step into the
    /// start of `out` (flat, int64, row-major) and returns `(n, T, ragged)`; ragged
    /// means some entries are -1 (padding past an item's end).
    fn fill_index(&self, py: Python<'_>, out: &Bound<'_, numpy::PyArray1<i64>>) -> PyResult<(usize, usize, bool)> {
        let mut out = out.try_readwrite().map_err(|e| invalid(py, format!("fill_index needs a writable int64 array: {e}")))?;
        let dst = out.as_slice_mut().map_err(|e| invalid(py, format!("fill_index needs a contiguous array: {e}")))?;
        let r = self.with(py, |c| write_index(c, dst))?;
        r.map_err(|need| invalid(py, format!("fill_index: the array holds {} entries, {need} are needed", dst.len())))
    }

    /// `meta()` and `fill_index(out)` in one call: `(keys, probabilities, priorities,
    /// times_sampled, table_size, lengths, n, T, ragged, filled)`; `filled` is False
    /// (and `out` untouched) when `out` holds fewer than `n * T` entries.
    fn index<'py>(&self, py: Python<'py>, out: &Bound<'py, numpy::PyArray1<i64>>) -> PyResult<Indexed<'py>> {
        let mut out = out.try_readwrite().map_err(|e| invalid(py, format!("index needs a writable int64 array: {e}")))?;
        let dst = out.as_slice_mut().map_err(|e| invalid(py, format!("index needs a contiguous array: {e}")))?;
        let guard = self.inner.lock();
        let c = guard.as_ref().ok_or_else(|| released(py))?.collect();
        let (n, t, ragged, filled) = match write_index(c, dst) {
            Ok((n, t, ragged)) => (n, t, ragged, true),
            Err(_) => (c.items().len(), c.max_length() as usize, c.ragged(), false),
        };
        let (keys, probabilities, priorities, times_sampled, table_size, lengths) = meta_of(py, c);
        Ok((keys, probabilities, priorities, times_sampled, table_size, lengths, n, t, ragged, filled))
    }

    /// `meta()` and the row numbers of every step of the items end to end (the
    /// packed layout) in one call: `(keys, probabilities, priorities,
    /// times_sampled, table_size, lengths, total_steps, filled)`; `filled` is False
    /// (and `out` untouched) when `out` holds fewer than `total_steps` entries.
    fn packed_index<'py>(&self, py: Python<'py>, out: &Bound<'py, numpy::PyArray1<i64>>) -> PyResult<PackedIndex<'py>> {
        let mut out = out.try_readwrite().map_err(|e| invalid(py, format!("packed_index needs a writable int64 array: {e}")))?;
        let dst = out.as_slice_mut().map_err(|e| invalid(py, format!("packed_index needs a contiguous array: {e}")))?;
        let guard = self.inner.lock();
        let c = guard.as_ref().ok_or_else(|| released(py))?.collect();
        let (total, filled) = match write_packed_index(c, dst) {
            Ok(total) => (total, true),
            Err(total) => (total, false),
        };
        let (keys, probabilities, priorities, times_sampled, table_size, lengths) = meta_of(py, c);
        Ok((keys, probabilities, priorities, times_sampled, table_size, lengths, total, filled))
    }

    /// The rows copied out on the host: a `reprise.Sample` of numpy arrays. Releases.
    #[pyo3(signature = (fields=None))]
    fn to_sample<'py>(&self, py: Python<'py>, fields: Option<Vec<String>>) -> PyResult<Bound<'py, PyAny>> {
        let drawn = self.inner.lock().take().ok_or_else(|| released(py))?;
        let select = crate::arrays::select_fields(py, drawn.collect().columns().signature(), fields)?;
        match drawn {
            HeldRows::InProcess(b) => sample_object(py, b, select.as_deref()),
            HeldRows::Local(c) => sample_object(py, c, select.as_deref()),
        }
    }

    /// Packs rows for cluster mode's exchange into `out` (uint8, `len(order) *
    /// stride` bytes, any content: every byte is written, so a buffer is reused
    /// across steps without a zero fill). Output row r is drawn target `order[r]`
    /// (`filled[t]`: whether target t got an item; the items are the filled
    /// targets in order). Each row: a 48-byte header (global key u64, probability
    /// f64, priority f64, times sampled u32, length u32, shard u32, slot u32,
    /// CRC-32 of every other byte of the row u32 (`row_crc`), flags u32: 1 = filled),
    /// then the item's attribute record (`record` bytes, a table with attributes),
    /// then column c at `offsets[c]`, its item's rows and zeros past them. An unfilled
    /// target's row is zeros but its CRC (flags 0). Rows are kept held.
    ///
    /// `locate`: rows for a reader of this process's shared memory (same host):
    /// after the header and record, at the one offset given, the store row number
    /// of each of the item's steps (int64) and -1 past its end, instead of its data.
    #[pyo3(signature = (out, stride, offsets, shard, order, filled, record=0, locate=false))]
    #[allow(clippy::too_many_arguments)]
    fn pack<'py>(
        &self,
        py: Python<'py>,
        out: &Bound<'py, PyArray1<u8>>,
        stride: usize,
        offsets: Vec<usize>,
        shard: u32,
        order: numpy::PyReadonlyArray1<'py, i64>,
        filled: numpy::PyReadonlyArray1<'py, bool>,
        record: usize,
        locate: bool,
    ) -> PyResult<()> {
        let mut out = out.try_readwrite().map_err(|e| invalid(py, format!("pack needs a writable uint8 array: {e}")))?;
        let dst = out.as_slice_mut().map_err(|e| invalid(py, format!("pack needs a contiguous array: {e}")))?;
        let order = order.as_slice().map_err(|_| invalid(py, "order must be contiguous".into()))?;
        let filled = filled.as_slice().map_err(|_| invalid(py, "filled must be contiguous".into()))?;
        if dst.len() != order.len() * stride {
            return Err(invalid(py, format!("pack: {} bytes for {} rows of {stride}", dst.len(), order.len())));
        }
        let (item_of, next) = items_of(filled);
        let guard = self.inner.lock();
        let c = guard.as_ref().ok_or_else(|| released(py))?.collect();
        check_packing(c, next, stride, &offsets, record, locate).map_err(|m| invalid(py, format!("pack{m}")))?;
        let result = py.detach(|| {
            for (row, &t) in dst.chunks_exact_mut(stride).zip(order) {
                match item_of.get(t as usize) {
                    Some(&item) if t >= 0 => write_row(c, row, &offsets, shard, item, record, locate),
                    _ => return Err(t),
                }
            }
            Ok(())
        });
        result.map_err(|t| invalid(py, format!("pack: order names target {t}, but there are {}", item_of.len())))
    }

    /// Packs every drawn target into its destination's part of an exchange's send
    /// buffer, `out` (uint8, at least as long as the parts; any content), in one
    /// pass: destination d's part is `STATUS` bytes (status word 0, then how many
    /// of its rows are filled, both int64) and then, in target order, the rows of
    /// the targets t with `dests[t] == d`, `strides[d]` bytes each, as `pack`
    /// writes them (`locate[d]`: locator rows at `locator_offsets`, else data rows
    /// at `offsets`). Returns each part's size in bytes (the parts lie end to end
    /// from byte 0 in destination order) and whether any row went as a locator
    /// (its reader copies from the held rows' blocks). Rows are kept held.
    #[pyo3(signature = (out, dests, strides, offsets, locator_offsets, locate, shard, filled, record=0))]
    #[allow(clippy::too_many_arguments)]
    fn pack_parts<'py>(
        &self,
        py: Python<'py>,
        out: &Bound<'py, PyArray1<u8>>,
        dests: numpy::PyReadonlyArray1<'py, i64>,
        strides: Vec<usize>,
        offsets: Vec<usize>,
        locator_offsets: Vec<usize>,
        locate: Vec<bool>,
        shard: u32,
        filled: numpy::PyReadonlyArray1<'py, bool>,
        record: usize,
    ) -> PyResult<(Vec<usize>, bool)> {
        let mut out = out.try_readwrite().map_err(|e| invalid(py, format!("pack_parts needs a writable uint8 array: {e}")))?;
        let dst = out.as_slice_mut().map_err(|e| invalid(py, format!("pack_parts needs a contiguous array: {e}")))?;
        let dests = dests.as_slice().map_err(|_| invalid(py, "dests must be contiguous".into()))?;
        let filled = filled.as_slice().map_err(|_| invalid(py, "filled must be contiguous".into()))?;
        let world = strides.len();
        if locate.len() != world || dests.len() != filled.len() {
            return Err(invalid(py, format!("pack_parts: {world} strides, {} locate flags, {} dests and {} targets; expected one stride and flag per destination and one dest per target", locate.len(), dests.len(), filled.len())));
        }
        if let Some(&d) = dests.iter().find(|&&d| d < 0 || d as usize >= world) {
            return Err(invalid(py, format!("pack_parts: destination {d} is not a rank of {world}")));
        }
        // Targets grouped by destination, in target order within each (a counting sort).
        let mut first = vec![0usize; world + 1];
        for &d in dests {
            first[d as usize + 1] += 1;
        }
        for d in 0..world {
            first[d + 1] += first[d];
        }
        let mut by_dest = vec![0usize; dests.len()];
        let mut next = first.clone();
        for (t, &d) in dests.iter().enumerate() {
            by_dest[next[d as usize]] = t;
            next[d as usize] += 1;
        }
        let sizes: Vec<usize> = (0..world).map(|d| STATUS + (first[d + 1] - first[d]) * strides[d]).collect();
        let total: usize = sizes.iter().sum();
        if dst.len() < total {
            return Err(invalid(py, format!("pack_parts: {} bytes for parts of {total}", dst.len())));
        }
        let (item_of, drawn) = items_of(filled);
        let guard = self.inner.lock();
        let c = guard.as_ref().ok_or_else(|| released(py))?.collect();
        // Each row layout in use is checked once (parts of one kind share it).
        let mut checked: Vec<(usize, bool)> = Vec::new();
        for d in (0..world).filter(|&d| first[d + 1] > first[d]) {
            if checked.contains(&(strides[d], locate[d])) {
                continue;
            }
            let offsets = if locate[d] { &locator_offsets } else { &offsets };
            check_packing(c, drawn, strides[d], offsets, record, locate[d]).map_err(|m| invalid(py, format!("pack_parts{m}")))?;
            checked.push((strides[d], locate[d]));
        }
        py.detach(|| {
            let mut at = 0;
            for d in 0..world {
                let targets = &by_dest[first[d]..first[d + 1]];
                let part = &mut dst[at..at + sizes[d]];
                let count = targets.iter().filter(|&&t| item_of[t].is_some()).count() as i64;
                part[..8].copy_from_slice(&0i64.to_le_bytes());
                part[8..STATUS].copy_from_slice(&count.to_le_bytes());
                let offsets = if locate[d] { &locator_offsets } else { &offsets };
                for (row, &t) in part[STATUS..].chunks_exact_mut(strides[d].max(1)).zip(targets) {
                    write_row(c, row, offsets, shard, item_of[t], record, locate[d]);
                }
                at += sizes[d];
            }
        });
        let located = (0..world).any(|d| locate[d] && first[d + 1] > first[d]);
        Ok((sizes, located))
    }

    /// Lets the rows go (writers may reuse them). Idempotent.
    fn release(&self, py: Python<'_>) {
        let drawn = self.inner.lock().take();
        py.detach(move || drop(drawn));
    }

    #[getter]
    fn released(&self) -> bool {
        self.inner.lock().is_none()
    }
}

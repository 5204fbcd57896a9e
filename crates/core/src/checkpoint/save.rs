//! Writing a checkpoint: indexes copied and blocks pinned first (a moment per
//! table), then the rows with the tables running, then the indexes and the
//! manifest, then the rename.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::files::{self, Out};
use super::manifest::{utc_time, Manifest, StoreEntry, TableEntry};
use super::{table_file, Compression, Progress, FORMAT, MANIFEST, VERSION};
use crate::error::{Error, Result};
use crate::signature::Signature;
use crate::snapshot::{Pins, TableSnapshot};
use crate::store::Store;
use crate::table::Table;

/// Rows are read and written in pieces of at most this many bytes per column.
const CHUNK: usize = 32 << 20;

/// Reads the rows of a store kept off the host (see [`OffHost`]).
pub trait ReadRows {
    /// Copies whole rows of field `col` (of [`OffHost::signature`]) from row `row`
    /// on into `dst`; their blocks are pinned while this runs.
    fn read_rows(&mut self, col: usize, row: u64, dst: &mut [u8]) -> Result<()>;
}

/// A store whose step data is kept off the host (the Python package's GPU
/// stores): `store` only indexes its blocks; the rows are in `signature`'s
/// fields on `device`, read through `rows`.
pub struct OffHost<'a> {
    pub store: Store,
    pub device: String,
    pub signature: Signature,
    pub rows: &'a mut dyn ReadRows,
}

#[derive(Default)]
pub struct SaveOptions<'a> {
    pub compression: Compression,
    /// Stores of the saved tables kept off the host; every other store is read
    /// from its own columns.
    pub off_host: Vec<OffHost<'a>>,
    pub progress: Option<Progress<'a>>,
    /// File stores' rows stay in their files: the checkpoint references them
    /// (`StoreEntry::file`) instead of copying them. Only through
    /// [`crate::durable::save_index`], which pins an epoch across the save so that
    /// no block the index references is reused while it is written, and whose
    /// callers keep them unreused until a newer index exists (a durable store's
    /// commits) or until the store is loaded from this index again (a close).
    pub in_place: bool,
}

/// Writes a checkpoint of `tables` (at least one, names unique) into a new
/// directory `ckpt-<unix ns>` under `parent` (created 0700 if missing) and
/// returns its path. Inserts and samples go on meanwhile (see the module docs).
/// On failure nothing is left behind but what was there.
pub fn save(parent: &Path, tables: &[Table], mut options: SaveOptions<'_>) -> Result<PathBuf> {
    if tables.is_empty() {
        return Err(Error::InvalidArgument("a checkpoint needs at least one table".into()));
    }
    let names: Vec<&str> = tables.iter().map(|t| t.name()).collect();
    if names.iter().enumerate().any(|(i, n)| names[..i].contains(n)) {
        return Err(Error::InvalidArgument(format!("table names must be unique in a checkpoint, got {names:?}")));
    }
    files::make_dirs(parent)?;
    files::remove_stale_temporaries(parent);
    let (final_path, tmp) = new_names(parent);
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&tmp)
        .map_err(|e| files::io_error(&tmp, "create the directory", e))?;
    let written = write(&tmp, tables, &mut options).and_then(|()| {
        files::fsync_dir(&tmp)?;
        std::fs::rename(&tmp, &final_path).map_err(|e| files::io_error(&final_path, "rename the new checkpoint to", e))?;
        files::fsync_dir(parent)
    });
    if let Err(e) = written {
        files::remove_dir(&tmp);
        return Err(e);
    }
    Ok(final_path)
}

/// `ckpt-<unix ns>` (20 digits, so names sort by time; a later one than any
/// there) and its temporary `.ckpt-<ns>.tmp-<pid>`.
fn new_names(parent: &Path) -> (PathBuf, PathBuf) {
    let mut ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    loop {
        let name = format!("ckpt-{ns:020}");
        let final_path = parent.join(&name);
        if !final_path.exists() {
            return (final_path, parent.join(format!(".{name}.tmp-{}", std::process::id())));
        }
        ns += 1;
    }
}

/// The manifest's entry of a store written with `rows` and `columns` (files), or
/// saved in place in `file`.
fn store_entry(s: &StoreOut, rows: String, columns: std::collections::BTreeMap<String, String>, file: Option<String>) -> StoreEntry {
    StoreEntry {
        signature: s.fields.iter().map(|f| f.0.clone()).collect(),
        capacity: s.store.capacity(),
        block_steps: s.store.block_steps(),
        device: s.device.clone(),
        rows,
        columns,
        // `{field: zstd level}` of the store's compressed fields.
        compress: s.store.signature().fields().iter().filter_map(|f| Some((f.name.clone(), f.compress?))).collect(),
        stack: s.store.signature().fields().iter().filter(|f| f.stack > 1).map(|f| (f.name.clone(), f.stack)).collect(),
        padding: s
            .store
            .signature()
            .fields()
            .iter()
            .filter(|f| f.stack > 1 && f.padding != crate::StackPadding::Reset)
            .map(|f| (f.name.clone(), f.padding.name().to_string()))
            .collect(),
        file,
    }
}

/// A field as the manifest lists it.
type FieldEntry = (String, Vec<usize>, String);

/// One store being written: its tables' pins (merged), fields and row source.
struct StoreOut {
    store: Store,
    pins: Pins,
    tables: Vec<usize>,
    /// The manifest's `[name, shape, dtype]` and row bytes of each field.
    fields: Vec<(FieldEntry, usize)>,
    device: String,
    off_host: Option<usize>,
}

fn write(tmp: &Path, tables: &[Table], options: &mut SaveOptions<'_>) -> Result<()> {
    // Every index first (a moment each), then the data with the tables running.
    // An index saved in place copies no row, so it pins no block: the caller's epoch
    // keeps any block whose items go meanwhile from reuse (`durable::save_index`).
    let in_place = |t: &Table| options.in_place && t.store().persistent() && !options.off_host.iter().any(|o| o.store.same(t.store()));
    let (snaps, pins): (Vec<TableSnapshot>, Vec<Pins>) = tables.iter().map(|t| t.snapshot_pinning(!in_place(t))).unzip();
    let mut stores: Vec<StoreOut> = Vec::new();
    let mut table_store = Vec::with_capacity(tables.len());
    for (k, (t, p)) in tables.iter().zip(pins).enumerate() {
        if let Some(s) = stores.iter().position(|s| s.store.same(t.store())) {
            stores[s].pins.absorb(p);
            stores[s].tables.push(k);
            table_store.push(s);
            continue;
        }
        let off_host = options.off_host.iter().position(|o| o.store.same(t.store()));
        let (sig, device) = match off_host {
            Some(o) => (&options.off_host[o].signature, options.off_host[o].device.clone()),
            None => (t.store().signature(), "cpu".to_string()),
        };
        let fields = sig.fields().iter().map(|f| ((f.name.clone(), f.shape.clone(), f.dtype.name().to_string()), f.row_bytes())).collect();
        table_store.push(stores.len());
        stores.push(StoreOut { store: t.store().clone(), pins: p, tables: vec![k], fields, device, off_host });
    }
    let pieces: Vec<Vec<Piece>> = stores
        .iter()
        .map(|s| pieces(&s.tables.iter().map(|&k| &snaps[k]).collect::<Vec<_>>(), s.store.block_steps(), s.store.signature().lead()))
        .collect();
    let step_bytes = |s: &StoreOut| s.fields.iter().map(|f| f.1 as u64).sum::<u64>();
    let total: u64 = stores.iter().zip(&pieces).map(|(s, p)| p.iter().map(|x| x.count).sum::<u64>() * step_bytes(s)).sum();
    let mut done = 0u64;
    if let Some(progress) = options.progress.as_mut() {
        progress(0, total)?;
    }
    let mut manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        created: utc_time(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())),
        compression: options.compression.name().map(str::to_string),
        stores: Vec::new(),
        tables: Vec::new(),
        files: Default::default(),
    };
    for (i, (s, pieces)) in stores.iter_mut().zip(&pieces).enumerate() {
        let mut rows = Out::create(tmp.join(format!("store-{i}.rows")), Compression::None)?;
        let mut runs = Vec::with_capacity(pieces.len() * 16);
        for p in pieces {
            runs.extend_from_slice(&(p.start as i64).to_le_bytes());
            runs.extend_from_slice(&(p.count as i64).to_le_bytes());
        }
        rows.write(&runs)?;
        let (rows_name, entry) = rows.close()?;
        manifest.files.insert(rows_name.clone(), entry);
        if options.in_place && s.store.persistent() && s.off_host.is_none() {
            // The indexes were taken above: every row they reference is in the
            // mapping, and is on disk once this returns.
            s.store.columns().sync()?;
            let file = s.store.path().to_string_lossy().into_owned();
            manifest.stores.push(store_entry(s, rows_name, Default::default(), Some(file)));
            continue;
        }
        let mut outs = (0..s.fields.len())
            .map(|j| Out::create(tmp.join(format!("store-{i}.col-{j}")), options.compression))
            .collect::<Result<Vec<_>>>()?;
        // Block by block, oldest items first: each block's pin goes as soon as its
        // rows are written, so writers that need room get the oldest blocks back
        // early. Adjacent pieces are written together (up to CHUNK bytes of steps).
        let row_bytes = step_bytes(s) as usize;
        let mut last_piece: HashMap<u32, usize> = HashMap::new();
        for (n, p) in pieces.iter().enumerate() {
            last_piece.insert(p.block, n);
        }
        let mut buf = Vec::new();
        let mut at = 0;
        while at < pieces.len() {
            let (first, mut end) = (pieces[at].start, pieces[at].start + pieces[at].count);
            let mut last = at;
            while last + 1 < pieces.len()
                && pieces[last + 1].start == end
                && ((end - first + pieces[last + 1].count) as usize).saturating_mul(row_bytes) <= CHUNK
            {
                last += 1;
                end += pieces[last].count;
            }
            for (j, out) in outs.iter_mut().enumerate() {
                let rb = s.fields[j].1;
                let per_chunk = (CHUNK / rb.max(1)).max(1) as u64;
                let mut row = first;
                while row < end {
                    let n = per_chunk.min(end - row);
                    buf.resize(n as usize * rb, 0);
                    match s.off_host {
                        Some(o) => options.off_host[o].rows.read_rows(j, row, &mut buf)?,
                        None => s.pins.read_rows(j, row, &mut buf)?,
                    }
                    out.write(&buf)?;
                    row += n;
                }
            }
            done += (end - first) * row_bytes as u64;
            if let Some(progress) = options.progress.as_mut() {
                progress(done, total)?;
            }
            // Blocks none of whose pieces is still to come.
            let mut written: Vec<u32> = pieces[at..=last].iter().map(|p| p.block).filter(|b| last_piece[b] <= last).collect();
            written.sort_unstable();
            written.dedup();
            s.pins.release_blocks(&written);
            at = last + 1;
        }
        let mut columns = std::collections::BTreeMap::new();
        for (out, f) in outs.into_iter().zip(&s.fields) {
            let (name, entry) = out.close()?;
            manifest.files.insert(name.clone(), entry);
            columns.insert(f.0 .0.clone(), name);
        }
        manifest.stores.push(store_entry(s, rows_name, columns, None));
    }
    drop(stores); // the remaining pins
    for (k, snap) in snaps.iter().enumerate() {
        let (index, bytes) =
            table_file::encode(snap).map_err(|e| Error::InvalidArgument(format!("table '{}': {e}", snap.config.name)))?;
        let mut out = Out::create(tmp.join(format!("table-{k}.npz")), Compression::None)?;
        out.write(&bytes)?;
        let (file, entry) = out.close()?;
        manifest.files.insert(file.clone(), entry);
        manifest.tables.push(TableEntry { file, store: table_store[k], index });
    }
    let mut out = Out::create(tmp.join(MANIFEST), Compression::None)?;
    out.write(manifest.to_text().as_bytes())?;
    out.close()?;
    Ok(())
}

/// Rows `[start, start + count)`, all in `block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub block: u32,
    pub start: u64,
    pub count: u64,
}

/// `{block: rank}`: blocks in the order of the oldest item (by insertion
/// sequence, ties in table order) whose first row lies in them — the order a
/// ring store evicts them in. Blocks holding no item's first row are not ranked.
pub(crate) fn block_rank(snaps: &[&TableSnapshot], block_steps: u32) -> HashMap<u32, usize> {
    let mut firsts: Vec<(u64, u64)> =
        snaps.iter().flat_map(|s| s.items.iter().filter_map(|i| i.ranges.first().map(|r| (i.seq, r.start)))).collect();
    firsts.sort_by_key(|&(seq, _)| seq); // stable
    let mut rank = HashMap::new();
    for (_, start) in firsts {
        let b = (start / block_steps as u64) as u32;
        let next = rank.len();
        rank.entry(b).or_insert(next);
    }
    rank
}

/// The rows the items of `snaps` reference, as pieces of one block each: runs
/// merged, blocks ordered by [`block_rank`] (unranked ones last, by number),
/// pieces of one block by row. A store with stacked fields (`lead` > 0) saves
/// the `lead` rows before each run too (within its block: a stacked step's
/// frames), so that a restore puts every frame back where samples read it.
pub(crate) fn pieces(snaps: &[&TableSnapshot], block_steps: u32, lead: u32) -> Vec<Piece> {
    let bs = block_steps as u64;
    let back = |a: u64| a.saturating_sub(lead as u64).max(a / bs * bs);
    let mut ranges: Vec<(u64, u64)> = snaps
        .iter()
        .flat_map(|s| s.items.iter().flat_map(|i| i.ranges.iter().map(|r| (back(r.start), r.start + r.len as u64))))
        .collect();
    ranges.sort_by_key(|r| r.0);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (a, b) in ranges {
        match runs.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => runs.push((a, b)),
        }
    }
    let mut out = Vec::new();
    for (mut a, end) in runs {
        while a < end {
            let b = end.min((a / bs + 1) * bs);
            out.push(Piece { block: (a / bs) as u32, start: a, count: b - a });
            a = b;
        }
    }
    let rank = block_rank(snaps, block_steps);
    let key = |b: u32| rank.get(&b).map_or(rank.len() + b as usize, |&r| r);
    out.sort_by_key(|p| (key(p.block), p.start));
    out
}

//! Loading a checkpoint: every file checked as it is read, the small ones
//! (indexes, row runs) before any store is made; on any failure the stores made
//! so far are removed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::files::In;
use super::manifest::{FileEntry, Manifest, StoreEntry};
use super::save::block_rank;
use super::{checkpoints, table_file, Compression, Progress, MANIFEST};
use crate::error::{Error, Result};
use crate::signature::{DType, Field, Signature};
use crate::snapshot::{Pins, TableSnapshot};
use crate::store::Store;
use crate::table::Table;

/// Progress is reported about every this many bytes (and at the end of each file).
const REPORT_EVERY: u64 = 4 << 20;
/// Rows are read in pieces of at most this many bytes.
const CHUNK: usize = 32 << 20;

/// A store of the checkpoint, as saved.
#[derive(Clone, Debug)]
pub struct StoreSpec {
    /// Its position in the manifest.
    pub index: usize,
    pub signature: Signature,
    pub capacity: u64,
    pub block_steps: u32,
    /// `"cpu"`, or the device it was kept on.
    pub device: String,
    /// A file store saved in place: its columns file (the rows are there).
    pub file: Option<std::path::PathBuf>,
}

/// Writes the rows of a store kept off the host (see [`MakeStore`]).
pub trait WriteRows {
    /// Writes whole rows of field `col` (of the saved signature) from row `row` on.
    fn write_rows(&mut self, col: usize, row: u64, bytes: &[u8]) -> Result<()>;
}

/// A store made for a checkpoint being loaded. With `rows`, the step data goes
/// there and `store` only indexes blocks; without, into `store`'s columns, which
/// must have the saved signature.
pub struct NewStore {
    pub store: Store,
    pub rows: Option<Box<dyn WriteRows>>,
}

/// Makes the stores of a checkpoint being loaded (the Python package makes its
/// own, GPU stores included). Without one, [`load`] makes host stores in the
/// default directory, with every store's rows in host memory.
pub trait MakeStore {
    /// An empty store for `spec`, with `spec`'s capacity and block steps.
    fn make_store(&mut self, spec: &StoreSpec) -> Result<NewStore>;
}

#[derive(Default)]
pub struct LoadOptions<'a> {
    pub stores: Option<&'a mut dyn MakeStore>,
    pub progress: Option<Progress<'a>>,
}

/// What [`load`] made: the stores and the tables over them, in manifest order.
pub struct Loaded {
    /// The checkpoint loaded.
    pub path: PathBuf,
    pub manifest: Manifest,
    pub stores: Vec<Store>,
    pub tables: Vec<Table>,
    /// Index into `stores` of each table's store.
    pub table_store: Vec<usize>,
}

/// Loads the checkpoint at `path`, or when `path` holds no manifest, the newest
/// checkpoint under it that loads. `Corrupt` (naming the file) when the
/// checkpoint is damaged, incomplete or of another version; nothing is left
/// behind then.
pub fn load(path: &Path, mut options: LoadOptions<'_>) -> Result<Loaded> {
    if path.join(MANIFEST).exists() {
        return load_one(path, &mut options);
    }
    for c in checkpoints(path) {
        match load_one(&c, &mut options) {
            Err(Error::Corrupt(_)) => continue,
            other => return other,
        }
    }
    Err(Error::Corrupt(format!("{}: no valid checkpoint here", path.display())))
}

/// A saved store's fields, its row runs and its tables' snapshots.
struct Planned<'m> {
    entry: &'m StoreEntry,
    spec: StoreSpec,
    runs: Vec<(u64, u64)>,
    tables: Vec<usize>,
}

fn load_one(ckpt: &Path, options: &mut LoadOptions<'_>) -> Result<Loaded> {
    let manifest = Manifest::read(ckpt)?;
    let mpath = ckpt.join(MANIFEST);
    let bad = |what: String| Error::Corrupt(format!("{}: {what}", mpath.display()));
    let compression = Compression::from_name(manifest.compression.as_deref()).map_err(|e| bad(e.to_string()))?;
    // The indexes first (small): every table file checked before any store exists.
    let mut snaps: Vec<TableSnapshot> = Vec::with_capacity(manifest.tables.len());
    for t in &manifest.tables {
        if t.store >= manifest.stores.len() {
            return Err(bad(format!("table '{}' is over store {}, which it does not list", t.index.name, t.store)));
        }
        let bytes = In::open(ckpt, &t.file, &manifest.files, Compression::None)?.read_all()?;
        let snap = table_file::decode(&t.index, &bytes)
            .map_err(|e| Error::Corrupt(format!("{}: unreadable ({e})", ckpt.join(&t.file).display())))?;
        snaps.push(snap);
    }
    let mut plans = Vec::with_capacity(manifest.stores.len());
    for (index, s) in manifest.stores.iter().enumerate() {
        let fields = s
            .signature
            .iter()
            .map(|(name, shape, dtype)| {
                let padding = s.padding.get(name).map_or(Ok(crate::StackPadding::Reset), |p| crate::StackPadding::from_name(p))?;
                Field::new(name, DType::from_name(dtype)?, shape.clone())?
                    .compressed(s.compress.get(name).copied())?
                    .stacked(s.stack.get(name).copied().unwrap_or(1), padding)
            })
            .collect::<Result<Vec<_>>>()
            .and_then(Signature::new)
            .map_err(|e| bad(format!("store {index}: {e}")))?;
        if s.block_steps == 0 || s.capacity == 0 || s.capacity % s.block_steps as u64 != 0 {
            return Err(bad(format!("capacity {} is not whole blocks of {}", s.capacity, s.block_steps)));
        }
        if let Some(f) = fields.fields().iter().find(|f| s.file.is_none() && !s.columns.contains_key(&f.name)) {
            return Err(bad(format!("store {index} has no column file for field '{}'", f.name)));
        }
        let raw = In::open(ckpt, &s.rows, &manifest.files, Compression::None)?.read_all()?;
        let rows_path = ckpt.join(&s.rows);
        if raw.len() % 16 != 0 {
            return Err(Error::Corrupt(format!("{}: not whole (start, count) pairs", rows_path.display())));
        }
        let mut runs = Vec::with_capacity(raw.len() / 16);
        for pair in raw.chunks_exact(16) {
            let start = i64::from_le_bytes(pair[..8].try_into().expect("8 bytes"));
            let count = i64::from_le_bytes(pair[8..].try_into().expect("8 bytes"));
            if start < 0 || count < 0 || start.checked_add(count).is_none_or(|end| end as u64 > s.capacity) {
                return Err(Error::Corrupt(format!("{}: rows outside the store", rows_path.display())));
            }
            runs.push((start as u64, count as u64));
        }
        let spec = StoreSpec {
            index,
            signature: fields,
            capacity: s.capacity,
            block_steps: s.block_steps,
            device: s.device.clone(),
            file: s.file.as_ref().map(std::path::PathBuf::from),
        };
        let tables = (0..manifest.tables.len()).filter(|&k| manifest.tables[k].store == index).collect();
        plans.push(Planned { entry: s, spec, runs, tables });
    }
    let mut made: Vec<Store> = Vec::with_capacity(plans.len());
    let result = build(ckpt, &manifest.files, &plans, &snaps, compression, options, &mut made);
    match result {
        Ok((tables, pins)) => {
            drop(pins); // the tables hold their blocks now
            let table_store = manifest.tables.iter().map(|t| t.store).collect();
            Ok(Loaded { path: ckpt.to_path_buf(), manifest, stores: made, tables, table_store })
        }
        Err(e) => {
            for s in &made {
                s.unlink();
            }
            Err(e)
        }
    }
}

/// Makes the stores, writes their rows back and restores the tables.
fn build(
    ckpt: &Path,
    files: &BTreeMap<String, FileEntry>,
    plans: &[Planned<'_>],
    snaps: &[TableSnapshot],
    compression: Compression,
    options: &mut LoadOptions<'_>,
    made: &mut Vec<Store>,
) -> Result<(Vec<Table>, Vec<Pins>)> {
    let total: u64 =
        plans.iter().map(|p| p.runs.iter().map(|r| r.1).sum::<u64>() * p.spec.signature.step_bytes() as u64).sum();
    if let Some(progress) = options.progress.as_mut() {
        progress(0, total)?;
    }
    let mpath = ckpt.join(MANIFEST);
    let mut all_pins = Vec::with_capacity(plans.len());
    let (mut done, mut reported) = (0u64, 0u64);
    for plan in plans {
        let spec = &plan.spec;
        let NewStore { store, mut rows } = match options.stores.as_mut() {
            Some(maker) => maker.make_store(spec)?,
            None => match &spec.file {
                Some(path) => NewStore { store: Store::open_file(path, spec.signature.clone(), spec.capacity, spec.block_steps)?, rows: None },
                None => NewStore { store: Store::new(spec.signature.clone(), spec.capacity, spec.block_steps, None)?, rows: None },
            },
        };
        made.push(store.clone());
        if store.capacity() != spec.capacity || store.block_steps() != spec.block_steps {
            return Err(Error::Corrupt(format!(
                "{}: capacity {} is not whole blocks of {}",
                mpath.display(),
                spec.capacity,
                spec.block_steps
            )));
        }
        if rows.is_none() && store.signature().describe() != spec.signature.describe() {
            return Err(Error::InvalidArgument(format!(
                "store {}: made with {}, saved with {}",
                spec.index,
                store.signature().describe(),
                spec.signature.describe()
            )));
        }
        let bs = spec.block_steps as u64;
        let mut blocks: Vec<u32> =
            plan.runs.iter().filter(|r| r.1 > 0).flat_map(|&(a, c)| (a / bs..=(a + c - 1) / bs).map(|b| b as u32)).collect();
        blocks.sort_unstable();
        blocks.dedup();
        let mine: Vec<&TableSnapshot> = plan.tables.iter().map(|&k| &snaps[k]).collect();
        let rank = block_rank(&mine, spec.block_steps);
        blocks.sort_by_key(|b| (rank.get(b).copied().unwrap_or(rank.len()), *b));
        if spec.file.is_some() {
            if rows.is_some() || !store.persistent() || Some(store.path()) != spec.file.as_deref() {
                return Err(Error::InvalidArgument(format!(
                    "store {}: saved in place in {}, so it must be loaded over that file",
                    spec.index,
                    spec.file.as_deref().unwrap_or(Path::new("")).display()
                )));
            }
            // The rows are where the checkpoint found them: hold their blocks, copy nothing.
            let pins = store.reserve_blocks_in_place(&blocks)?;
            done += plan.runs.iter().map(|r| r.1).sum::<u64>() * spec.signature.step_bytes() as u64;
            all_pins.push(pins);
            continue;
        }
        let pins = store.reserve_blocks(&blocks)?;
        let mut buf = Vec::new();
        for (j, f) in spec.signature.fields().iter().enumerate() {
            let rb = f.row_bytes();
            let per_chunk = (CHUNK / rb.max(1)).max(1) as u64;
            let mut src = In::open(ckpt, &plan.entry.columns[&f.name], files, compression)?;
            for &(a, c) in &plan.runs {
                let mut row = a;
                while row < a + c {
                    let n = per_chunk.min(a + c - row);
                    buf.resize(n as usize * rb, 0);
                    src.read_exact(&mut buf)?;
                    match rows.as_mut() {
                        Some(w) => w.write_rows(j, row, &buf)?,
                        None => store.write_reserved(&pins, j, row, &buf)?,
                    }
                    row += n;
                    done += buf.len() as u64;
                    if done - reported >= REPORT_EVERY {
                        if let Some(progress) = options.progress.as_mut() {
                            progress(done, total)?;
                        }
                        reported = done;
                    }
                }
            }
            src.finish()?;
            if let Some(progress) = options.progress.as_mut() {
                progress(done, total)?;
            }
            reported = done;
        }
        pins.compress();
        all_pins.push(pins);
    }
    let mut tables = Vec::with_capacity(snaps.len());
    for (plan, store) in plans.iter().zip(made.iter()) {
        for &k in &plan.tables {
            tables.push((k, Table::restore(&snaps[k], store)?));
        }
    }
    tables.sort_by_key(|(k, _)| *k);
    Ok((tables.into_iter().map(|(_, t)| t).collect(), all_pins))
}

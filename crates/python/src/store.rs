//! `Store` for Python.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use reprise_core::signature::{DType, Field, Signature, StackPadding};
use reprise_core::Store;

use crate::arrays::{field_infos, FieldInfo};
use crate::errors::invalid;
use crate::raise::py_err;

#[pyclass(name = "Store", module = "reprise._native", frozen)]
pub struct PyStore {
    pub store: Store,
    pub fields: Arc<Vec<FieldInfo>>,
}

#[pymethods]
impl PyStore {
    #[new]
    #[pyo3(signature = (fields, capacity, block_steps, directory=None, huge_pages=false, compress=Vec::new(), file=None, open=false, stacks=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        fields: Vec<(String, Vec<i64>, String)>,
        capacity: i64,
        block_steps: i64,
        directory: Option<PathBuf>,
        huge_pages: bool,
        compress: Vec<Option<i32>>,
        file: Option<PathBuf>,
        open: bool,
        stacks: Vec<(u32, String)>,
    ) -> PyResult<Self> {
        if !compress.is_empty() && compress.len() != fields.len() {
            return Err(invalid(py, format!("compress: {} levels for {} fields", compress.len(), fields.len())));
        }
        if !stacks.is_empty() && stacks.len() != fields.len() {
            return Err(invalid(py, format!("stacks: {} stacks for {} fields", stacks.len(), fields.len())));
        }
        let err = py_err(py);
        let mut sig = Vec::with_capacity(fields.len());
        for (i, (name, shape, dtype)) in fields.into_iter().enumerate() {
            let dtype = DType::from_name(&dtype).map_err(|e| invalid(py, format!("field '{name}': {e}")))?;
            if let Some(d) = shape.iter().find(|&&d| d < 1) {
                return Err(invalid(py, format!("field '{name}' has shape {shape:?} with a dimension of {d}: every dimension must be >= 1")));
            }
            let field = Field::new(&name, dtype, shape.iter().map(|&d| d as usize).collect())
                .and_then(|f| f.compressed(compress.get(i).copied().flatten()))
                .and_then(|f| match stacks.get(i) {
                    Some((k, padding)) => f.stacked(*k, StackPadding::from_name(padding)?),
                    None => Ok(f),
                })
                .map_err(&err)?;
            sig.push(field);
        }
        let sig = Signature::new(sig).map_err(&err)?;
        if capacity < 1 {
            return Err(invalid(py, format!("capacity must be >= 1 step, got {capacity}")));
        }
        if !(1..=u32::MAX as i64).contains(&block_steps) {
            return Err(invalid(py, format!("block_steps must be between 1 and 2^32-1, got {block_steps}")));
        }
        let fields = Arc::new(field_infos(py, &sig)?);
        // `file`: a file store's columns file, new (or, with `open`, made before).
        let store = py
            .detach(|| match (&file, open) {
                (Some(path), false) => Store::create_file(sig, capacity as u64, block_steps as u32, path),
                (Some(path), true) => Store::open_file(path, sig, capacity as u64, block_steps as u32),
                (None, _) => Store::create(sig, capacity as u64, block_steps as u32, directory.as_deref(), huge_pages),
            })
            .map_err(&err)?;
        Ok(PyStore { store, fields })
    }

    #[getter]
    fn capacity(&self) -> u64 {
        self.store.capacity()
    }

    #[getter]
    fn block_steps(&self) -> u32 {
        self.store.block_steps()
    }

    #[getter]
    fn num_blocks(&self) -> u32 {
        self.store.num_blocks()
    }

    #[getter]
    fn free_blocks(&self) -> usize {
        self.store.free_blocks()
    }

    /// Blocks free of references but waiting for GPU gathers in flight (epochs) to end.
    #[getter]
    fn limbo_blocks(&self) -> usize {
        self.store.limbo_blocks()
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.store.path().to_path_buf()
    }

    /// True for a file store (its file stays when it goes).
    #[getter]
    fn persistent(&self) -> bool {
        self.store.persistent()
    }

    /// Writes the columns' dirty pages to their file and waits (file stores).
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.store.clone();
        py.detach(move || store.columns().sync()).map_err(py_err(py))
    }

    /// Makes this file store durable, its committed indexes in `index`.
    fn make_durable(&self, py: Python<'_>, index: PathBuf) -> PyResult<()> {
        reprise_core::durable::make_durable(&self.store, &index).map_err(py_err(py))
    }

    #[getter]
    fn durable(&self) -> bool {
        self.store.durable().is_some()
    }

    /// A durable store's group commit (at once for any other store).
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.store.clone();
        py.detach(move || store.commit()).map_err(py_err(py))
    }

    /// `(commits, seconds in them, seconds of the last)` of a durable store.
    fn commit_stats(&self) -> (u64, f64, f64) {
        let s = self.store.durable().map(|d| d.stats()).unwrap_or_default();
        (s.commits, s.seconds, s.last_seconds)
    }

    /// Writes the file store's tables' indexes in place into a new checkpoint under
    /// `index` (the columns written back first) and removes the older ones; returns
    /// its path (None, and `index` removed, with no table over the store).
    fn save_index(&self, py: Python<'_>, index: PathBuf) -> PyResult<Option<PathBuf>> {
        let store = self.store.clone();
        py.detach(move || reprise_core::durable::save_index(&store, &index)).map_err(py_err(py))
    }

    /// `(raw, stored)`: bytes the columns would take uncompressed, and bytes their
    /// file takes now.
    fn memory_bytes(&self) -> (u64, u64) {
        self.store.columns().memory_bytes()
    }

    /// `{field: (blocks compressed, their raw bytes, their compressed bytes)}` of
    /// the compressed fields.
    fn compression(&self) -> std::collections::HashMap<String, (u64, u64, u64)> {
        let c = self.store.columns();
        c.signature()
            .fields()
            .iter()
            .enumerate()
            .filter(|(i, _)| c.is_compressed(*i))
            .map(|(i, f)| (f.name.clone(), c.compression(i)))
            .collect()
    }

    /// Copies rows `rows` of field `col` into `out` (`len(rows) * row_bytes` bytes),
    /// decompressing compressed ones: the row reader of callers that read rows by
    /// number (`reprise.transitions`). The caller holds the rows' blocks (a draw's
    /// held rows) for the call; a row number past the store is refused.
    fn read_rows(&self, py: Python<'_>, col: usize, rows: numpy::PyReadonlyArray1<'_, i64>, mut out: numpy::PyReadwriteArray1<'_, u8>) -> PyResult<()> {
        let columns = self.store.columns();
        if col >= columns.signature().len() {
            return Err(invalid(py, format!("read_rows: field {col} of {}", columns.signature().len())));
        }
        let rows = rows.as_slice().map_err(|_| invalid(py, "read_rows: rows must be contiguous".into()))?;
        let out = out.as_slice_mut().map_err(|_| invalid(py, "read_rows: out must be contiguous".into()))?;
        let row_bytes = columns.row_bytes(col);
        if out.len() != rows.len() * row_bytes {
            return Err(invalid(py, format!("read_rows: out holds {} bytes, {} rows of {row_bytes} need {}", out.len(), rows.len(), rows.len() * row_bytes)));
        }
        if let Some(&r) = rows.iter().find(|&&r| r < 0 || r as u64 >= columns.capacity()) {
            return Err(invalid(py, format!("read_rows: row {r} is outside the store (capacity {})", columns.capacity())));
        }
        let read = |rows: &[i64], out: &mut [u8]| {
            for (&r, dst) in rows.iter().zip(out.chunks_exact_mut(row_bytes.max(1))) {
                // SAFETY: the row is inside the column (checked above), and the caller
                // holds its block (this method's contract, kept by its only callers).
                unsafe { columns.read_stored(col, &[reprise_core::RowRange { start: r as u64, len: 1 }], dst) };
            }
        };
        py.detach(|| {
            // Decompressing is CPU-bound: large reads of a compressed column are split
            // across the cores (copies of raw rows are not: one core nearly saturates
            // memory bandwidth for them, see `sample::PARALLEL_BYTES`).
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let threads = if columns.is_compressed(col) { (out.len() / (256 << 10)).clamp(1, cores) } else { 1 };
            if threads < 2 || rows.len() < 2 {
                return read(rows, out);
            }
            let per = rows.len().div_ceil(threads);
            std::thread::scope(|s| {
                let mut parts = rows.chunks(per).zip(out.chunks_mut(per * row_bytes));
                let first = parts.next();
                for (r, o) in parts {
                    s.spawn(move || read(r, o));
                }
                if let Some((r, o)) = first {
                    read(r, o);
                }
            });
        });
        Ok(())
    }

    /// Bytes of the columns this process reaches through huge pages now.
    #[getter]
    fn huge_page_bytes(&self) -> u64 {
        self.store.columns().huge_page_bytes()
    }

    fn table_names(&self) -> Vec<String> {
        self.store.table_names()
    }

    /// Refcount of one block (for tests and inspection).
    fn block_refcount(&self, py: Python<'_>, block: u32) -> PyResult<u32> {
        if block >= self.store.num_blocks() {
            return Err(invalid(py, format!("block {block} out of range (store has {})", self.store.num_blocks())));
        }
        Ok(self.store.block_refcount(block))
    }

    /// `(address, length)` of the mapped columns (for GPU registration).
    fn memory(&self) -> (usize, usize) {
        let (base, len) = self.store.columns().memory();
        (base as usize, len)
    }

    /// `[(field, byte offset, row bytes)]` in signature order.
    fn column_layout(&self) -> Vec<(String, usize, usize)> {
        layout(self.store.columns())
    }

    /// Removes the shared-memory file; mapped memory lives on while in use.
    fn unlink(&self) {
        self.store.unlink();
    }
}


/// `[(field, byte offset, row bytes)]` of a store's columns.
pub fn layout(columns: &reprise_core::Columns) -> Vec<(String, usize, usize)> {
    columns
        .signature()
        .fields()
        .iter()
        .enumerate()
        .map(|(c, f)| (f.name.clone(), columns.offset(c), columns.row_bytes(c)))
        .collect()
}

/// How files in `directory` are backed: ("hugetlbfs", page bytes, ""),
/// ("transparent", 2 MiB, huge= mode) or ("small", 4096, why not huge).
#[pyfunction]
pub fn page_backing(py: Python<'_>, directory: PathBuf) -> PyResult<(String, usize, String)> {
    use reprise_core::Backing;
    let b = reprise_core::backing(&directory).map_err(py_err(py))?;
    Ok(match b {
        Backing::HugeTlb { page } => ("hugetlbfs".into(), page, String::new()),
        Backing::Transparent { mode } => ("transparent".into(), 2 << 20, mode),
        Backing::Small { why } => ("small".into(), 4096, why),
    })
}

/// Store files in `directory` left by processes that are gone (this user's only):
/// `[(path, bytes)]`. The next store created there removes them.
#[pyfunction]
pub fn stale_stores(directory: PathBuf) -> Vec<(PathBuf, u64)> {
    reprise_core::stale_regions(&directory)
}

//! `Store` and `Writer` for Python.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyString;
use reprise_core::error::Error;
use reprise_core::signature::{DType, Field, Signature};
use reprise_core::{Store, Table, Wait, Writer};

use crate::arrays::{field_infos, views, FieldInfo};
use crate::errors::{invalid, new_error, py_err, to_py};
use crate::table::PyTable;
use crate::timeout::{self, Signals};

/// Copies at least this large run with the GIL released.
const BULK_BYTES: usize = 64 * 1024;

#[pyclass(name = "Store", module = "reprise._native", frozen)]
pub struct PyStore {
    pub store: Store,
    pub fields: Arc<Vec<FieldInfo>>,
}

#[pymethods]
impl PyStore {
    #[new]
    #[pyo3(signature = (fields, capacity, block_steps, directory=None))]
    fn new(py: Python<'_>, fields: Vec<(String, Vec<i64>, String)>, capacity: i64, block_steps: i64, directory: Option<PathBuf>) -> PyResult<Self> {
        let err = py_err(py);
        let mut sig = Vec::with_capacity(fields.len());
        for (name, shape, dtype) in fields {
            let dtype = DType::from_name(&dtype).map_err(|e| invalid(py, format!("field '{name}': {e}")))?;
            if let Some(d) = shape.iter().find(|&&d| d < 1) {
                return Err(invalid(py, format!("field '{name}' has shape {shape:?} with a dimension of {d}: every dimension must be >= 1")));
            }
            sig.push(Field::new(&name, dtype, shape.iter().map(|&d| d as usize).collect()).map_err(&err)?);
        }
        let sig = Signature::new(sig).map_err(&err)?;
        if capacity < 1 {
            return Err(invalid(py, format!("capacity must be >= 1 step, got {capacity}")));
        }
        if !(1..=u32::MAX as i64).contains(&block_steps) {
            return Err(invalid(py, format!("block_steps must be between 1 and 2^32-1, got {block_steps}")));
        }
        let fields = Arc::new(field_infos(py, &sig)?);
        let store = py
            .detach(|| Store::new(sig, capacity as u64, block_steps as u32, directory.as_deref()))
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

    #[getter]
    fn path(&self) -> PathBuf {
        self.store.path().to_path_buf()
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

    #[pyo3(signature = (max_sequence_length=None))]
    fn writer(&self, py: Python<'_>, max_sequence_length: Option<i64>) -> PyResult<PyWriter> {
        if let Some(m) = max_sequence_length {
            if m < 1 {
                return Err(invalid(py, format!("max_sequence_length must be >= 1 or None, got {m}")));
            }
        }
        let w = Writer::new(self.store.clone(), max_sequence_length.map(|m| m as u64)).map_err(py_err(py))?;
        Ok(PyWriter { inner: Mutex::new(Some(w)), fields: self.fields.clone() })
    }

    /// Removes the shared-memory file; mapped memory lives on while in use.
    fn unlink(&self) {
        self.store.unlink();
    }
}

/// Appends steps and creates items. One thread at a time.
#[pyclass(name = "Writer", module = "reprise._native", frozen)]
pub struct PyWriter {
    inner: Mutex<Option<Writer>>,
    fields: Arc<Vec<FieldInfo>>,
}

enum Target<'a> {
    Name(String),
    Table(&'a Table),
}

impl PyWriter {
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut Writer) -> PyResult<R>) -> PyResult<R> {
        let Some(mut guard) = self.inner.try_lock() else {
            return Err(new_error(py, "RepriseError", "this writer is in use by another thread; give each thread its own writer".into()));
        };
        match guard.as_mut() {
            Some(w) => f(w),
            None => Err(invalid(py, "this writer is closed".into())),
        }
    }

    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, lead: usize) -> PyResult<()> {
        let vs = views(py, data, &self.fields, lead, if lead == 0 { "append: " } else { "extend: " })?;
        let steps = if lead == 0 {
            1
        } else {
            let t = vs[0].leading(1)[0];
            for (v, f) in vs.iter().zip(self.fields.iter()).skip(1) {
                if v.leading(1)[0] != t {
                    return Err(invalid(py, format!("extend: field '{}' has {} steps but field '{}' has {t}", f.name, v.leading(1)[0], self.fields[0].name)));
                }
            }
            t
        };
        let slices: Vec<&[u8]> = vs.iter().map(|v| v.bytes()).collect();
        let bytes: usize = slices.iter().map(|s| s.len()).sum();
        self.with(py, |w| {
            let run = |w: &mut Writer| if lead == 0 { w.append(&slices) } else { w.extend(&slices, steps) };
            let r = if bytes >= BULK_BYTES { py.detach(|| run(w)) } else { run(w) };
            r.map_err(py_err(py))
        })
    }
}

#[pymethods]
impl PyWriter {
    /// Appends one step: `{field: value}` with each value of the field's shape.
    fn append(&self, py: Python<'_>, step: &Bound<'_, PyAny>) -> PyResult<()> {
        self.write(py, step, 0)
    }

    /// Appends T steps: `{field: array[T, ...]}`.
    fn extend(&self, py: Python<'_>, steps: &Bound<'_, PyAny>) -> PyResult<()> {
        self.write(py, steps, 1)
    }

    /// Creates an item over the last `num_steps` steps in `table` (a Table or a
    /// table name on this store); waits for its rate limiter up to `timeout`.
    #[pyo3(signature = (table, num_steps, priority, timeout=None))]
    fn create_item(&self, py: Python<'_>, table: &Bound<'_, PyAny>, num_steps: i64, priority: f64, timeout: Option<f64>) -> PyResult<u64> {
        let timeout = timeout::parse(py, timeout)?;
        if num_steps < 1 {
            return Err(invalid(py, format!("num_steps must be >= 1, got {num_steps}")));
        }
        let holder;
        let target = if let Ok(name) = table.cast::<PyString>() {
            Target::Name(name.to_string())
        } else {
            holder = match table.cast::<PyTable>() {
                Ok(t) => t.clone(),
                Err(_) => table
                    .getattr("_native")
                    .ok()
                    .and_then(|n| n.cast_into::<PyTable>().ok())
                    .ok_or_else(|| invalid(py, format!("table must be a Table or a table name, got {}", crate::arrays::type_name(table))))?,
            };
            Target::Table(&holder.get().table)
        };
        let n = num_steps as u64;
        let signals = Signals::default();
        let check = || signals.check();
        self.with(py, |w| {
            let call = |w: &mut Writer, wait: Wait<'_>| match &target {
                Target::Name(name) => w.create_item_in(name, n, priority, wait),
                Target::Table(table) => w.create_item(table, n, priority, wait),
            };
            // Try without waiting while holding the GIL; wait only with it released.
            let r = match call(w, Some(Duration::ZERO).into()) {
                Err(Error::Timeout { .. }) if timeout != Some(Duration::ZERO) => {
                    py.detach(|| call(w, Wait { timeout, interrupt: Some(&check) }))
                }
                other => other,
            };
            r.map_err(|e| to_py(py, e, None, signals.take()))
        })
    }

    /// Ends the episode: items never span episodes.
    fn end_episode(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |w| {
            w.end_episode();
            Ok(())
        })
    }

    /// Returns when every created item is in its table. In-process writers insert
    /// at `create_item`, so this only checks the writer is usable.
    #[pyo3(signature = (timeout=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        timeout::parse(py, timeout)?;
        self.with(py, |_| Ok(()))
    }

    #[getter]
    fn episode_steps(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |w| Ok(w.episode_steps()))
    }

    /// Ends the episode and releases the writer's blocks. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(mut guard) = self.inner.try_lock() else {
            return Err(new_error(py, "RepriseError", "this writer is in use by another thread".into()));
        };
        guard.take();
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

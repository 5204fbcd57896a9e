//! `reprise.checkpoint` over `reprise_core::checkpoint`: save, load, verify and
//! the checkpoint list, with the GIL released for the file work. Python passes
//! its progress bar and, for GPU stores, how to read and write their rows; it
//! makes the stores a load fills (its `Store` objects).

use std::path::PathBuf;
use std::sync::Arc;

use numpy::{PyArray1, PyArrayMethods};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use reprise_core::checkpoint::{self, Compression, LoadOptions, MakeStore, NewStore, OffHost, ReadRows, SaveOptions, StoreSpec, WriteRows};
use reprise_core::error::{Error, Result};
use reprise_core::signature::{DType, Field, Signature};
use reprise_core::Table;

use crate::arrays::FieldInfo;
use crate::errors::invalid;
use crate::raise::py_err;
use crate::store::PyStore;
use crate::table::PyTable;

/// The first Python exception a callback raised; the core sees a placeholder
/// error that stops the save or load, and the exception is raised in its place.
#[derive(Clone, Default)]
struct Failure(Arc<Mutex<Option<PyErr>>>);

impl Failure {
    fn keep(&self, e: PyErr) -> Error {
        self.0.lock().get_or_insert(e);
        Error::Io("a Python callback of the checkpoint failed".into())
    }

    /// The callback's exception if there was one, else `e` converted.
    fn error(&self, py: Python<'_>, e: Error) -> PyErr {
        self.0.lock().take().unwrap_or_else(|| py_err(py)(e))
    }
}

/// `progress(done, total)` for the core: calls the Python callable.
fn progress_callback<'a>(f: &'a Option<Py<PyAny>>, failure: &'a Failure) -> impl FnMut(u64, u64) -> Result<()> + use<'a> {
    move |done, total| match f {
        Some(f) => Python::attach(|py| f.call1(py, (done, total)).map(drop)).map_err(|e| failure.keep(e)),
        None => Ok(()),
    }
}

/// A GPU store's rows read by the Python callable `read(col, row, rows)`, which
/// returns them as a contiguous uint8 array.
struct PyReadRows {
    read: Py<PyAny>,
    row_bytes: Vec<usize>,
    failure: Failure,
}

impl ReadRows for PyReadRows {
    fn read_rows(&mut self, col: usize, row: u64, dst: &mut [u8]) -> Result<()> {
        let rows = dst.len() / self.row_bytes[col].max(1);
        Python::attach(|py| -> PyResult<()> {
            let data = self.read.call1(py, (col, row, rows))?;
            let array = data.bind(py).cast::<PyArray1<u8>>().map_err(PyErr::from)?.readonly();
            let bytes = array.as_slice().map_err(|e| invalid(py, format!("device rows: {e}")))?;
            if bytes.len() != dst.len() {
                return Err(invalid(py, format!("device rows: {} bytes for {rows} rows, expected {}", bytes.len(), dst.len())));
            }
            dst.copy_from_slice(bytes);
            Ok(())
        })
        .map_err(|e| self.failure.keep(e))
    }
}

/// A GPU store's rows written by the Python callable `write(col, row, data)`.
struct PyWriteRows {
    write: Py<PyAny>,
    failure: Failure,
}

impl WriteRows for PyWriteRows {
    fn write_rows(&mut self, col: usize, row: u64, bytes: &[u8]) -> Result<()> {
        Python::attach(|py| self.write.call1(py, (col, row, PyArray1::from_slice(py, bytes))).map(drop))
            .map_err(|e| self.failure.keep(e))
    }
}

/// Stores made by the Python callable `make_store(index, signature, capacity,
/// block_steps, device) -> (Store, write or None)`, kept with their fields.
struct PyMakeStore {
    make: Py<PyAny>,
    made: Vec<(Py<PyAny>, Arc<Vec<FieldInfo>>)>,
    failure: Failure,
}

impl MakeStore for PyMakeStore {
    fn make_store(&mut self, spec: &StoreSpec) -> Result<NewStore> {
        #[allow(clippy::type_complexity)]
        let signature: Vec<(String, Vec<usize>, &str, Option<i32>, u32, &str)> = spec
            .signature
            .fields()
            .iter()
            .map(|f| (f.name.clone(), f.shape.clone(), f.dtype.name(), f.compress, f.stack, f.padding.name()))
            .collect();
        let made = Python::attach(|py| -> PyResult<_> {
            let file = spec.file.as_ref().map(|p| p.to_string_lossy().into_owned());
            let out = self.make.call1(py, (spec.index, signature, spec.capacity, spec.block_steps, spec.device.as_str(), file))?;
            let (store, write): (Py<PyAny>, Option<Py<PyAny>>) = out.extract(py)?;
            let native = store.bind(py).getattr("_native")?;
            let native = native.cast::<PyStore>().map_err(PyErr::from)?.get();
            Ok((store, native.store.clone(), native.fields.clone(), write))
        });
        let (py_store, store, fields, write) = made.map_err(|e| self.failure.keep(e))?;
        self.made.push((py_store, fields));
        let rows = write.map(|write| Box::new(PyWriteRows { write, failure: self.failure.clone() }) as Box<dyn WriteRows>);
        Ok(NewStore { store, rows })
    }
}

fn signature(py: Python<'_>, fields: Vec<(String, Vec<usize>, String)>) -> PyResult<Signature> {
    let fields = fields
        .into_iter()
        .map(|(name, shape, dtype)| Field::new(&name, DType::from_name(&dtype)?, shape))
        .collect::<Result<Vec<_>>>()
        .map_err(py_err(py))?;
    Signature::new(fields).map_err(py_err(py))
}

/// Writes a checkpoint of `tables` under `path`; returns its directory.
/// `off_host`: `(table position, device, signature, read)` for tables over GPU
/// stores; `progress(done, total)` in bytes of step data.
#[pyfunction]
#[pyo3(signature = (path, tables, compression=None, off_host=Vec::new(), progress=None, in_place=false))]
#[allow(clippy::type_complexity)]
pub fn save(
    py: Python<'_>,
    path: PathBuf,
    tables: Vec<PyRef<'_, PyTable>>,
    compression: Option<String>,
    off_host: Vec<(usize, String, Vec<(String, Vec<usize>, String)>, Py<PyAny>)>,
    progress: Option<Py<PyAny>>,
    in_place: bool,
) -> PyResult<String> {
    let compression = Compression::from_name(compression.as_deref()).map_err(py_err(py))?;
    let tables: Vec<Table> = tables.iter().map(|t| t.table.clone()).collect();
    let mut readers = Vec::with_capacity(off_host.len());
    let failure = Failure::default();
    for (k, device, fields, read) in off_host {
        let Some(t) = tables.get(k) else {
            return Err(invalid(py, format!("off_host names table {k} of {}", tables.len())));
        };
        let signature = signature(py, fields)?;
        let row_bytes = signature.fields().iter().map(|f| f.row_bytes()).collect();
        readers.push((t.store().clone(), device, signature, PyReadRows { read, row_bytes, failure: failure.clone() }));
    }
    let saved = py.detach(|| {
        let off_host = readers
            .iter_mut()
            .map(|(store, device, signature, rows)| OffHost { store: store.clone(), device: device.clone(), signature: signature.clone(), rows })
            .collect();
        let mut progress = progress_callback(&progress, &failure);
        checkpoint::save(&path, &tables, SaveOptions { compression, off_host, progress: Some(&mut progress), in_place })
    });
    match saved {
        Ok(p) => Ok(p.to_string_lossy().into_owned()),
        Err(e) => Err(failure.error(py, e)),
    }
}

/// Loads the checkpoint at `path` (or the newest valid one under it) into stores
/// `make_store` makes. Returns `(checkpoint path, [Store, in manifest order],
/// [(table, store index, {"sampler", "remover", "rate_limiter"})])`.
#[pyfunction]
#[pyo3(signature = (path, make_store, progress=None))]
#[allow(clippy::type_complexity)]
pub fn load<'py>(
    py: Python<'py>,
    path: PathBuf,
    make_store: Py<PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<(String, Vec<Py<PyAny>>, Vec<(PyTable, usize, Bound<'py, PyDict>)>)> {
    let failure = Failure::default();
    let mut maker = PyMakeStore { make: make_store, made: Vec::new(), failure: failure.clone() };
    let loaded = py.detach(|| {
        let mut progress = progress_callback(&progress, &failure);
        let loaded = checkpoint::load(&path, LoadOptions { stores: Some(&mut maker), progress: Some(&mut progress) })?;
        Ok(loaded)
    });
    let loaded = loaded.map_err(|e| failure.error(py, e))?;
    // The stores of the checkpoint that loaded: the last ones made (a directory's
    // newer, damaged checkpoints may have made and removed some before).
    let made = maker.made.split_off(maker.made.len() - loaded.stores.len());
    let mut tables = Vec::with_capacity(loaded.tables.len());
    for (table, &s) in loaded.tables.into_iter().zip(&loaded.table_store) {
        let c = table.config();
        let config = PyDict::new(py);
        config.set_item("sampler", c.sampler.to_name())?;
        config.set_item("remover", c.remover.to_name())?;
        let r = &c.rate_limiter;
        config.set_item("rate_limiter", (r.samples_per_insert, r.min_size_to_sample, r.min_diff, r.max_diff))?;
        tables.push((PyTable::from_table(table, made[s].1.clone()), s, config));
    }
    let stores = made.into_iter().map(|(s, _)| s).collect();
    Ok((loaded.path.to_string_lossy().into_owned(), stores, tables))
}

/// Checks every file of the checkpoint at `path`; returns its manifest as JSON text.
#[pyfunction]
pub fn verify(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let manifest = py.detach(|| checkpoint::verify(&path)).map_err(py_err(py))?;
    Ok(manifest.to_text())
}

/// The newest checkpoint under `path` that verifies.
#[pyfunction]
pub fn latest(py: Python<'_>, path: PathBuf) -> Option<String> {
    py.detach(|| checkpoint::latest(&path)).map(|p| p.to_string_lossy().into_owned())
}

/// The checkpoints under `path`, newest first, valid or not.
#[pyfunction]
pub fn checkpoints(py: Python<'_>, path: PathBuf) -> Vec<String> {
    py.detach(|| checkpoint::checkpoints(&path)).into_iter().map(|p| p.to_string_lossy().into_owned()).collect()
}

/// Registers `reprise._native.checkpoint`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let sub = PyModule::new(m.py(), "checkpoint")?;
    sub.add_function(wrap_pyfunction!(save, &sub)?)?;
    sub.add_function(wrap_pyfunction!(load, &sub)?)?;
    sub.add_function(wrap_pyfunction!(verify, &sub)?)?;
    sub.add_function(wrap_pyfunction!(latest, &sub)?)?;
    sub.add_function(wrap_pyfunction!(checkpoints, &sub)?)?;
    sub.add("FORMAT", checkpoint::FORMAT)?;
    sub.add("VERSION", checkpoint::VERSION)?;
    m.add_submodule(&sub)
}

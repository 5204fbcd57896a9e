//! `Writer` for Python: the same class for in-process writers (items go into their
//! table at `create_item`, waiting for its rate limiter) and for clients' writers,
//! local or remote (`reprise_client::StepWriter`: items are queued and committed in
//! batches; see `flush`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString};
use reprise_core::attributes::Attributes;
use reprise_core::DType;
use reprise_client::StepWriter;
use reprise_core::error::Error;
use reprise_core::{Table, Wait, Writer};

use crate::arrays::{views, FieldInfo};
use crate::errors::{invalid, new_error};
use crate::raise::{py_err, to_py};
use crate::store::PyStore;
use crate::table::PyTable;
use crate::timeout::{self, Alone, Signals};

/// Copies at least this large run with the GIL released.
const BULK_BYTES: usize = 64 * 1024;

pub enum AnyWriter {
    InProcess(Writer),
    /// A client's writer. `release_gil`: its item calls may wait (a remote writer's
    /// send queue), so they run without the GIL; a local writer's only queue a record
    /// (a full batch is one socket write), cheaper than releasing the GIL per step.
    Client { writer: Box<dyn StepWriter>, release_gil: bool, schemas: Arc<HashMap<String, Arc<Attributes>>> },
}

/// Runs `f` without the GIL when `release`, else with it.
fn maybe_detach<T: Send>(py: Python<'_>, release: bool, f: impl FnOnce() -> T + Send) -> T {
    if release {
        py.detach(f)
    } else {
        f()
    }
}

impl AnyWriter {
    fn write(&mut self, columns: &[&[u8]], steps: Option<usize>, wait: Wait<'_>) -> reprise_core::Result<()> {
        match (self, steps) {
            (AnyWriter::InProcess(w), None) => w.append(columns, wait),
            (AnyWriter::InProcess(w), Some(t)) => w.extend(columns, t, wait),
            (AnyWriter::Client { writer, .. }, None) => writer.append(columns, wait),
            (AnyWriter::Client { writer, .. }, Some(t)) => writer.extend(columns, t, wait),
        }
    }
}

/// Appends steps and creates items. One thread at a time.
#[pyclass(name = "Writer", module = "reprise._native", frozen)]
pub struct PyWriter {
    inner: Mutex<Option<AnyWriter>>,
    fields: Arc<Vec<FieldInfo>>,
}

/// Which table an item goes to: a table object, or a name looked up on the store.
enum Target {
    Name(String),
    Table(Table),
}

impl Target {
    fn name(&self) -> &str {
        match self {
            Target::Name(name) => name,
            Target::Table(t) => t.name(),
        }
    }

    /// The table itself, a name looked up on the writer's store.
    fn resolve(self, py: Python<'_>, w: &Writer) -> PyResult<Table> {
        match self {
            Target::Table(t) => Ok(t),
            Target::Name(name) => w.table(&name).map_err(py_err(py)),
        }
    }
}

/// The target of `create_item(s)` (a `Table` or a table name) and `num_steps`, checked.
fn target(py: Python<'_>, table: &Bound<'_, PyAny>, num_steps: i64) -> PyResult<(Target, u64)> {
    if num_steps < 1 {
        return Err(invalid(py, format!("num_steps must be >= 1, got {num_steps}")));
    }
    if let Ok(name) = table.cast::<PyString>() {
        return Ok((Target::Name(name.to_string()), num_steps as u64));
    }
    let native = match table.cast::<PyTable>() {
        Ok(t) => t.clone(),
        Err(_) => table
            .getattr("_native")
            .ok()
            .and_then(|n| n.cast_into::<PyTable>().ok())
            .ok_or_else(|| invalid(py, format!("table must be a Table or a table name, got {}", crate::arrays::type_name(table))))?,
    };
    Ok((Target::Table(native.get().table.clone()), num_steps as u64))
}

/// The attribute records of `n` new items of the served table `table`, from the
/// schemas the client's server gave (a table it does not serve is left to the
/// server to refuse, naming it).
fn client_records(py: Python<'_>, schemas: &HashMap<String, Arc<Attributes>>, table: &str, attributes: Option<&Bound<'_, PyAny>>, n: usize) -> PyResult<Vec<u8>> {
    match schemas.get(table) {
        Some(schema) => records_for(py, schema, table, attributes, n),
        None => Ok(Vec::new()),
    }
}

/// The attribute records of `n` new items of `table` from `{name: value}`
/// (checked by `reprise._attributes.records`); empty for a table without
/// attributes given none.
pub fn records(py: Python<'_>, table: &Table, attributes: Option<&Bound<'_, PyAny>>, n: usize) -> PyResult<Vec<u8>> {
    records_for(py, &table.config().attributes, table.name(), attributes, n)
}

/// [`records`] for a table named `table` with attributes `schema`.
fn records_for(py: Python<'_>, schema: &Attributes, table: &str, attributes: Option<&Bound<'_, PyAny>>, n: usize) -> PyResult<Vec<u8>> {
    if schema.is_empty() && attributes.is_none() {
        return Ok(Vec::new());
    }
    if let Some(record) = attributes.and_then(|a| scalar_record(schema, a, n)) {
        return Ok(record);
    }
    let specs: Vec<(String, &str)> = schema.specs().iter().map(|a| (a.name.clone(), a.dtype.name())).collect();
    let bytes = py.import("reprise._attributes")?.getattr("records")?.call1((specs, table, attributes, n))?;
    Ok(bytes.cast_into::<PyBytes>()?.as_bytes().to_vec())
}

/// The record of one item from `{name: Python int, float or bool}` naming
/// exactly the table's attributes, each of a kind its dtype takes exactly (the
/// common `create_item` call, without numpy); None for anything else, which the
/// checked Python path then handles (and names what is wrong with).
fn scalar_record(schema: &Attributes, attributes: &Bound<'_, PyAny>, n: usize) -> Option<Vec<u8>> {
    let dict = attributes.cast::<PyDict>().ok()?;
    if n != 1 || dict.len() != schema.len() {
        return None;
    }
    let mut out = Vec::with_capacity(schema.record());
    for spec in schema.specs() {
        let v = dict.get_item(&spec.name).ok()??;
        let is_bool = v.is_instance_of::<PyBool>();
        let is_int = v.is_instance_of::<PyInt>() && !is_bool;
        match spec.dtype {
            DType::Int8 | DType::Int16 | DType::Int32 | DType::Int64 if is_int => {
                let x: i64 = v.extract().ok()?;
                let bytes = x.to_le_bytes();
                let size = spec.dtype.itemsize();
                let fits = match size {
                    1 => i8::try_from(x).is_ok(),
                    2 => i16::try_from(x).is_ok(),
                    4 => i32::try_from(x).is_ok(),
                    _ => true,
                };
                if !fits {
                    return None;
                }
                out.extend_from_slice(&bytes[..size]);
            }
            DType::UInt8 | DType::UInt16 | DType::UInt32 | DType::UInt64 if is_int => {
                let x: u64 = v.extract().ok()?;
                let size = spec.dtype.itemsize();
                if size < 8 && x >> (8 * size) != 0 {
                    return None;
                }
                out.extend_from_slice(&x.to_le_bytes()[..size]);
            }
            DType::Float32 | DType::Float64 if is_int || v.is_instance_of::<PyFloat>() => {
                let x: f64 = v.extract().ok()?;
                if spec.dtype == DType::Float32 {
                    out.extend_from_slice(&(x as f32).to_le_bytes());
                } else {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            DType::Bool if is_bool => out.push(v.extract::<bool>().ok()? as u8),
            _ => return None,
        }
    }
    Some(out)
}

impl PyWriter {
    pub fn new(writer: AnyWriter, fields: Arc<Vec<FieldInfo>>) -> PyWriter {
        PyWriter { inner: Mutex::new(Some(writer)), fields }
    }

    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut AnyWriter) -> PyResult<R>) -> PyResult<R> {
        let Some(mut guard) = self.inner.try_lock() else {
            return Err(new_error(py, "RepriseError", "this writer is in use by another thread; give each thread its own writer".into()));
        };
        match guard.as_mut() {
            Some(w) => f(w),
            None => Err(invalid(py, "this writer is closed".into())),
        }
    }

    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, lead: usize, timeout: Option<f64>) -> PyResult<()> {
        let timeout = timeout::parse(py, timeout)?;
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
        let steps = (lead > 0).then_some(steps);
        let signals = Signals::default();
        let check = || signals.check();
        let wait = Wait { timeout, interrupt: Some(&check) };
        self.with(py, |w| {
            // Large copies, appends that may wait for the server (a new block, room to
            // send), and appends into a store whose samples pin epochs (a lease may wait
            // for the thread that unpins, which needs the GIL) run without the GIL.
            let waits = match w {
                AnyWriter::Client { writer, .. } => writer.may_wait(steps.unwrap_or(1)),
                AnyWriter::InProcess(writer) => writer.store().pinned_ever(),
            };
            let r = if bytes >= BULK_BYTES || waits { py.detach(|| w.write(&slices, steps, wait)) } else { w.write(&slices, steps, wait) };
            r.map_err(|e| to_py(py, e, None, signals.take()))
        })
    }
}

#[pymethods]
impl PyWriter {
    /// An in-process writer into `store`.
    #[staticmethod]
    #[pyo3(signature = (store, max_sequence_length=None))]
    fn in_process(py: Python<'_>, store: &PyStore, max_sequence_length: Option<i64>) -> PyResult<PyWriter> {
        if let Some(m) = max_sequence_length.filter(|&m| m < 1) {
            return Err(invalid(py, format!("max_sequence_length must be >= 1 or None, got {m}")));
        }
        let w = Writer::new(store.store.clone(), max_sequence_length.map(|m| m as u64)).map_err(py_err(py))?;
        Ok(PyWriter::new(AnyWriter::InProcess(w), store.fields.clone()))
    }

    /// Appends one step: `{field: value}` with each value of the field's shape. A
    /// step that needs a new block may wait for the server up to `timeout`.
    #[pyo3(signature = (step, timeout=None))]
    fn append(&self, py: Python<'_>, step: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        self.write(py, step, 0, timeout)
    }

    /// Appends T steps: `{field: array[T, ...]}`, waiting up to `timeout` as `append` does.
    #[pyo3(signature = (steps, timeout=None))]
    fn extend(&self, py: Python<'_>, steps: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        self.write(py, steps, 1, timeout)
    }

    /// Creates an item over the last `num_steps` steps in `table` (a Table or a
    /// table name). In process it waits for the table's rate limiter up to
    /// `timeout` and returns the item's key; a client's writer queues the item,
    /// sends it with the next batch and returns None (`flush` waits for it); it
    /// waits up to `timeout` only when too many batches are in flight.
    #[pyo3(signature = (table, num_steps, priority, timeout=None, attributes=None))]
    fn create_item(&self, py: Python<'_>, table: &Bound<'_, PyAny>, num_steps: i64, priority: f64, timeout: Option<f64>, attributes: Option<Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
        let timeout = timeout::parse(py, timeout)?;
        let (target, n) = target(py, table, num_steps)?;
        let signals = Signals::default();
        let check = || signals.check();
        self.with(py, |w| match w {
            // May wait for room in the send queue: without the GIL.
            AnyWriter::Client { writer, release_gil, schemas } => {
                let records = client_records(py, schemas, target.name(), attributes.as_ref(), 1)?;
                let release = *release_gil || writer.items_may_wait(1);
                let wait = Wait { timeout, interrupt: Some(&check) };
                maybe_detach(py, release, || writer.create_item(target.name(), n, priority, &records, wait))
                    .map(|_| None)
                    .map_err(|e| to_py(py, e, None, signals.take()))
            }
            AnyWriter::InProcess(w) => {
                let table = target.resolve(py, w)?;
                let records = records(py, &table, attributes.as_ref(), 1)?;
                let record = records.as_slice();
                // Try without waiting while holding the GIL; wait only with it released.
                let r = match w.create_item(&table, n, priority, record, Some(Duration::ZERO)) {
                    Err(Error::Timeout { .. }) if timeout != Some(Duration::ZERO) => {
                        let alone = Alone::cloned(&table, timeout);
                        let check = || check() || alone.check();
                        py.detach(|| w.create_item(&table, n, priority, record, Wait { timeout, interrupt: Some(&check) }))
                            .map_err(|e| alone.explain(e, 1))
                    }
                    other => other,
                };
                r.map(Some).map_err(|e| to_py(py, e, None, signals.take()))
            }
        })
    }

    /// Creates one item per priority in `table`: item j of n covers `num_steps`
    /// steps ending n-1-j steps before the newest — one item per step of an
    /// `extend` of n steps. Returns the keys in process (None for a client writer).
    #[pyo3(signature = (table, num_steps, priorities, timeout=None, attributes=None))]
    fn create_items<'py>(&self, py: Python<'py>, table: &Bound<'py, PyAny>, num_steps: i64, priorities: &Bound<'py, PyAny>, timeout: Option<f64>, attributes: Option<Bound<'py, PyAny>>) -> PyResult<Option<Bound<'py, numpy::PyArray1<u64>>>> {
        let timeout = timeout::parse(py, timeout)?;
        let (target, n) = target(py, table, num_steps)?;
        let priorities = crate::arrays::Vector::<f64>::new(py, "priorities", priorities, None)?;
        let p = priorities.as_slice();
        let signals = Signals::default();
        let check = || signals.check();
        self.with(py, |w| match w {
            AnyWriter::Client { writer, release_gil, schemas } => {
                let records = client_records(py, schemas, target.name(), attributes.as_ref(), p.len())?;
                let release = *release_gil || writer.items_may_wait(p.len());
                let wait = Wait { timeout, interrupt: Some(&check) };
                maybe_detach(py, release, || writer.create_items(target.name(), n, p, &records, wait))
                    .map(|_| None)
                    .map_err(|e| to_py(py, e, None, signals.take()))
            }
            AnyWriter::InProcess(w) => {
                let table = target.resolve(py, w)?;
                let records = records(py, &table, attributes.as_ref(), p.len())?;
                let records = records.as_slice();
                let alone = Alone::cloned(&table, timeout);
                let check = || check() || alone.check();
                let keys = py
                    .detach(|| w.create_items(&table, n, p, records, Wait { timeout, interrupt: Some(&check) }))
                    .map_err(|e| to_py(py, alone.explain(e, p.len() as u64), None, signals.take()))?;
                Ok(Some(numpy::PyArray1::from_vec(py, keys)))
            }
        })
    }

    /// Row numbers of the last `num_steps` steps appended, oldest first (for stores
    /// whose step data lives on a device: the caller writes those rows).
    fn recent_rows<'py>(&self, py: Python<'py>, num_steps: i64) -> PyResult<Bound<'py, numpy::PyArray1<i64>>> {
        let k = u64::try_from(num_steps).map_err(|_| invalid(py, format!("num_steps must be >= 1, got {num_steps}")))?;
        let window = self.with(py, |w| match w {
            AnyWriter::InProcess(w) => w.recent_rows(k).map_err(py_err(py)),
            AnyWriter::Client { .. } => Err(invalid(py, "recent_rows is for in-process writers".into())),
        })?;
        let rows = window.ranges().iter().flat_map(|r| (r.start..r.start + r.len as u64).map(|x| x as i64));
        Ok(numpy::PyArray1::from_iter(py, rows))
    }

    /// Creates n items of `num_steps` steps that tile the last n * num_steps steps
    /// (n episodes written back to back), one per priority. Returns their keys.
    #[pyo3(signature = (table, num_steps, priorities, timeout=None, attributes=None))]
    fn create_tiled_items<'py>(&self, py: Python<'py>, table: &Bound<'py, PyAny>, num_steps: i64, priorities: &Bound<'py, PyAny>, timeout: Option<f64>, attributes: Option<Bound<'py, PyAny>>) -> PyResult<Bound<'py, numpy::PyArray1<u64>>> {
        let timeout = timeout::parse(py, timeout)?;
        let (target, n) = target(py, table, num_steps)?;
        let priorities = crate::arrays::Vector::<f64>::new(py, "priorities", priorities, None)?;
        let p = priorities.as_slice();
        let signals = Signals::default();
        let check = || signals.check();
        self.with(py, |w| match w {
            AnyWriter::Client { .. } => Err(invalid(py, "create_tiled_items is for in-process writers".into())),
            AnyWriter::InProcess(w) => {
                let table = target.resolve(py, w)?;
                let records = records(py, &table, attributes.as_ref(), p.len())?;
                let records = records.as_slice();
                let alone = Alone::cloned(&table, timeout);
                let check = || check() || alone.check();
                let keys = py
                    .detach(|| w.create_tiled_items(&table, n, p, records, Wait { timeout, interrupt: Some(&check) }))
                    .map_err(|e| to_py(py, alone.explain(e, p.len() as u64), None, signals.take()))?;
                Ok(numpy::PyArray1::from_vec(py, keys))
            }
        })
    }

    /// Ends the episode: items never span episodes. A client's writer may wait up
    /// to `timeout` for room to send.
    #[pyo3(signature = (timeout=None))]
    fn end_episode(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let timeout = timeout::parse(py, timeout)?;
        let signals = Signals::default();
        let check = || signals.check();
        self.with(py, |w| match w {
            AnyWriter::InProcess(w) => {
                w.end_episode();
                Ok(())
            }
            AnyWriter::Client { writer, release_gil, .. } => {
                let release = *release_gil || writer.items_may_wait(0);
                let wait = Wait { timeout, interrupt: Some(&check) };
                maybe_detach(py, release, || writer.end_episode(wait)).map_err(|e| to_py(py, e, None, signals.take()))
            }
        })
    }

    /// Returns when every created item is in its table (in-process writers insert
    /// at `create_item`; a client's writer sends its queued items and waits).
    #[pyo3(signature = (timeout=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let timeout = timeout::parse(py, timeout)?;
        self.with(py, |w| match w {
            // A durable store commits (its items on disk); any other has nothing to wait for.
            AnyWriter::InProcess(w) => match w.store().durable() {
                Some(_) => {
                    let store = w.store().clone();
                    py.detach(|| store.commit()).map_err(py_err(py))
                }
                None => Ok(()),
            },
            AnyWriter::Client { writer: w, .. } => {
                let signals = Signals::default();
                let check = || signals.check();
                py.detach(|| w.flush(Wait { timeout, interrupt: Some(&check) })).map(|_| ()).map_err(|e| to_py(py, e, None, signals.take()))
            }
        })
    }

    #[getter]
    fn episode_steps(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |w| {
            Ok(match w {
                AnyWriter::InProcess(w) => w.episode_steps(),
                AnyWriter::Client { writer, .. } => writer.episode_steps(),
            })
        })
    }

    /// Commits what a client's writer has queued (waiting up to `timeout`), ends
    /// the episode and releases the writer's blocks. Idempotent. A close whose wait
    /// times out or is interrupted (Ctrl-C) aborts instead: the writer is closed
    /// either way, and what the server had not committed is dropped.
    #[pyo3(signature = (timeout=None))]
    fn close(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let timeout = timeout::parse(py, timeout)?;
        let Some(mut guard) = self.inner.try_lock() else {
            return Err(new_error(py, "RepriseError", "this writer is in use by another thread".into()));
        };
        match guard.take() {
            Some(AnyWriter::Client { writer: mut w, .. }) => {
                let signals = Signals::default();
                let check = || signals.check();
                py.detach(|| w.close(Wait { timeout, interrupt: Some(&check) })).map_err(|e| to_py(py, e, None, signals.take()))
            }
            _ => Ok(()),
        }
    }

    /// Closes at once, waiting for nothing: a client's items that the server has
    /// not committed are dropped (committed ones stay); the writer's blocks return
    /// to the store. Idempotent.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let Some(mut guard) = self.inner.try_lock() else {
            return Err(new_error(py, "RepriseError", "this writer is in use by another thread".into()));
        };
        if let Some(AnyWriter::Client { writer: mut w, .. }) = guard.take() {
            w.abort();
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block closes the writer; leaving it on an exception aborts
    /// it (waits for nothing) and lets the exception through.
    #[pyo3(signature = (exc_type, _exc_value, _traceback))]
    fn __exit__(&self, py: Python<'_>, exc_type: &Bound<'_, PyAny>, _exc_value: &Bound<'_, PyAny>, _traceback: &Bound<'_, PyAny>) -> PyResult<bool> {
        if exc_type.is_none() {
            self.close(py, None)?;
        } else {
            self.abort(py)?;
        }
        Ok(false)
    }
}

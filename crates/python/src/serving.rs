//! `Server` and `Client` for Python: same-host serving over a Unix socket.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use reprise_client::{ClientSample, LocalClient};

use crate::rows::{Drawn, PySampleRows};
use reprise_server::checkpoint::Checkpointer;
use reprise_server::LocalServer;

use crate::arrays::{field_infos, Vector};
use crate::errors::{invalid, py_err, to_py};
use crate::sample::sample_object;
use crate::table::{info_dict, select_fields, PyTable};
use crate::timeout::{self, Signals};
use crate::writer::{AnyWriter, PyWriter};

/// A client's CHECKPOINT runs the owner's Python checkpoint code `f` on the
/// connection's thread (which holds no table lock while it waits for the GIL).
pub fn checkpointer(f: Py<PyAny>) -> Checkpointer {
    let f = Arc::new(f);
    Arc::new(move || {
        Python::attach(|py| {
            f.call0(py).and_then(|p| p.extract::<String>(py)).map_err(|e| {
                let kind = e.get_type(py).name().map(|n| n.to_string()).unwrap_or_default();
                let message = format!("checkpoint failed: {kind}: {}", e.value(py));
                if kind == "InvalidArgument" {
                    reprise_core::Error::InvalidArgument(message)
                } else {
                    reprise_core::Error::Io(message)
                }
            })
        })
    })
}

#[pyclass(name = "Server", module = "reprise._native", frozen)]
pub struct PyServer {
    server: Mutex<Option<LocalServer>>,
    address: String,
    name: String,
}

#[pymethods]
impl PyServer {
    #[new]
    #[pyo3(signature = (tables, name=None, checkpoint=None))]
    fn new(py: Python<'_>, tables: Vec<PyRef<'_, PyTable>>, name: Option<String>, checkpoint: Option<Py<PyAny>>) -> PyResult<Self> {
        let tables = tables.iter().map(|t| t.table.clone()).collect();
        let checkpoint: Option<Checkpointer> = checkpoint.map(checkpointer);
        let server = py.detach(|| LocalServer::start_with(tables, name.as_deref(), checkpoint)).map_err(py_err(py))?;
        Ok(PyServer { address: server.address(), name: server.name().to_string(), server: Mutex::new(Some(server)) })
    }

    #[getter]
    fn local_address(&self) -> String {
        self.address.clone()
    }

    #[getter]
    fn name(&self) -> String {
        self.name.clone()
    }

    /// Closes every connection (releasing what clients held) and removes the socket.
    fn stop(&self, py: Python<'_>) {
        let server = self.server.lock().take();
        if let Some(mut s) = server {
            py.detach(|| s.stop());
        }
    }
}

#[pyclass(name = "Client", module = "reprise._native", frozen)]
pub struct PyClient {
    client: LocalClient,
}

fn socket_path(py: Python<'_>, address: &str) -> PyResult<PathBuf> {
    match address.strip_prefix("unix://") {
        Some(path) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ => Err(invalid(py, format!(
            "address {address:?}: expected a local server address 'unix:///path/to/socket' (server.local_address)"
        ))),
    }
}

impl PyClient {
    /// A draw's sample size and timeout, checked.
    fn draw_args(py: Python<'_>, n: i64, timeout: Option<f64>) -> PyResult<(u32, Option<std::time::Duration>)> {
        let timeout = timeout::parse(py, timeout)?;
        if n < 1 || n > u32::MAX as i64 {
            return Err(invalid(py, format!("sample size must be >= 1, got {n}")));
        }
        Ok((n as u32, timeout))
    }

    /// A client's draw: the items the server drew, and the error that stopped it
    /// early (a timeout or interrupt after some draws), if any.
    fn draw(&self, py: Python<'_>, table: &str, (n, timeout): (u32, Option<std::time::Duration>)) -> PyResult<(ClientSample, Option<PyErr>)> {
        let signals = Signals::default();
        let check = || signals.check();
        let (sample, error) = py
            .detach(|| self.client.sample(table, n, timeout, Some(&check)))
            .map_err(|e| to_py(py, e, None, signals.take()))?;
        Ok((sample, error.map(|e| to_py(py, e, None, None))))
    }
}

#[pymethods]
impl PyClient {
    #[new]
    fn new(py: Python<'_>, address: &str) -> PyResult<Self> {
        let path = socket_path(py, address)?;
        let client = py.detach(|| LocalClient::connect(&path)).map_err(py_err(py))?;
        Ok(PyClient { client })
    }

    fn table_names(&self) -> Vec<String> {
        self.client.table_names()
    }

    fn close(&self) {
        self.client.close();
    }

    #[getter]
    fn server_pid(&self) -> u32 {
        self.client.server_pid()
    }

    /// A writer into the store of `table` (default: the first table's).
    #[pyo3(signature = (table=None, max_sequence_length=None))]
    fn writer(&self, py: Python<'_>, table: Option<String>, max_sequence_length: Option<i64>) -> PyResult<PyWriter> {
        if let Some(m) = max_sequence_length.filter(|&m| m < 1) {
            return Err(invalid(py, format!("max_sequence_length must be >= 1 or None, got {m}")));
        }
        let w = py
            .detach(|| self.client.writer(table.as_deref(), max_sequence_length.map(|m| m as u64)))
            .map_err(py_err(py))?;
        let fields = Arc::new(field_infos(py, w.columns().signature())?);
        Ok(PyWriter::new(AnyWriter::Client(w), fields))
    }

    #[pyo3(signature = (table, n, timeout=None, fields=None))]
    fn sample<'py>(&self, py: Python<'py>, table: &str, n: i64, timeout: Option<f64>, fields: Option<Vec<String>>) -> PyResult<Bound<'py, PyAny>> {
        let args = Self::draw_args(py, n, timeout)?;
        let columns = self.client.columns(Some(table)).map_err(py_err(py))?;
        let select = select_fields(py, columns.signature(), fields)?;
        let (sample, error) = self.draw(py, table, args)?;
        match error {
            None => sample_object(py, sample, select.as_deref()),
            Some(err) => {
                if !reprise_core::Collect::items(&sample).is_empty() {
                    err.value(py).setattr("partial", sample_object(py, sample, select.as_deref())?)?;
                }
                Err(err)
            }
        }
    }

    /// Draws n items and keeps their rows held (the server keeps them from being
    /// reused until the returned `SampleRows` is released).
    #[pyo3(signature = (table, n, timeout=None))]
    fn sample_rows(&self, py: Python<'_>, table: &str, n: i64, timeout: Option<f64>) -> PyResult<PySampleRows> {
        let (sample, error) = self.draw(py, table, Self::draw_args(py, n, timeout)?)?;
        match error {
            None => Ok(PySampleRows::new(Drawn::Client(sample))),
            Some(err) => {
                // The partial draw goes back as SampleRows, for the caller to collect.
                if !reprise_core::Collect::items(&sample).is_empty() {
                    err.value(py).setattr("partial", Bound::new(py, PySampleRows::new(Drawn::Client(sample)))?)?;
                }
                Err(err)
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn store_memory(&self, py: Python<'_>, table: &str) -> PyResult<((usize, usize), Vec<(String, usize, usize)>, u64, Vec<(String, Vec<usize>, String)>)> {
        let columns = self.client.columns(Some(table)).map_err(py_err(py))?;
        let (base, len) = columns.memory();
        let fields = columns.signature().fields().iter().map(|f| (f.name.clone(), f.shape.clone(), f.dtype.name().to_string())).collect();
        Ok(((base as usize, len), crate::store::layout(&columns), columns.capacity(), fields))
    }

    /// Asks the server to write a checkpoint; returns its path.
    fn checkpoint(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.client.checkpoint()).map_err(py_err(py))
    }

    fn update_priorities(&self, py: Python<'_>, table: &str, keys: &Bound<'_, PyAny>, priorities: &Bound<'_, PyAny>) -> PyResult<u64> {
        let keys = Vector::<u64>::new(py, "keys", keys, None)?;
        let priorities = Vector::<f64>::new(py, "priorities", priorities, Some(keys.len()))?;
        let (k, p) = (keys.as_slice(), priorities.as_slice());
        py.detach(|| self.client.update_priorities(table, k, p)).map_err(py_err(py))
    }

    fn delete(&self, py: Python<'_>, table: &str, keys: &Bound<'_, PyAny>) -> PyResult<u64> {
        let keys = Vector::<u64>::new(py, "keys", keys, None)?;
        let k = keys.as_slice();
        py.detach(|| self.client.delete(table, k)).map_err(py_err(py))
    }

    fn reset(&self, py: Python<'_>, table: &str) -> PyResult<()> {
        py.detach(|| self.client.reset(table)).map_err(py_err(py))
    }

    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let infos = py.detach(|| self.client.info()).map_err(py_err(py))?;
        let d = PyDict::new(py);
        for i in &infos {
            d.set_item(&i.name, info_dict(py, i)?)?;
        }
        Ok(d)
    }
}

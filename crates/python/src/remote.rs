//! The remote client and the gRPC service for Python: `rp.Client("host:port")` and
//! `rp.Server(tables, address=...)`.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};
use reprise_client::{RemoteClient, RemoteOptions};
use reprise_core::{DType, Field, Signature};
use reprise_server::checkpoint::Checkpointer;
use reprise_server::{GrpcOptions, GrpcServer};

use crate::arrays::{field_infos, Vector};
use crate::errors::{invalid, py_err, to_py};
use crate::table::{info_dict, PyTable};
use crate::timeout::{self, Signals};
use crate::writer::{AnyWriter, PyWriter};

#[pyclass(name = "GrpcServer", module = "reprise._native", frozen)]
pub struct PyGrpcServer {
    server: Mutex<Option<GrpcServer>>,
    address: String,
    metrics_address: Option<String>,
}

#[pymethods]
impl PyGrpcServer {
    #[new]
    #[pyo3(signature = (tables, address, token=None, tls_cert=None, tls_key=None, max_message_bytes=64<<20, max_batch_items=1<<16, max_concurrent_per_connection=64, checkpoint=None, metrics_address=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        tables: Vec<PyRef<'_, PyTable>>,
        address: &str,
        token: Option<String>,
        tls_cert: Option<Vec<u8>>,
        tls_key: Option<Vec<u8>>,
        max_message_bytes: usize,
        max_batch_items: u32,
        max_concurrent_per_connection: usize,
        checkpoint: Option<Py<PyAny>>,
        metrics_address: Option<String>,
    ) -> PyResult<Self> {
        let tables = tables.iter().map(|t| t.table.clone()).collect();
        let tls = match (tls_cert, tls_key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(invalid(py, "TLS needs both a certificate and a key".into())),
        };
        let checkpoint: Option<Checkpointer> = checkpoint.map(crate::serving::checkpointer);
        let options = GrpcOptions { token, tls, max_message_bytes, max_batch_items, max_concurrent_per_connection, checkpoint, metrics_address };
        let server = py.detach(|| GrpcServer::start(tables, address, options)).map_err(py_err(py))?;
        Ok(PyGrpcServer { address: server.address(), metrics_address: server.metrics_address(), server: Mutex::new(Some(server)) })
    }

    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    #[getter]
    fn metrics_address(&self) -> Option<String> {
        self.metrics_address.clone()
    }

    /// Stops accepting calls, lets calls in progress finish for up to `grace` seconds.
    #[pyo3(signature = (grace=5.0))]
    fn stop(&self, py: Python<'_>, grace: f64) {
        let server = self.server.lock().take();
        if let Some(mut s) = server {
            py.detach(|| s.stop(std::time::Duration::from_secs_f64(grace.max(0.0))));
        }
    }
}

#[pyclass(name = "RemoteClient", module = "reprise._native", frozen)]
pub struct PyRemoteClient {
    client: Arc<RemoteClient>,
}

/// The signature of a store in a server's layout.
fn signature_of(py: Python<'_>, store: &reprise_client::pb::Store) -> PyResult<Signature> {
    let fields = store
        .fields
        .iter()
        .map(|f| Field::new(&f.name, DType::from_name(&f.dtype)?, f.shape.iter().map(|&d| d as usize).collect()))
        .collect::<reprise_core::Result<Vec<_>>>()
        .map_err(py_err(py))?;
    Signature::new(fields).map_err(py_err(py))
}

#[pymethods]
impl PyRemoteClient {
    #[new]
    #[pyo3(signature = (address, token=None, tls=false, tls_ca=None, tls_domain=None, connect_timeout=None))]
    fn new(py: Python<'_>, address: &str, token: Option<String>, tls: bool, tls_ca: Option<Vec<u8>>, tls_domain: Option<String>, connect_timeout: Option<f64>) -> PyResult<Self> {
        let connect_timeout = timeout::parse(py, connect_timeout)?;
        let options = RemoteOptions { token, tls: tls || tls_ca.is_some(), ca_pem: tls_ca, domain: tls_domain, connect_timeout };
        let client = py.detach(|| RemoteClient::connect(address, options)).map_err(py_err(py))?;
        Ok(PyRemoteClient { client: Arc::new(client) })
    }

    fn table_names(&self) -> Vec<String> {
        self.client.table_names()
    }

    /// `[(name, shape, dtype)]` of the fields of `table`'s store.
    fn fields(&self, py: Python<'_>, table: &str) -> PyResult<Vec<(String, Vec<u64>, String)>> {
        let store = self.client.store_of(table).map_err(py_err(py))?;
        Ok(store.fields.iter().map(|f| (f.name.clone(), f.shape.clone(), f.dtype.clone())).collect())
    }

    #[pyo3(signature = (table=None, max_sequence_length=None))]
    fn writer(&self, py: Python<'_>, table: Option<String>, max_sequence_length: Option<i64>) -> PyResult<PyWriter> {
        if let Some(m) = max_sequence_length.filter(|&m| m < 1) {
            return Err(invalid(py, format!("max_sequence_length must be >= 1 or None, got {m}")));
        }
        let name = table.clone().or_else(|| self.client.table_names().first().cloned()).unwrap_or_default();
        let sig = signature_of(py, self.client.store_of(&name).map_err(py_err(py))?)?;
        let w = py.detach(|| self.client.writer(table.as_deref(), max_sequence_length.map(|m| m as u64))).map_err(py_err(py))?;
        Ok(PyWriter::new(AnyWriter::Remote(w), Arc::new(field_infos(py, &sig)?)))
    }

    /// Draws n items; returns a dict of the sample's arrays, `fields`, `columns`
    /// (a bytearray per field) and `partial`.
    #[pyo3(signature = (table, n, timeout=None, fields=None))]
    fn sample<'py>(&self, py: Python<'py>, table: &str, n: i64, timeout: Option<f64>, fields: Option<Vec<String>>) -> PyResult<Bound<'py, PyDict>> {
        let timeout = timeout::parse(py, timeout)?;
        let n = sample_size(py, n)?;
        let fields = fields.unwrap_or_default();
        let signals = Signals::default();
        let check = || signals.check();
        let (s, partial) = py
            .detach(|| self.client.sample(table, n, &fields, timeout, Some(&check)))
            .map_err(|e| to_py(py, e, None, signals.take()))?;
        sample_dict(py, s.response, partial)
    }

    /// A pipelined sampler: `max_in_flight` batches requested ahead on one stream.
    #[pyo3(signature = (table, n, timeout=None, fields=None, max_in_flight=2))]
    fn sampler(&self, py: Python<'_>, table: &str, n: i64, timeout: Option<f64>, fields: Option<Vec<String>>, max_in_flight: i64) -> PyResult<PyRemoteSampler> {
        let timeout = timeout::parse(py, timeout)?;
        let n = sample_size(py, n)?;
        let k = u32::try_from(max_in_flight).ok().filter(|&k| k >= 1).ok_or_else(|| invalid(py, format!("max_in_flight must be >= 1, got {max_in_flight}")))?;
        let fields = fields.unwrap_or_default();
        let s = py.detach(|| self.client.sampler(table, n, &fields, timeout, k)).map_err(py_err(py))?;
        Ok(PyRemoteSampler { sampler: Mutex::new(s) })
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

    fn checkpoint(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.client.checkpoint()).map_err(py_err(py))
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

fn sample_size(py: Python<'_>, n: i64) -> PyResult<u32> {
    u32::try_from(n).ok().filter(|&n| n >= 1).ok_or_else(|| invalid(py, format!("sample size must be >= 1, got {n}")))
}

/// A remote sample as a dict for `reprise.client` to turn into a `Sample`.
fn sample_dict<'py>(py: Python<'py>, r: reprise_client::pb::SampleResponse, partial: bool) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("keys", numpy::PyArray1::from_vec(py, r.keys))?;
    d.set_item("probabilities", numpy::PyArray1::from_vec(py, r.probabilities))?;
    d.set_item("priorities", numpy::PyArray1::from_vec(py, r.priorities))?;
    d.set_item("times_sampled", numpy::PyArray1::from_iter(py, r.times_sampled.iter().map(|&x| x as i64)))?;
    d.set_item("lengths", numpy::PyArray1::from_iter(py, r.lengths.iter().map(|&x| x as i64)))?;
    d.set_item("table_size", r.table_size)?;
    d.set_item("max_length", r.max_length)?;
    d.set_item("fields", r.fields)?;
    let cols: Vec<Bound<'py, PyByteArray>> = r.columns.iter().map(|c| PyByteArray::new(py, c)).collect();
    d.set_item("columns", cols)?;
    d.set_item("partial", partial)?;
    Ok(d)
}

#[pyclass(name = "RemoteSampler", module = "reprise._native", frozen)]
pub struct PyRemoteSampler {
    sampler: Mutex<reprise_client::RemoteSampler>,
}

#[pymethods]
impl PyRemoteSampler {
    /// The next batch, as `RemoteClient.sample` returns it.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let Some(mut s) = self.sampler.try_lock() else {
            return Err(crate::errors::new_error(py, "RepriseError", "this sampler is in use by another thread".into()));
        };
        let signals = Signals::default();
        let check = || signals.check();
        let sampler: &mut reprise_client::RemoteSampler = &mut s;
        let (r, partial) = py.detach(|| sampler.next(Some(&check))).map_err(|e| to_py(py, e, None, signals.take()))?;
        sample_dict(py, r.response, partial)
    }
}

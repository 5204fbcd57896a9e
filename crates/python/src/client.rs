//! `Client` for Python: one class over both client transports, `local` (a server on
//! this host, `unix:///...`) and `remote` (gRPC, `host:port`). Every operation goes
//! through `reprise_client::ReplayClient`; only what a transport really does
//! differently branches: how a sample's rows reach numpy (local rows are copied out
//! of shared memory here, remote rows arrived in the answer) and the zero-copy GPU
//! path, which only a local client has (`sample_rows`, `store_memory`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use numpy::{PyArray1, PyArrayDescr};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use reprise_client::{Drawn, LocalClient, LocalSample, RemoteClient, RemoteOptions, RemoteSample, ReplayClient, Sampler};
use reprise_core::attributes::{AttributeSpec, Attributes};
use reprise_core::{Collect, DType, Signature};

use crate::arrays::{field_infos, new_array, select_fields, Vector};
use crate::errors::invalid;
use crate::raise::{py_err, to_py};
use crate::rows::{HeldRows, PySampleRows};
use crate::sample::{sample_class, sample_with};
use crate::table::info_dict;
use crate::timeout::{self, Signals};
use crate::writer::{AnyWriter, PyWriter};

/// The transport of one client.
enum Connection {
    Local(LocalClient),
    Remote(Box<RemoteClient>),
}

/// Runs `$body` with `$c` bound to whichever client `$conn` holds: the operations
/// both transports share through `ReplayClient`.
macro_rules! each {
    ($conn:expr, $c:ident => $body:expr) => {
        match $conn {
            Connection::Local($c) => $body,
            Connection::Remote($c) => $body,
        }
    };
}

#[pyclass(name = "Client", module = "reprise._native", frozen)]
pub struct PyClient {
    connection: Connection,
    /// Each table's attribute schema, asked of the server once (it never changes).
    schemas: Mutex<HashMap<String, Arc<Attributes>>>,
}

/// Every table's attribute schema from the server's figures.
fn schemas_of(infos: &[reprise_core::TableInfo]) -> reprise_core::Result<HashMap<String, Arc<Attributes>>> {
    infos
        .iter()
        .map(|i| {
            let specs = i
                .attributes
                .iter()
                .map(|(name, dtype)| Ok(AttributeSpec { name: name.clone(), dtype: DType::from_name(dtype)? }))
                .collect::<reprise_core::Result<Vec<_>>>()?;
            Ok((i.name.clone(), Arc::new(Attributes::new(specs)?)))
        })
        .collect()
}

fn socket_path(py: Python<'_>, address: &str) -> PyResult<PathBuf> {
    match address.strip_prefix("unix://") {
        Some(path) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ => Err(invalid(py, format!(
            "address {address:?}: expected a local server address 'unix:///path/to/socket' (server.local_address)"
        ))),
    }
}

fn sample_size(py: Python<'_>, n: i64) -> PyResult<u32> {
    u32::try_from(n).ok().filter(|&n| n >= 1).ok_or_else(|| invalid(py, format!("sample size must be >= 1, got {n}")))
}

/// A draw as Python sees it: the sample, or the error that cut it short carrying
/// what was drawn as its `partial`.
fn finish<'py, S>(py: Python<'py>, drawn: Drawn<S>, drew_any: impl Fn(&S) -> bool, convert: impl FnOnce(S) -> PyResult<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    match drawn.cut_short {
        None => convert(drawn.sample),
        Some(e) => {
            let err = to_py(py, e, None, None);
            if drew_any(&drawn.sample) {
                err.value(py).setattr("partial", convert(drawn.sample)?)?;
            }
            Err(err)
        }
    }
}

/// `select`: the columns to copy, as `select_fields` made them from Python's `fields`
/// (`None`: all; an empty list: none, as `Table.sample` does).
fn local_sample<'py>(py: Python<'py>, drawn: Drawn<LocalSample>, select: Option<&[usize]>, schema: &Attributes, packed: bool) -> PyResult<Bound<'py, PyAny>> {
    finish(py, drawn, |s| !s.items().is_empty(), |s| {
        let records = s.attributes().to_vec();
        sample_with(py, s, select, schema, &records, packed)
    })
}

/// A remote answer as a `reprise.Sample`: the rows arrived as `[n, T, row]` bytes per
/// field (in one message or several), zero past each item's length; they are copied
/// once, from the received messages into numpy arrays. (Views of the messages would
/// save that copy but be misaligned for their dtypes wherever protobuf put them.)
fn remote_sample<'py>(py: Python<'py>, drawn: Drawn<RemoteSample>, sig: &Signature, schema: &Attributes) -> PyResult<Bound<'py, PyAny>> {
    finish(py, drawn, |s| !s.response.keys.is_empty(), |s| {
        let r = &s.response;
        let (n, t) = (r.keys.len(), r.max_length as usize);
        let data = PyDict::new(py);
        for (f, name) in r.fields.iter().enumerate() {
            let field = sig.index_of(name).map(|i| &sig.fields()[i]).ok_or_else(|| {
                crate::errors::new_error(py, "Corrupt", format!("the server sent unknown field '{name}'"))
            })?;
            let mut shape = vec![n, t];
            shape.extend(field.sample_shape());
            let dtype: Py<PyArrayDescr> = PyArrayDescr::new(py, field.dtype.name())?.unbind();
            let (array, mut out) = new_array(py, &shape, &dtype, false)?;
            let want = out.bytes().len();
            let got: usize = s.chunks(f).map(<[u8]>::len).sum();
            if want != got {
                return Err(crate::errors::new_error(py, "Corrupt", format!(
                    "field '{name}': the server sent {got} bytes for {n} items of {t} steps, expected {want}"
                )));
            }
            py.detach(|| {
                let dst = out.bytes();
                let mut at = 0;
                for chunk in s.chunks(f) {
                    dst[at..at + chunk.len()].copy_from_slice(chunk);
                    at += chunk.len();
                }
            });
            data.set_item(name, array)?;
        }
        let r = s.response;
        let attributes = attribute_columns(py, schema, &r.attributes, r.keys.len())?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("keys", PyArray1::from_vec(py, r.keys))?;
        kwargs.set_item("probabilities", PyArray1::from_vec(py, r.probabilities))?;
        kwargs.set_item("priorities", PyArray1::from_vec(py, r.priorities))?;
        kwargs.set_item("times_sampled", PyArray1::from_iter(py, r.times_sampled.iter().map(|&x| x as i64)))?;
        kwargs.set_item("table_size", r.table_size)?;
        kwargs.set_item("lengths", PyArray1::from_iter(py, r.lengths.iter().map(|&x| x as i64)))?;
        kwargs.set_item("data", data)?;
        kwargs.set_item("attributes", attributes)?;
        sample_class(py)?.call((), Some(&kwargs))
    })
}

/// `{name: array[n]}` from a remote answer's attribute columns (one per attribute,
/// in the table's order); a column of the wrong size is `Corrupt`.
fn attribute_columns<'py>(py: Python<'py>, schema: &Attributes, columns: &[impl AsRef<[u8]>], n: usize) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    if columns.is_empty() {
        return Ok(out);
    }
    if columns.len() != schema.len() {
        return Err(crate::errors::new_error(py, "Corrupt", format!("the server sent {} attribute columns; the table has {}", columns.len(), schema.len())));
    }
    for (spec, column) in schema.specs().iter().zip(columns) {
        let column = column.as_ref();
        if column.len() != n * spec.dtype.itemsize() {
            return Err(crate::errors::new_error(py, "Corrupt", format!("attribute '{}': {} bytes for {n} items", spec.name, column.len())));
        }
        let dtype: Py<PyArrayDescr> = PyArrayDescr::new(py, spec.dtype.name())?.unbind();
        let (array, mut dst) = new_array(py, &[n], &dtype, false)?;
        dst.bytes().copy_from_slice(column);
        out.set_item(&spec.name, array)?;
    }
    Ok(out)
}

impl PyClient {
    /// `table`'s attribute schema (asked of the server the first time).
    fn schema(&self, py: Python<'_>, table: &str) -> PyResult<Arc<Attributes>> {
        if let Some(s) = self.schemas.lock().get(table) {
            return Ok(s.clone());
        }
        let infos = py.detach(|| each!(&self.connection, c => c.info())).map_err(py_err(py))?;
        let all = schemas_of(&infos).map_err(py_err(py))?;
        let mut cache = self.schemas.lock();
        cache.extend(all);
        cache.get(table).cloned().ok_or_else(|| crate::errors::new_error(py, "NotFound", format!("no table named '{table}' on this server")))
    }

    fn local(&self, py: Python<'_>, what: &str) -> PyResult<&LocalClient> {
        match &self.connection {
            Connection::Local(c) => Ok(c),
            Connection::Remote(_) => Err(invalid(py, format!("{what} is for local clients ('unix:///...'): a remote client's rows are not in this host's memory"))),
        }
    }
}

#[pymethods]
impl PyClient {
    /// `unix:///...`: a local client (no token or TLS: the socket's permissions
    /// authenticate it); `host:port`: a remote client.
    #[new]
    #[pyo3(signature = (address, token=None, tls=false, tls_ca=None, tls_domain=None, connect_timeout=None, compression=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, address: &str, token: Option<String>, tls: bool, tls_ca: Option<Vec<u8>>, tls_domain: Option<String>, connect_timeout: Option<f64>, compression: Option<bool>) -> PyResult<Self> {
        let connection = if address.starts_with("unix://") {
            if token.is_some() || tls || tls_ca.is_some() || tls_domain.is_some() {
                return Err(invalid(py, "token/tls are for remote 'host:port' addresses; local clients are authenticated by the socket's permissions".into()));
            }
            if compression.is_some() {
                return Err(invalid(py, "compression is for remote 'host:port' addresses; a local client's step data never crosses its socket".into()));
            }
            let path = socket_path(py, address)?;
            Connection::Local(py.detach(|| LocalClient::connect(&path)).map_err(py_err(py))?)
        } else {
            let connect_timeout = timeout::parse(py, connect_timeout)?;
            let options = RemoteOptions { token, tls: tls || tls_ca.is_some(), ca_pem: tls_ca, domain: tls_domain, connect_timeout, compression };
            Connection::Remote(Box::new(py.detach(|| RemoteClient::connect(address, options)).map_err(py_err(py))?))
        };
        Ok(PyClient { connection, schemas: Mutex::new(HashMap::new()) })
    }

    /// True for a local client (same host, shared memory).
    #[getter]
    fn is_local(&self) -> bool {
        matches!(self.connection, Connection::Local(_))
    }

    fn table_names(&self) -> Vec<String> {
        each!(&self.connection, c => c.table_names())
    }

    /// `[(name, shape, dtype)]` of the fields of `table`'s store.
    fn fields(&self, py: Python<'_>, table: &str) -> PyResult<Vec<(String, Vec<usize>, String)>> {
        let sig = each!(&self.connection, c => c.signature(table)).map_err(py_err(py))?;
        Ok(sig.fields().iter().map(|f| (f.name.clone(), f.shape.clone(), f.dtype.name().to_string())).collect())
    }

    /// A writer into the store of `table` (default: the first table's).
    #[pyo3(signature = (table=None, max_sequence_length=None))]
    fn writer(&self, py: Python<'_>, table: Option<String>, max_sequence_length: Option<i64>) -> PyResult<PyWriter> {
        if let Some(m) = max_sequence_length.filter(|&m| m < 1) {
            return Err(invalid(py, format!("max_sequence_length must be >= 1 or None, got {m}")));
        }
        let name = table.clone().or_else(|| self.table_names().first().cloned()).unwrap_or_default();
        let sig = each!(&self.connection, c => c.signature(&name)).map_err(py_err(py))?;
        let msl = max_sequence_length.map(|m| m as u64);
        let writer: Box<dyn reprise_client::StepWriter> = py
            .detach(|| each!(&self.connection, c => c.writer(table.as_deref(), msl).map(|w| Box::new(w) as Box<dyn reprise_client::StepWriter>)))
            .map_err(py_err(py))?;
        let infos = py.detach(|| each!(&self.connection, c => c.info())).map_err(py_err(py))?;
        let schemas = Arc::new(schemas_of(&infos).map_err(py_err(py))?);
        Ok(PyWriter::new(AnyWriter::Client { writer, release_gil: !self.is_local(), schemas }, Arc::new(field_infos(py, &sig)?)))
    }

    /// Draws n items, or with `tokens` as many whole items as fit in that many
    /// steps; a `reprise.Sample` of numpy arrays (`fields`: a subset). A token
    /// sample from a local client is packed; a remote one arrives padded.
    #[pyo3(signature = (table, n, timeout=None, fields=None, tokens=None))]
    fn sample<'py>(&self, py: Python<'py>, table: &str, n: i64, timeout: Option<f64>, fields: Option<Vec<String>>, tokens: Option<i64>) -> PyResult<Bound<'py, PyAny>> {
        let timeout = timeout::parse(py, timeout)?;
        let tokens = match tokens {
            None => None,
            Some(t) => Some(u64::try_from(t).ok().filter(|&t| t >= 1).ok_or_else(|| invalid(py, format!("tokens must be >= 1, got {t}")))?),
        };
        let n = if tokens.is_some() { 1 } else { sample_size(py, n)? };
        let schema = self.schema(py, table)?;
        let signals = Signals::default();
        let check = || signals.check();
        match &self.connection {
            Connection::Local(c) => {
                let columns = c.columns(Some(table)).map_err(py_err(py))?;
                let select = select_fields(py, columns.signature(), fields)?;
                let drawn = py
                    .detach(|| match tokens {
                        Some(t) => c.sample_tokens(table, t, &[], timeout, Some(&check)),
                        None => c.sample(table, n, &[], timeout, Some(&check)),
                    })
                    .map_err(|e| to_py(py, e, None, signals.take()))?;
                local_sample(py, drawn, select.as_deref(), &schema, tokens.is_some())
            }
            Connection::Remote(c) => {
                let sig = c.signature_of(table).map_err(py_err(py))?;
                let fields = fields.unwrap_or_default();
                let drawn = py
                    .detach(|| match tokens {
                        Some(t) => c.sample_tokens(table, t, &fields, timeout, Some(&check)),
                        None => c.sample(table, n, &fields, timeout, Some(&check)),
                    })
                    .map_err(|e| to_py(py, e, None, signals.take()))?;
                remote_sample(py, drawn, sig, &schema)
            }
        }
    }

    /// Sets `table`'s policy version; returns how many items left as stale.
    fn set_version(&self, py: Python<'_>, table: &str, version: i64) -> PyResult<u64> {
        py.detach(|| each!(&self.connection, c => c.set_version(table, version))).map_err(py_err(py))
    }

    /// Sets attribute `name` of `keys` from `values` (its dtype's bytes, one per key).
    fn update_attribute(&self, py: Python<'_>, table: &str, keys: &Bound<'_, PyAny>, name: &str, values: Bound<'_, pyo3::types::PyBytes>) -> PyResult<u64> {
        let keys = Vector::<u64>::new(py, "keys", keys, None)?;
        let (k, v) = (keys.as_slice(), values.as_bytes());
        py.detach(|| each!(&self.connection, c => c.update_attribute(table, k, name, v))).map_err(py_err(py))
    }

    /// `[(name, dtype)]` of `table`'s item attributes.
    fn attributes(&self, py: Python<'_>, table: &str) -> PyResult<Vec<(String, &'static str)>> {
        Ok(self.schema(py, table)?.specs().iter().map(|a| (a.name.clone(), a.dtype.name())).collect())
    }

    /// Batches drawn one after another (`Sampler.next()`); a remote client keeps
    /// `max_in_flight` requests outstanding on one stream.
    #[pyo3(signature = (table, n, timeout=None, fields=None, max_in_flight=2))]
    fn sampler(&self, py: Python<'_>, table: &str, n: i64, timeout: Option<f64>, fields: Option<Vec<String>>, max_in_flight: i64) -> PyResult<PySampler> {
        let timeout = timeout::parse(py, timeout)?;
        let n = sample_size(py, n)?;
        let k = u32::try_from(max_in_flight).ok().filter(|&k| k >= 1).ok_or_else(|| invalid(py, format!("max_in_flight must be >= 1, got {max_in_flight}")))?;
        let schema = self.schema(py, table)?;
        let inner = match &self.connection {
            Connection::Local(c) => {
                let select = select_fields(py, c.columns(Some(table)).map_err(py_err(py))?.signature(), fields)?;
                AnySampler::Local(py.detach(|| c.sampler(table, n, &[], timeout, k)).map_err(py_err(py))?, select, schema)
            }
            Connection::Remote(c) => {
                let sig = c.signature(table).map_err(py_err(py))?;
                let fields = fields.unwrap_or_default();
                AnySampler::Remote(Box::new(py.detach(|| c.sampler(table, n, &fields, timeout, k)).map_err(py_err(py))?), sig, schema)
            }
        };
        Ok(PySampler { inner: Mutex::new(inner) })
    }

    /// Draws n items and keeps their rows held in shared memory (the server keeps
    /// them from being reused until the returned `SampleRows` is released): the
    /// zero-copy GPU collect path. Local clients only.
    #[pyo3(signature = (table, n, timeout=None))]
    fn sample_rows(&self, py: Python<'_>, table: &str, n: i64, timeout: Option<f64>) -> PyResult<PySampleRows> {
        let client = self.local(py, "sample_rows")?;
        let timeout = timeout::parse(py, timeout)?;
        let n = sample_size(py, n)?;
        let signals = Signals::default();
        let check = || signals.check();
        let drawn = py.detach(|| client.sample(table, n, &[], timeout, Some(&check))).map_err(|e| to_py(py, e, None, signals.take()))?;
        match drawn.cut_short {
            None => Ok(PySampleRows::new(HeldRows::Local(drawn.sample))),
            Some(e) => {
                let err = to_py(py, e, None, None);
                // The partial draw goes back as SampleRows, for the caller to collect.
                if !drawn.sample.items().is_empty() {
                    err.value(py).setattr("partial", Bound::new(py, PySampleRows::new(HeldRows::Local(drawn.sample)))?)?;
                }
                Err(err)
            }
        }
    }

    /// `((address, bytes), layout, capacity, fields, path)` of `table`'s shared-memory
    /// store, mapped in this process. Local clients only.
    #[allow(clippy::type_complexity)]
    fn store_memory(&self, py: Python<'_>, table: &str) -> PyResult<((usize, usize), Vec<(String, usize, usize)>, u64, Vec<(String, Vec<usize>, String, Option<i32>, u32, String)>, PathBuf, bool)> {
        let columns = self.local(py, "store_memory")?.columns(Some(table)).map_err(py_err(py))?;
        let (base, len) = columns.memory();
        let fields = columns
            .signature()
            .fields()
            .iter()
            .map(|f| (f.name.clone(), f.shape.clone(), f.dtype.name().to_string(), f.compress, f.stack, f.padding.name().to_string()))
            .collect();
        Ok(((base as usize, len), crate::store::layout(&columns), columns.capacity(), fields, columns.path().to_path_buf(), columns.on_disk()))
    }

    fn update_priorities(&self, py: Python<'_>, table: &str, keys: &Bound<'_, PyAny>, priorities: &Bound<'_, PyAny>) -> PyResult<u64> {
        let keys = Vector::<u64>::new(py, "keys", keys, None)?;
        let priorities = Vector::<f64>::new(py, "priorities", priorities, Some(keys.len()))?;
        let (k, p) = (keys.as_slice(), priorities.as_slice());
        py.detach(|| each!(&self.connection, c => c.update_priorities(table, k, p))).map_err(py_err(py))
    }

    fn delete(&self, py: Python<'_>, table: &str, keys: &Bound<'_, PyAny>) -> PyResult<u64> {
        let keys = Vector::<u64>::new(py, "keys", keys, None)?;
        let k = keys.as_slice();
        py.detach(|| each!(&self.connection, c => c.delete(table, k))).map_err(py_err(py))
    }

    fn reset(&self, py: Python<'_>, table: &str) -> PyResult<()> {
        py.detach(|| each!(&self.connection, c => c.reset(table))).map_err(py_err(py))
    }

    /// Asks the server to write a checkpoint; returns its path.
    fn checkpoint(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| each!(&self.connection, c => c.checkpoint())).map_err(py_err(py))
    }

    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let infos = py.detach(|| each!(&self.connection, c => c.info())).map_err(py_err(py))?;
        let d = PyDict::new(py);
        for i in &infos {
            d.set_item(&i.name, info_dict(py, i)?)?;
        }
        Ok(d)
    }

    /// The server's snapshot as JSON text (see `Client.snapshot`).
    fn snapshot_json(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| each!(&self.connection, c => c.snapshot())).map_err(py_err(py))
    }

    fn close(&self) {
        each!(&self.connection, c => c.close())
    }
}

enum AnySampler {
    Local(reprise_client::local::LocalSampler, Option<Vec<usize>>, Arc<Attributes>),
    Remote(Box<reprise_client::RemoteSampler>, Signature, Arc<Attributes>),
}

#[pyclass(name = "Sampler", module = "reprise._native", frozen)]
pub struct PySampler {
    inner: Mutex<AnySampler>,
}

#[pymethods]
impl PySampler {
    /// The next batch, as `Client.sample` returns it.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(mut guard) = self.inner.try_lock() else {
            return Err(crate::errors::new_error(py, "RepriseError", "this sampler is in use by another thread".into()));
        };
        let signals = Signals::default();
        let check = || signals.check();
        match &mut *guard {
            AnySampler::Local(s, select, schema) => {
                let drawn = py.detach(|| s.next(Some(&check))).map_err(|e| to_py(py, e, None, signals.take()))?;
                local_sample(py, drawn, select.as_deref(), schema, false)
            }
            AnySampler::Remote(s, sig, schema) => {
                let drawn = py.detach(|| s.next(Some(&check))).map_err(|e| to_py(py, e, None, signals.take()))?;
                remote_sample(py, drawn, sig, schema)
            }
        }
    }
}

//! The servers for Python: `LocalServer` (clients on this host, over a Unix socket
//! and shared memory) and `RemoteServer` (gRPC), both over the same tables.
//! `rp.Server` runs one of each.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use reprise_server::checkpoint::Checkpointer;
use reprise_server::dashboard::Dashboard;
use reprise_server::monitor::Monitor;
use reprise_server::{RemoteServerOptions, RemoteServer, LocalServer};

use crate::errors::invalid;
use crate::raise::py_err;
use crate::table::PyTable;

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

/// What a server's tables and clients are doing; shared by the local and remote
/// servers of one `rp.Server` and read by its dashboard.
#[pyclass(name = "Monitor", module = "reprise._native", frozen)]
pub struct PyMonitor {
    monitor: Arc<Monitor>,
}

#[pymethods]
impl PyMonitor {
    #[new]
    fn new(tables: Vec<PyRef<'_, PyTable>>) -> Self {
        PyMonitor { monitor: Monitor::new(tables.iter().map(|t| t.table.clone()).collect()) }
    }

    /// The snapshot as JSON text.
    fn snapshot_json(&self, py: Python<'_>) -> String {
        py.detach(|| self.monitor.snapshot().to_string())
    }
}

/// The live dashboard of a monitor (`rp.Server(dashboard_address=...)`).
#[pyclass(name = "Dashboard", module = "reprise._native", frozen)]
pub struct PyDashboard {
    dashboard: Mutex<Option<Dashboard>>,
    address: String,
}

#[pymethods]
impl PyDashboard {
    #[new]
    #[pyo3(signature = (monitor, address, token=None, files=None))]
    fn new(py: Python<'_>, monitor: PyRef<'_, PyMonitor>, address: &str, token: Option<String>, files: Option<std::path::PathBuf>) -> PyResult<Self> {
        let monitor = monitor.monitor.clone();
        let dashboard = py.detach(|| Dashboard::start(monitor, address, token, files)).map_err(py_err(py))?;
        Ok(PyDashboard { address: dashboard.address(), dashboard: Mutex::new(Some(dashboard)) })
    }

    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    fn stop(&self, py: Python<'_>) {
        let dashboard = self.dashboard.lock().take();
        if let Some(mut d) = dashboard {
            py.detach(|| d.stop());
        }
    }
}

#[pyclass(name = "LocalServer", module = "reprise._native", frozen)]
pub struct PyLocalServer {
    server: Mutex<Option<LocalServer>>,
    address: String,
    name: String,
}

#[pymethods]
impl PyLocalServer {
    #[new]
    #[pyo3(signature = (tables, name=None, checkpoint=None, monitor=None))]
    fn new(py: Python<'_>, tables: Vec<PyRef<'_, PyTable>>, name: Option<String>, checkpoint: Option<Py<PyAny>>, monitor: Option<PyRef<'_, PyMonitor>>) -> PyResult<Self> {
        let tables = tables.iter().map(|t| t.table.clone()).collect();
        let checkpoint: Option<Checkpointer> = checkpoint.map(checkpointer);
        let monitor = monitor.map(|m| m.monitor.clone());
        let server = py.detach(|| LocalServer::start_monitored(tables, name.as_deref(), checkpoint, monitor)).map_err(py_err(py))?;
        Ok(PyLocalServer { address: server.address(), name: server.name().to_string(), server: Mutex::new(Some(server)) })
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

/// The connection limits of `rp.Server(...)` (`reprise.server.DEFAULT_LIMITS` has
/// the defaults); a timeout of None is off.
#[derive(FromPyObject)]
pub struct ServerLimits {
    #[pyo3(item)]
    max_connections: usize,
    #[pyo3(item)]
    max_connections_per_peer: usize,
    #[pyo3(item)]
    idle_timeout: Option<f64>,
    #[pyo3(item)]
    stall_timeout: Option<f64>,
    #[pyo3(item)]
    keepalive: Option<f64>,
    #[pyo3(item)]
    auth_failures_per_minute: u32,
}

impl ServerLimits {
    fn into_options(self, py: Python<'_>) -> PyResult<(reprise_server::limits::Limits, Option<std::time::Duration>)> {
        let seconds = |what: &str, v: Option<f64>| -> PyResult<Option<std::time::Duration>> {
            match v {
                None => Ok(None),
                Some(s) if s.is_finite() && s >= 1.0 => Ok(Some(std::time::Duration::from_secs_f64(s))),
                Some(s) => Err(invalid(py, format!("{what} must be None (off) or seconds >= 1, got {s}"))),
            }
        };
        let limits = reprise_server::limits::Limits {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            idle_timeout: seconds("idle_timeout", self.idle_timeout)?,
            stall_timeout: seconds("stall_timeout", self.stall_timeout)?,
            auth_failures_per_minute: self.auth_failures_per_minute,
        };
        Ok((limits, seconds("keepalive", self.keepalive)?))
    }
}

#[pyclass(name = "RemoteServer", module = "reprise._native", frozen)]
pub struct PyRemoteServer {
    server: Mutex<Option<RemoteServer>>,
    address: String,
    metrics_address: Option<String>,
}

#[pymethods]
impl PyRemoteServer {
    #[new]
    #[pyo3(signature = (tables, address, token=None, tls_cert=None, tls_key=None, max_message_bytes=64<<20, max_batch_items=1<<16, max_concurrent_per_connection=64, checkpoint=None, metrics_address=None, monitor=None, limits=None))]
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
        monitor: Option<PyRef<'_, PyMonitor>>,
        limits: Option<ServerLimits>,
    ) -> PyResult<Self> {
        let tables = tables.iter().map(|t| t.table.clone()).collect();
        let tls = match (tls_cert, tls_key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(invalid(py, "TLS needs both a certificate and a key".into())),
        };
        let checkpoint: Option<Checkpointer> = checkpoint.map(checkpointer);
        let monitor = monitor.map(|m| m.monitor.clone());
        let defaults = RemoteServerOptions::default();
        let (limits, keepalive) = match limits {
            Some(l) => l.into_options(py)?,
            None => (defaults.limits, defaults.keepalive),
        };
        let options = RemoteServerOptions { token, tls, max_message_bytes, max_batch_items, max_concurrent_per_connection, checkpoint, metrics_address, monitor, limits, keepalive };
        let server = py.detach(|| RemoteServer::start(tables, address, options)).map_err(py_err(py))?;
        Ok(PyRemoteServer { address: server.address(), metrics_address: server.metrics_address(), server: Mutex::new(Some(server)) })
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

/// Where local servers put their sockets and name locks (`reprise doctor` shows it).
#[pyfunction]
pub fn socket_dir(py: Python<'_>) -> PyResult<String> {
    reprise_server::socket_dir().map(|d| d.display().to_string()).map_err(py_err(py))
}

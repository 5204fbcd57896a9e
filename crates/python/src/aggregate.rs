//! The aggregation daemon and worker for Python (`reprise.aggregate`): the Python layer
//! converts tensors (and quantizes for int32 mode); these classes move raw 4-byte words.

use std::net::SocketAddr;
use std::time::Duration;

use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use reprise_aggregator::metrics::MetricsServer;
use reprise_aggregator::{Allow, Daemon, DaemonOptions, Dtype, Error, JoinParams, Mode, Options, UpstreamOptions, Worker, WorkerOptions};

use crate::errors::{invalid, new_error};

fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let name = match &e {
        Error::InvalidArgument(_) => "InvalidArgument",
        Error::Timeout(_) => "Timeout",
        Error::Refused(_) => "Unauthenticated",
        Error::Io(_) => "RepriseError",
    };
    let name = if matches!(&e, Error::Refused(m) if !m.contains("unauthorized")) { "RepriseError" } else { name };
    new_error(py, name, e.to_string())
}

fn resolve(py: Python<'_>, what: &str, s: &str) -> PyResult<SocketAddr> {
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| invalid(py, format!("{what} {s:?}: expected HOST:PORT (an IPv4 or IPv6 address and a port)")))
}

fn seconds(py: Python<'_>, what: &str, s: f64) -> PyResult<Duration> {
    if !(s.is_finite() && s > 0.0) {
        return Err(invalid(py, format!("{what} must be a positive number of seconds, got {s}")));
    }
    Ok(Duration::from_secs_f64(s))
}

/// The daemon, running on a native thread of this process.
#[pyclass(name = "AggregateDaemon", module = "reprise._native", frozen)]
pub struct PyDaemon {
    daemon: Mutex<Option<Daemon>>,
    metrics: Mutex<Option<MetricsServer>>,
    stats: std::sync::Arc<reprise_aggregator::stats::Stats>,
    address: String,
    metrics_address: Option<String>,
}

#[pymethods]
impl PyDaemon {
    #[new]
    #[pyo3(signature = (address, token=None, allow=Vec::new(), member_timeout=30.0, max_jobs=64, drop_rate=0.0, seed=0,
                        busy_poll=false, transparent=false, tos=None, upstream=None, upstream_member=0, upstream_size=0,
                        metrics_address=None, max_job_bytes=reprise_aggregator::engine::DEFAULT_MAX_JOB_BYTES,
                        max_total_bytes=reprise_aggregator::engine::DEFAULT_MAX_TOTAL_BYTES, offload=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, address: &str, token: Option<String>, allow: Vec<String>, member_timeout: f64, max_jobs: usize, drop_rate: f64,
           seed: u64, busy_poll: bool, transparent: bool, tos: Option<u8>, upstream: Option<&str>, upstream_member: u16,
           upstream_size: u16, metrics_address: Option<&str>, max_job_bytes: u64, max_total_bytes: u64, offload: bool) -> PyResult<Self> {
        let bind = address_of(py, "address", address)?;
        let allow = allow
            .iter()
            .map(|a| a.parse::<Allow>().map_err(|e| invalid(py, format!("allow: {e}"))))
            .collect::<PyResult<Vec<_>>>()?;
        if max_jobs == 0 {
            return Err(invalid(py, "max_jobs must be at least 1".into()));
        }
        if max_job_bytes == 0 || max_total_bytes < max_job_bytes {
            return Err(invalid(py, format!(
                "max_job_bytes must be at least 1 and max_total_bytes at least max_job_bytes, got {max_job_bytes} and {max_total_bytes}"
            )));
        }
        let upstream = match upstream {
            None => None,
            Some(u) => {
                if upstream_size == 0 || upstream_member >= upstream_size {
                    return Err(invalid(py, format!(
                        "upstream needs upstream_size >= 1 (daemons the parent aggregates) and upstream_member below it, got {upstream_member} of {upstream_size}"
                    )));
                }
                Some(UpstreamOptions { address: resolve(py, "upstream", u)?, member: upstream_member, size: upstream_size })
            }
        };
        let token = token.filter(|t| !t.is_empty());
        if token.as_ref().is_some_and(|t| t.len() > reprise_aggregator::packet::MAX_TOKEN) {
            return Err(invalid(py, format!("token: at most {} bytes", reprise_aggregator::packet::MAX_TOKEN)));
        }
        let options = DaemonOptions {
            address: bind,
            engine: Options {
                token: token.clone(),
                allow,
                member_timeout: seconds(py, "member_timeout", member_timeout)?,
                max_jobs,
                max_job_bytes,
                max_total_bytes,
                drop_rate,
                seed,
                upstream,
            },
            busy_poll,
            transparent,
            tos,
            offload,
        };
        let daemon = py.detach(|| Daemon::start(options)).map_err(|e| to_py(py, e))?;
        let stats = daemon.stats();
        let metrics = match metrics_address {
            None => None,
            Some(a) => Some(MetricsServer::start(a, stats.clone(), token).map_err(|e| to_py(py, e))?),
        };
        Ok(PyDaemon {
            address: daemon.address().to_string(),
            metrics_address: metrics.as_ref().map(|m| m.address().to_string()),
            daemon: Mutex::new(Some(daemon)),
            metrics: Mutex::new(metrics),
            stats,
        })
    }

    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    #[getter]
    fn metrics_address(&self) -> Option<String> {
        self.metrics_address.clone()
    }

    /// Every counter, by name.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, _, value) in self.stats.snapshot() {
            d.set_item(name, value)?;
        }
        Ok(d)
    }

    /// Prometheus text of the counters.
    fn metrics_text(&self) -> String {
        reprise_aggregator::metrics::render(&self.stats)
    }

    fn stop(&self, py: Python<'_>) {
        let daemon = self.daemon.lock().take();
        let metrics = self.metrics.lock().take();
        py.detach(move || {
            drop(metrics);
            drop(daemon);
        });
    }
}

fn address_of(py: Python<'_>, what: &str, s: &str) -> PyResult<SocketAddr> {
    s.parse::<SocketAddr>()
        .map_err(|_| invalid(py, format!("{what} {s:?}: expected IP:PORT to bind (\"127.0.0.1:0\" picks a free loopback port)")))
}

/// A member of a job.
#[pyclass(name = "AggregateWorker", module = "reprise._native", frozen)]
pub struct PyWorker {
    worker: Mutex<Worker>,
}

#[pymethods]
impl PyWorker {
    #[new]
    #[pyo3(signature = (address, job, rank, size, mode="sync", dtype="float32", segment_values=256, window=128, staleness=0,
                        token=None, timeout=30.0, rto=0.01, drop_rate=0.0, seed=0, on_path=false, offload=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, address: &str, job: u32, rank: u16, size: u16, mode: &str, dtype: &str, segment_values: u16, window: u16,
           staleness: u16, token: Option<String>, timeout: f64, rto: f64, drop_rate: f64, seed: u64, on_path: bool,
           offload: bool) -> PyResult<Self> {
        let mode = match mode {
            "sync" => Mode::Sync,
            "async" => Mode::Async,
            m => return Err(invalid(py, format!("mode {m:?}: expected \"sync\" or \"async\""))),
        };
        let dtype = match dtype {
            "float32" => Dtype::Float32,
            "int32" => Dtype::Int32,
            d => return Err(invalid(py, format!("dtype {d:?}: expected \"float32\" or \"int32\""))),
        };
        if mode == Mode::Sync && staleness != 0 {
            return Err(invalid(py, format!("staleness {staleness} is for mode=\"async\"; sync mode waits for every member")));
        }
        let options = WorkerOptions {
            address: resolve(py, "address", address)?,
            job,
            member: rank,
            params: JoinParams { mode, dtype, size, segment_values, window, staleness },
            token: token.unwrap_or_default(),
            timeout: seconds(py, "timeout", timeout)?,
            rto: seconds(py, "rto", rto)?,
            drop_rate,
            seed,
            on_path,
            offload,
        };
        let worker = py.detach(|| Worker::join(options)).map_err(|e| to_py(py, e))?;
        Ok(PyWorker { worker: Mutex::new(worker) })
    }

    /// Sums `input` with every member's into `output` (both uint32 views of the job's dtype).
    fn allreduce<'py>(&self, py: Python<'py>, input: PyReadonlyArray1<'py, u32>, mut output: PyReadwriteArray1<'py, u32>) -> PyResult<Bound<'py, PyDict>> {
        let input = input.as_slice().map_err(|_| invalid(py, "input must be contiguous".into()))?;
        let output = output.as_slice_mut().map_err(|_| invalid(py, "output must be contiguous".into()))?;
        let report = py.detach(|| self.worker.lock().allreduce(input, output)).map_err(|e| to_py(py, e))?;
        let d = PyDict::new(py);
        d.set_item("counts", numpy::PyArray1::from_vec(py, report.counts))?;
        d.set_item("partial", report.partial)?;
        d.set_item("late", report.late)?;
        d.set_item("stale", report.stale)?;
        d.set_item("retransmits", report.retransmits)?;
        Ok(d)
    }

    fn set_h(&self, py: Python<'_>, h: u16) -> PyResult<u32> {
        py.detach(|| self.worker.lock().set_h(h)).map_err(|e| to_py(py, e))
    }

    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.worker.lock().reset()).map_err(|e| to_py(py, e))
    }

    fn fbcast(&self, py: Python<'_>, seq: u32) -> PyResult<bool> {
        py.detach(|| self.worker.lock().fbcast(seq)).map_err(|e| to_py(py, e))
    }

    fn leave(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.worker.lock().leave()).map_err(|e| to_py(py, e))
    }

    /// (next segment number, next round).
    fn position(&self) -> (u32, u32) {
        self.worker.lock().position()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDaemon>()?;
    m.add_class::<PyWorker>()?;
    Ok(())
}

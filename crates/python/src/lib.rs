//! `reprise._native`: the Python bindings over `reprise-core`. The public API is
//! the `reprise` package, a thin layer over these classes.

use pyo3::prelude::*;

// Modules in layer order: each uses only modules above it.
mod logging;
mod errors;
mod arrays;
mod sample;
mod raise;
mod timeout;
mod rows;
mod store;
mod table;
mod checkpoint;
mod writer;
mod client;
mod server;
mod cluster;
mod aggregate;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logging::install();
    m.add_class::<store::PyStore>()?;
    m.add_class::<writer::PyWriter>()?;
    m.add_class::<table::PyTable>()?;
    m.add_class::<rows::PySampleRows>()?;
    m.add_class::<server::PyLocalServer>()?;
    m.add_class::<server::PyRemoteServer>()?;
    m.add_class::<server::PyMonitor>()?;
    m.add_class::<server::PyDashboard>()?;
    m.add_class::<client::PyClient>()?;
    m.add_class::<client::PySampler>()?;
    m.add_function(wrap_pyfunction!(table::rate_limiter_preset, m)?)?;
    m.add_function(wrap_pyfunction!(server::socket_dir, m)?)?;
    m.add_function(wrap_pyfunction!(store::page_backing, m)?)?;
    m.add_function(wrap_pyfunction!(store::stale_stores, m)?)?;
    m.add_function(wrap_pyfunction!(arrays::same_bytes, m)?)?;
    checkpoint::register(m)?;
    cluster::register(m)?;
    aggregate::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

//! `reprise._native`: the Python bindings over `reprise-core`. The public API is
//! the `reprise` package, a thin layer over these classes.

use pyo3::prelude::*;

mod arrays;
mod checkpoint;
mod errors;
mod rows;
mod remote;
mod sample;
mod serving;
mod store;
mod table;
mod timeout;
mod writer;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::PyStore>()?;
    m.add_class::<writer::PyWriter>()?;
    m.add_class::<table::PyTable>()?;
    m.add_class::<rows::PySampleRows>()?;
    m.add_class::<serving::PyServer>()?;
    m.add_class::<serving::PyClient>()?;
    m.add_class::<remote::PyGrpcServer>()?;
    m.add_class::<remote::PyRemoteClient>()?;
    m.add_class::<remote::PyRemoteSampler>()?;
    m.add_function(wrap_pyfunction!(table::rate_limiter_preset, m)?)?;
    checkpoint::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

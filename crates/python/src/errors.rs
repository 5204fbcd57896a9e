//! The typed exceptions of `reprise.errors`, built from Rust. The bottom layer of the
//! bindings; converting a core error (with its partial result) is `raise`'s job.

use pyo3::prelude::*;

pub fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("reprise.errors")?.getattr(name)
}

/// Builds `reprise.errors.<name>(message)`.
pub fn new_error(py: Python<'_>, name: &str, message: String) -> PyErr {
    match class(py, name) {
        Ok(cls) => PyErr::from_type(cls.cast_into().expect("reprise.errors holds exception classes"), message),
        Err(e) => e,
    }
}

pub fn invalid(py: Python<'_>, message: String) -> PyErr {
    new_error(py, "InvalidArgument", message)
}

pub fn not_found(py: Python<'_>, message: String) -> PyErr {
    new_error(py, "NotFound", message)
}

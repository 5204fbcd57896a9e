//! Core errors as Python exceptions: the typed class of `reprise.errors` for each
//! error, and what a cut-short call did as the exception's `partial`.

use pyo3::prelude::*;
use reprise_core::error::{Error, Partial};

use crate::errors::new_error;
use crate::sample::sample_object;

/// Converts a core error. A timeout or interruption carries what the call did
/// before it stopped as the exception's `partial` attribute (keys inserted, or the
/// items sampled; `None` when it did nothing). `signal` is the exception a signal
/// handler raised while the call was blocked (for `Error::Interrupted`).
pub fn to_py(py: Python<'_>, e: Error, fields: Option<&[usize]>, signal: Option<PyErr>) -> PyErr {
    let name = match &e {
        Error::InvalidArgument(_) => "InvalidArgument",
        Error::NotFound(_) => "NotFound",
        Error::Timeout { .. } => "Timeout",
        Error::Interrupted { .. } => "RepriseError",
        Error::ResourceExhausted(_) => "ResourceExhausted",
        Error::Corrupt(_) => "Corrupt",
        Error::Io(_) => "RepriseError",
        Error::Unauthenticated(_) => "Unauthenticated",
    };
    let message = e.to_string();
    let interrupted = matches!(e, Error::Interrupted { .. });
    let (partial, err) = match e {
        Error::Timeout { partial, .. } => (partial, new_error(py, name, message)),
        Error::Interrupted { partial } => (partial, signal.unwrap_or_else(|| new_error(py, name, message))),
        _ => (Partial::Nothing, new_error(py, name, message)),
    };
    let value: PyResult<Option<Py<PyAny>>> = match partial {
        Partial::Nothing => Ok(None),
        Partial::Inserted(keys) if keys.is_empty() => Ok(None),
        Partial::Sampled(batch) if batch.batch().is_empty() => Ok(None),
        Partial::Inserted(keys) => Ok(Some(numpy::PyArray1::from_vec(py, keys).into_any().unbind())),
        Partial::Sampled(batch) => sample_object(py, batch.into_batch(), fields).map(|s| Some(s.unbind())),
    };
    match value {
        Ok(Some(v)) => {
            if let Err(set) = err.value(py).setattr("partial", v) {
                return set;
            }
            err
        }
        // KeyboardInterrupt has no class-level `partial = None` as Timeout does.
        Ok(None) if interrupted => match err.value(py).setattr("partial", py.None()) {
            Ok(()) => err,
            Err(set) => set,
        },
        Ok(None) => err,
        Err(conversion) => conversion,
    }
}

/// `map_err` helper: `.map_err(py_err(py))`.
pub fn py_err(py: Python<'_>) -> impl Fn(Error) -> PyErr + '_ {
    move |e| to_py(py, e, None, None)
}

//! Timeouts from Python: `None` waits for ever, `0` fails at once, seconds otherwise.

use std::time::Duration;

use pyo3::prelude::*;

use crate::errors::invalid;

pub fn parse(py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_infinite() && t > 0.0 => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(invalid(py, format!("timeout must be None or seconds >= 0, got {t}"))),
    }
}

//! Timeouts from Python: `None` waits for ever, `0` fails at once, seconds otherwise;
//! and Ctrl-C for threads blocked with the GIL released.

use std::time::Duration;

use parking_lot::Mutex;
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

/// Checks for pending Python signals from a blocked call (which holds no GIL and
/// no table lock when it asks) and keeps the exception a handler raised, such as
/// `KeyboardInterrupt`, to be raised when the call returns.
#[derive(Default)]
pub struct Signals {
    pending: Mutex<Option<PyErr>>,
}

impl Signals {
    pub fn check(&self) -> bool {
        Python::attach(|py| match py.check_signals() {
            Ok(()) => false,
            Err(e) => {
                *self.pending.lock() = Some(e);
                true
            }
        })
    }

    pub fn take(&self) -> Option<PyErr> {
        self.pending.lock().take()
    }
}

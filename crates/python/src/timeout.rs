//! Timeouts from Python: `None` waits for ever, `0` fails at once, seconds otherwise;
//! and Ctrl-C for threads blocked with the GIL released.

use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use pyo3::prelude::*;
use reprise_core::error::Error;
use reprise_core::Table;

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

/// A wait on `table`'s rate limiter that nothing could ever end: this is the only
/// Python thread and nothing else holds the table (no server serves it), so no one
/// can insert into it (or sample from it) while this call waits. Checked with the
/// interrupt check (every `Wait::POLL`) of a call without a timeout (one with a
/// timeout ends anyway, when its caller said), so a single-threaded program that
/// samples an empty table with `timeout=None` fails within moments instead of hanging.
pub struct Alone<'a> {
    table: &'a Table,
    /// Waiting to insert (else to sample).
    inserting: bool,
    /// Off for a call with a timeout.
    enabled: bool,
    /// Handles of the table the caller holds itself (the Python table's own, and a
    /// clone the call took): more than that means a server or another part holds it.
    own: usize,
    found: AtomicBool,
}

impl<'a> Alone<'a> {
    /// For a call on the Python table's own handle.
    pub fn new(table: &'a Table, inserting: bool, timeout: Option<Duration>) -> Alone<'a> {
        Alone { table, inserting, enabled: timeout.is_none(), own: 1, found: AtomicBool::new(false) }
    }

    /// For a call that inserts through a clone of a table's handle (a writer's target).
    pub fn cloned(table: &'a Table, timeout: Option<Duration>) -> Alone<'a> {
        Alone { table, inserting: true, enabled: timeout.is_none(), own: 2, found: AtomicBool::new(false) }
    }

    pub fn check(&self) -> bool {
        if !self.enabled || self.table.handles() > self.own {
            return false;
        }
        let threads = Python::attach(|py| {
            py.import("threading").and_then(|t| t.call_method0("active_count")).and_then(|n| n.extract::<usize>()).unwrap_or(2)
        });
        // Still blocked (the last other thread may have ended the wait as it left).
        let alone = threads == 1 && self.table.handles() <= self.own && self.table.blocked_because(self.inserting, 1).is_some();
        self.found.store(alone, Ordering::Relaxed);
        alone
    }

    /// `e`, or when it is the interrupt this check raised, a `Timeout` (with what
    /// the call did before, as any timeout) that says why the wait could never end.
    pub fn explain(&self, e: Error, want: u64) -> Error {
        match e {
            Error::Interrupted { partial } if self.found.load(Ordering::Relaxed) => {
                let (what, other, first) =
                    if self.inserting { ("inserting", "sample from", "sample first") } else { ("sampling", "insert into", "insert first") };
                let why = self.table.blocked_because(self.inserting, want).unwrap_or_else(|| "the rate limiter blocks it".into());
                Error::Timeout {
                    message: format!(
                        "table '{}': {what} would wait for ever: {why}, and no other thread or process can {other} \
                         this table (this is the only Python thread and no server serves it): {first}, or pass a timeout",
                        self.table.name(),
                    ),
                    partial,
                }
            }
            e => e,
        }
    }
}

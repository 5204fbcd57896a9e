//! How long a blocking call may wait, and how it learns it should stop early.

use std::time::{Duration, Instant};

/// A timeout (`None` waits for ever) plus an optional interrupt check. While
/// waiting, a call with an interrupt check wakes at least every
/// [`Wait::POLL`] to run it (without holding any table lock) and gives up with
/// `Error::Interrupted` when it returns true — the Python bindings use this to
/// deliver Ctrl-C to a thread blocked on a rate limiter.
#[derive(Clone, Copy, Default)]
pub struct Wait<'a> {
    pub timeout: Option<Duration>,
    pub interrupt: Option<&'a (dyn Fn() -> bool + Sync)>,
}

impl Wait<'_> {
    pub const POLL: Duration = Duration::from_millis(50);

    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.timeout.map(|t| Instant::now() + t)
    }

    pub(crate) fn describe(&self) -> String {
        self.timeout.map_or("no".into(), |t| format!("{:.3} s", t.as_secs_f64()))
    }
}

impl From<Option<Duration>> for Wait<'_> {
    fn from(timeout: Option<Duration>) -> Self {
        Wait { timeout, interrupt: None }
    }
}

//! How long a blocking call may wait, and how it learns it should stop early.

use std::sync::OnceLock;
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

impl<'a> Wait<'a> {
    pub const POLL: Duration = Duration::from_millis(50);

    /// When this wait's time runs out, counted from now.
    pub fn deadline(&self) -> Option<Instant> {
        self.timeout.map(|t| Instant::now() + t)
    }

    /// The same interrupt check with what is left until `deadline`: a call that
    /// waits several times takes its deadline once, at its start, and gives each
    /// wait what is left of it.
    pub fn until(self, deadline: Option<Instant>) -> Wait<'a> {
        Wait { timeout: deadline.map(|d| d.saturating_duration_since(Instant::now())), interrupt: self.interrupt }
    }

    /// True when the interrupt check says stop.
    pub fn interrupted(&self) -> bool {
        self.interrupt.is_some_and(|stop| stop())
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

/// How long a blocking call waits before it says, once, what it waits for: a
/// `tracing` warning with target `"reprise"` (the Python bindings pass it to the
/// `logging` logger "reprise"). `REPRISE_SLOW_WAIT_SECONDS` sets it; 5 s by default,
/// `0` turns the message off.
pub fn slow_wait() -> Option<Duration> {
    static SLOW: OnceLock<Option<Duration>> = OnceLock::new();
    *SLOW.get_or_init(|| {
        let seconds = std::env::var("REPRISE_SLOW_WAIT_SECONDS").ok().and_then(|v| v.trim().parse::<f64>().ok());
        match seconds {
            Some(0.0) => None,
            Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
            _ => Some(Duration::from_secs(5)),
        }
    })
}

/// One blocking call's clock for [`slow_wait`]: says its message at most once. The
/// clock starts at [`SlowWait::start`], or for a call that mostly does not wait, at
/// its first wait ([`SlowWait::lazy`] then [`SlowWait::begin`]): no clock read on
/// the fast path.
pub struct SlowWait {
    start: Option<Instant>,
    said: bool,
}

impl SlowWait {
    pub fn start() -> SlowWait {
        SlowWait { start: Some(Instant::now()), said: slow_wait().is_none() }
    }

    pub fn lazy() -> SlowWait {
        SlowWait { start: None, said: slow_wait().is_none() }
    }

    /// Starts a lazy clock (once; later calls keep the first start).
    pub fn begin(&mut self) {
        if self.start.is_none() && !self.said {
            self.start = Some(Instant::now());
        }
    }

    /// When to wake up to say it, if it has not been said.
    pub fn due(&self) -> Option<Instant> {
        match (self.said, self.start, slow_wait()) {
            (false, Some(start), Some(after)) => Some(start + after),
            _ => None,
        }
    }

    /// True once, when the call has waited past the threshold.
    pub fn is_due(&mut self) -> bool {
        let due = self.due().is_some_and(|d| Instant::now() >= d);
        self.said |= due;
        due
    }

    pub fn elapsed(&self) -> Duration {
        self.start.map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// Says `message` (what the call waits for) as a warning.
    pub fn say(&self, message: &str) {
        tracing::warn!(target: "reprise", "{message}");
    }
}

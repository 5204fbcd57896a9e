//! Helpers shared by the server's test files.

use std::time::{Duration, Instant};

/// How long a test waits for the other side before it calls the wait a failure.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Polls `cond` until it holds; panics naming `what` after [`PATIENCE`]. A slow
/// machine only makes it wait longer; it never passes before `cond` holds.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "waited {PATIENCE:?} for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

//! Reprise clients: one interface, two transports.
//!
//! - [`local`]: a client on the same host as the server. Its writers lease blocks and
//!   write steps in place in the store's shared memory; samples are row windows read in
//!   place. Only small control records cross the Unix socket
//!   ([`reprise_wire::local`]).
//! - [`remote`]: a client of a server on any host, over gRPC ([`reprise_wire::pb`]).
//!
//! Both implement [`ReplayClient`] and their writers [`StepWriter`], with the same
//! signatures, the same errors ([`reprise_wire::codes`]) and one partial-result type,
//! [`Drawn`]. An operation is added to the trait, then to each transport.

pub mod local;
pub mod remote;

use std::time::Duration;

use reprise_core::error::{Error, Result};
use reprise_core::{Signature, TableInfo, Wait};

pub use local::{LocalClient, LocalSample, LocalWriter};
pub use remote::{RemoteClient, RemoteOptions, RemoteSample, RemoteSampler, RemoteWriter};
pub use reprise_wire::pb;

/// Checked while a call waits (every [`POLL`]): true gives up with
/// `Error::Interrupted` (Ctrl-C in Python).
pub type Interrupt<'a> = Option<&'a (dyn Fn() -> bool + Sync)>;

/// How often a waiting call checks its [`Interrupt`].
pub const POLL: Duration = reprise_core::wait::Wait::POLL;

/// What a client call that has waited past `reprise_core::wait::slow_wait` says,
/// from the server's own figures (`infos`, asked for once): for a sample of `want`
/// from `table`, what that table's rate limiter needs; for a flush (`table` None),
/// each table whose rate limiter blocks inserts now.
pub(crate) fn explain_wait(what: &str, server: &str, waited: Duration, infos: &[TableInfo], table: Option<&str>, want: u64) -> String {
    use reprise_core::rate_limiter::RateLimiter;
    let limiter = |info: &TableInfo| {
        let mut r = RateLimiter::new(info.rate_limiter);
        (r.inserts, r.samples) = (info.limiter_inserts, info.limiter_samples);
        r
    };
    let head = format!("{what} has waited {:.1} s for the replay server at {server}", waited.as_secs_f64());
    let reasons: Vec<String> = match table {
        Some(t) => infos.iter().filter(|i| i.name == t).map(|i| format!("table '{t}': {}", limiter(i).explain(false, i.size, want))).collect(),
        None => infos
            .iter()
            .filter(|i| !limiter(i).can_insert(1, i.size))
            .map(|i| format!("table '{}': {}", i.name, limiter(i).explain(true, i.size, 1)))
            .collect(),
    };
    if reasons.is_empty() {
        format!("{head}; no table's rate limiter blocks it now (the server may be busy, or its store full)")
    } else {
        format!("{head}; {}", reasons.join("; "))
    }
}

/// What a draw returns: the items drawn, and the error that stopped it before `n`
/// (`Error::Timeout` or `Error::Interrupted`) when one did. A cut-short draw keeps
/// what it took from the table (a queue's items are not lost).
pub struct Drawn<S> {
    pub sample: S,
    pub cut_short: Option<Error>,
}

/// One connection to a replay server, whichever transport carries it. Thread-safe:
/// calls from several threads share the connection; each writer has its own.
pub trait ReplayClient: Send + Sync {
    type Writer: StepWriter;
    type Sample: Send;
    type Sampler: Sampler<Sample = Self::Sample>;

    /// The tables the server serves, in its order.
    fn table_names(&self) -> Vec<String>;

    /// The signature of the store that `table` lives in.
    fn signature(&self, table: &str) -> Result<Signature>;

    /// A writer, on its own connection or stream, into the store of `table`
    /// (default: the first table's). Items may go to any table over that store.
    fn writer(&self, table: Option<&str>, max_sequence_length: Option<u64>) -> Result<Self::Writer>;

    /// Draws `n` items from `table`, with the fields in `fields` (empty: all),
    /// waiting up to `timeout` for the rate limiter.
    fn sample(&self, table: &str, n: u32, fields: &[String], timeout: Option<Duration>, interrupt: Interrupt<'_>) -> Result<Drawn<Self::Sample>>;

    /// Draws whole items (whole groups) from `table` until the next would pass
    /// `tokens` steps (`Table::sample_tokens`), waiting only for the first.
    fn sample_tokens(&self, table: &str, tokens: u64, fields: &[String], timeout: Option<Duration>, interrupt: Interrupt<'_>) -> Result<Drawn<Self::Sample>>;

    /// Sets `table`'s policy version; returns how many items left as stale.
    fn set_version(&self, table: &str, version: i64) -> Result<u64>;

    /// Sets attribute `name` of the items `keys` from `values` (one value per key,
    /// little-endian); keys no longer present are skipped. Returns how many were updated.
    fn update_attribute(&self, table: &str, keys: &[u64], name: &str, values: &[u8]) -> Result<u64>;

    /// Draws batches of `n` one after another, up to `max_in_flight` requested ahead
    /// where the transport can pipeline them.
    fn sampler(&self, table: &str, n: u32, fields: &[String], timeout: Option<Duration>, max_in_flight: u32) -> Result<Self::Sampler>;

    /// Sets priorities by key; keys no longer present are skipped. Returns how many applied.
    fn update_priorities(&self, table: &str, keys: &[u64], priorities: &[f64]) -> Result<u64>;

    /// Removes items by key; keys no longer present are skipped. Returns how many.
    fn delete(&self, table: &str, keys: &[u64]) -> Result<u64>;

    /// Removes every item of `table`.
    fn reset(&self, table: &str) -> Result<()>;

    /// Every table's counters, in the server's order.
    fn info(&self) -> Result<Vec<TableInfo>>;

    /// What the server is doing, as JSON text: tables with their counters and
    /// extension statistics, connected clients, bytes (`docs/observability.md`).
    fn snapshot(&self) -> Result<String>;

    /// Asks the server to write a checkpoint into its checkpoint directory; returns its path.
    fn checkpoint(&self) -> Result<String>;

    /// Closes this client's connection. Writers keep theirs; samples taken stay valid.
    fn close(&self);
}

/// Appends steps and creates items over recent steps, committing in batches.
/// `create_item(s)` queue; [`StepWriter::flush`] returns once every queued item is
/// in its table. A writer that is dropped or whose client dies commits nothing
/// partial: an item is in its table whole or not at all.
///
/// Every call that may wait for the server takes a [`Wait`]: it gives up at its
/// deadline with `Error::Timeout` and, when its interrupt check fires (checked
/// every [`POLL`]), with `Error::Interrupted`. A call that gives up that way
/// before it sent anything changed nothing and the writer goes on; one that gave up
/// with a request on the wire closes the writer (its reply would confuse the next
/// call), and its later calls say so. [`StepWriter::abort`] never waits.
pub trait StepWriter: Send {
    /// Appends one step: `columns[i]` holds one row of field i.
    fn append(&mut self, columns: &[&[u8]], wait: Wait<'_>) -> Result<()> {
        self.extend(columns, 1, wait)
    }

    /// Appends `steps` steps: `columns[i]` holds `steps` rows of field i.
    fn extend(&mut self, columns: &[&[u8]], steps: usize, wait: Wait<'_>) -> Result<()>;

    /// Whether appending `steps` steps may wait for the server (for a new block, or
    /// for room to send), so a caller holding a lock others need (Python's GIL)
    /// lets go of it first.
    fn may_wait(&self, steps: usize) -> bool;

    /// Whether queueing `items` more items (or ending the episode, `items` 0) may
    /// wait for the server (for replies to earlier commits, or for room to send).
    fn items_may_wait(&self, items: usize) -> bool;

    /// Queues an item over the last `num_steps` steps for `table`, with attribute
    /// record `record` (empty for a table without attributes; checked by the server).
    fn create_item(&mut self, table: &str, num_steps: u64, priority: f64, record: &[u8], wait: Wait<'_>) -> Result<()>;

    /// Queues one item per priority over `num_steps` steps ending at each of the last
    /// `priorities.len()` steps, oldest first (one item per step of an `extend`), with
    /// attribute records `records` end to end.
    fn create_items(&mut self, table: &str, num_steps: u64, priorities: &[f64], records: &[u8], wait: Wait<'_>) -> Result<()>;

    /// Ends the episode: items never span episodes.
    fn end_episode(&mut self, wait: Wait<'_>) -> Result<()>;

    /// Steps appended since the episode began.
    fn episode_steps(&self) -> u64;

    /// Sends what is queued and waits until the server has put every item in its
    /// table; returns the keys of the items committed since the last flush. A flush
    /// that times out leaves the writer usable (flush again to keep waiting); an
    /// interrupted one closes it, and the server drops what it had not committed.
    fn flush(&mut self, wait: Wait<'_>) -> Result<Vec<u64>>;

    /// Flushes, ends the episode and gives back the writer's blocks. Idempotent. A
    /// close whose flush gives up (timeout or interrupt) aborts: the writer is closed
    /// either way, and what was not committed is dropped.
    fn close(&mut self, wait: Wait<'_>) -> Result<()>;

    /// Closes at once without waiting for anything: items not yet committed are
    /// dropped (the server stops waiting for them when the connection goes), items
    /// already committed stay, the writer's blocks return to the store. Idempotent.
    fn abort(&mut self);
}

/// Batches drawn one after another with the same arguments.
pub trait Sampler: Send {
    type Sample;

    /// The next batch. Batches already requested were drawn before any priority
    /// update made after their request.
    fn next(&mut self, interrupt: Interrupt<'_>) -> Result<Drawn<Self::Sample>>;
}

/// The sample size `n`, checked against the most either transport carries.
fn check_sample_size(n: u32, max: u32) -> Result<()> {
    if n == 0 || n > max {
        return Err(Error::InvalidArgument(format!("sample size must be between 1 and {max}, got {n}")));
    }
    Ok(())
}

/// Checks that `keys` and `priorities` pair up.
fn check_priority_pairs(keys: &[u64], priorities: &[f64]) -> Result<()> {
    if keys.len() != priorities.len() {
        return Err(Error::InvalidArgument(format!("{} keys but {} priorities; expected one per key", keys.len(), priorities.len())));
    }
    Ok(())
}

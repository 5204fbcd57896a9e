//! Writers: append steps into blocks they lease, create items over the most recent
//! steps of the current episode for any tables over the same store.
//!
//! A writer keeps the rows of its current episode (or, with
//! `max_sequence_length`, of its last that many steps) referenced in `history`,
//! one reference per run of rows in one block, so that items created later can
//! still point at them. Items never span episodes. Data is copied into the store
//! without any table lock; only `create_item` takes the table's lock, briefly.
//!
//! Without `max_sequence_length` the history is still bounded: once the store has
//! been found full (every block held by something that cannot be evicted; see
//! [`Store::pressure`]), a writer keeps only as many steps as its longest item so
//! far needed, until its episode ends. A writer that runs out of blocks itself lets
//! go of the rest of its history that way and tries once more. So a writer that
//! never ends its episode (a continuing task) cannot fill the store with history
//! no item can use, while one that creates whole-episode items keeps its episode as
//! long as there is room.
//!
//! # Stacked fields
//! A field with `stack` k > 1 (see [`crate::Field::stacked`]) samples each step as the
//! last k frames of its episode, read as the step's row and the k - 1 rows before
//! it in the same block ([`crate::Columns::read_ranges`]). The writer keeps that true
//! for every step it appends: with `lead` = the largest stack less one, an episode
//! starts with `lead` padding rows (copies of its first step, or zeros for a field
//! padded with zeros), and each block the episode continues in starts with copies
//! of the episode's last `lead` rows (the writer keeps them). Items reference the
//! steps only; they keep their frames alive through the blocks they already hold.
//! Padding and copies take `lead` rows per episode and per block: block_steps
//! several times the stack keeps that small. Every column gets those rows (other
//! fields' copies are never read), so a block's rows are all written, as a
//! compressed column's counts need.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::blocks::{BlockSource, Cursor, Run};
use crate::error::{Error, Partial, Result};
use crate::invalid;
use crate::item::{NewItem, RowRange, Window};
use crate::store::Store;
use crate::table::Table;
use crate::wait::Wait;

/// A writer over blocks from `B`: the store itself in process (the default), or
/// the store's owner for local clients (see the client crate).
pub struct Writer<B: BlockSource = Store> {
    source: B,
    cursor: Cursor,
    history: VecDeque<Run>,
    /// Steps in `history`.
    kept: u64,
    episode_steps: u64,
    max_sequence_length: Option<u64>,
    /// The most steps an item created by this writer has needed (`need` of `check_window`).
    longest: AtomicU64,
    /// Keeping only `longest` steps until the episode ends (the store was found full).
    bounded: bool,
    /// The source's pressure count when last looked at.
    pressure_seen: u64,
    /// Rows before a stacked field's steps (the signature's `lead`; 0: none).
    lead: u32,
    /// The episode's padding is written (its rows are a stream the next block
    /// continues with copies).
    streaming: bool,
    /// Per column, the episode's last `lead` rows written, oldest first (set by the
    /// first write of an episode; read only while `streaming`).
    recent: Vec<Vec<u8>>,
}

impl<B: BlockSource> Writer<B> {
    pub fn new(source: B, max_sequence_length: Option<u64>) -> Result<Writer<B>> {
        if max_sequence_length == Some(0) {
            return Err(invalid!("max_sequence_length must be >= 1 or None, got 0"));
        }
        let pressure_seen = source.pressure();
        let lead = source.columns().signature().lead();
        Ok(Writer {
            source,
            cursor: Cursor::default(),
            history: VecDeque::new(),
            kept: 0,
            episode_steps: 0,
            max_sequence_length,
            longest: AtomicU64::new(0),
            bounded: false,
            pressure_seen,
            lead,
            streaming: false,
            recent: Vec::new(),
        })
    }

    pub fn source(&self) -> &B {
        &self.source
    }

    pub fn source_mut(&mut self) -> &mut B {
        &mut self.source
    }

    /// Steps appended since the episode began.
    pub fn episode_steps(&self) -> u64 {
        self.episode_steps
    }

    /// Whether appending `steps` steps leases a block (the one thing an append
    /// may wait for).
    pub fn needs_block(&self, steps: usize) -> bool {
        steps as u64 + self.lead as u64 > self.cursor.room(self.source.columns().block_steps()) as u64
    }

    fn check_columns(&self, columns: &[&[u8]], steps: usize) -> Result<()> {
        let fields = self.source.columns().signature().fields();
        if columns.len() != fields.len() {
            return Err(invalid!("expected {} columns, got {}", fields.len(), columns.len()));
        }
        for (f, c) in fields.iter().zip(columns) {
            if c.len() != f.row_bytes() * steps {
                return Err(invalid!(
                    "field '{}' expects {} bytes for {steps} steps of {}, got {}",
                    f.name,
                    f.row_bytes() * steps,
                    f.describe(),
                    c.len()
                ));
            }
        }
        Ok(())
    }

    /// Appends one step: one row per field, in signature order. A step that needs
    /// a new block waits for it within `wait` (see [`BlockSource::lease`]); a wait
    /// that times out or is interrupted appends nothing.
    pub fn append<'w>(&mut self, columns: &[&[u8]], wait: impl Into<Wait<'w>>) -> Result<()> {
        self.check_columns(columns, 1)?;
        let wait = wait.into();
        let deadline = wait.deadline();
        match self.append_checked(columns, wait) {
            Err(Error::ResourceExhausted(_)) if self.relieve() => self.append_checked(columns, wait.until(deadline)).map_err(|e| self.explain(e)),
            r => r.map_err(|e| self.explain(e)),
        }
    }

    fn append_checked(&mut self, columns: &[&[u8]], wait: Wait<'_>) -> Result<()> {
        if self.lead > 0 {
            return self.extend_checked(columns, 1, wait);
        }
        let run = self.cursor.take(&mut self.source, 1, wait)?;
        for (col, src) in columns.iter().enumerate() {
            // SAFETY: `run` was just taken by this writer's cursor from a block its
            // source leased to it (`BlockSource`'s contract); no item covers it yet.
            unsafe { self.source.columns().write_rows(col, run.start, src) };
        }
        self.record(run, false);
        Ok(())
    }

    /// Appends `steps` steps; column `c` holds `steps` rows back to back. Either
    /// every step is appended or (when the store is full, or a wait for a block
    /// within `wait` ends early) none is.
    pub fn extend<'w>(&mut self, columns: &[&[u8]], steps: usize, wait: impl Into<Wait<'w>>) -> Result<()> {
        if steps == 0 {
            return Ok(());
        }
        self.check_columns(columns, steps)?;
        let wait = wait.into();
        let deadline = wait.deadline();
        match self.extend_checked(columns, steps, wait) {
            Err(Error::ResourceExhausted(_)) if self.relieve() => {
                self.extend_checked(columns, steps, wait.until(deadline)).map_err(|e| self.explain(e))
            }
            r => r.map_err(|e| self.explain(e)),
        }
    }

    /// When the store is full and this writer keeps its whole episode by default:
    /// keeps only what its items have needed from now on in this episode. True when
    /// that let any steps go (worth trying again).
    fn relieve(&mut self) -> bool {
        if self.max_sequence_length.is_some() {
            return false;
        }
        self.bounded = true;
        let before = self.kept;
        self.trim(self.longest.load(Ordering::Relaxed));
        self.kept < before
    }

    /// A full store's error, with what this writer holds.
    fn explain(&self, e: Error) -> Error {
        match e {
            Error::ResourceExhausted(m) if self.kept > 0 => Error::ResourceExhausted(format!(
                "{m}. This writer holds {} steps of its episode ({} blocks){}",
                self.kept,
                self.history.len(),
                match self.max_sequence_length {
                    Some(n) => format!(" (its max_sequence_length is {n})"),
                    None => " (its longest item so far needed that many)".into(),
                }
            )),
            e => e,
        }
    }

    fn extend_checked(&mut self, columns: &[&[u8]], steps: usize, wait: Wait<'_>) -> Result<()> {
        if self.lead > 0 {
            return self.extend_stacked(columns, steps, wait);
        }
        let deadline = wait.deadline();
        let mut runs: Vec<Run> = Vec::new();
        let mut left = steps as u64;
        while left > 0 {
            match self.cursor.take(&mut self.source, left.min(u32::MAX as u64) as u32, wait.until(deadline)) {
                Ok(run) => {
                    // Hold the block before the next take may let the cursor drop it.
                    self.source.retain(run.block);
                    left -= run.len as u64;
                    runs.push(run);
                }
                Err(e) => {
                    runs.iter().for_each(|r| self.source.release(r.block));
                    return Err(e);
                }
            }
        }
        let cols = self.source.columns();
        for (col, src) in columns.iter().enumerate() {
            let row_bytes = cols.row_bytes(col);
            let mut at = 0;
            for run in &runs {
                let bytes = run.len as usize * row_bytes;
                // SAFETY: each run was taken by this writer's cursor from a block
                // leased to it and is retained above; no item covers it yet.
                unsafe { cols.write_rows(col, run.start, &src[at..at + bytes]) };
                at += bytes;
            }
        }
        for run in runs {
            self.record(run, true);
        }
        Ok(())
    }

    /// [`Writer::extend`] for a store with stacked fields (see the module doc):
    /// the episode's padding first if it starts here, and in each block taken
    /// anew copies of the `lead` rows before it. Takes every run before writing, so
    /// a full store appends nothing.
    #[inline(never)]
    fn extend_stacked(&mut self, columns: &[&[u8]], steps: usize, wait: Wait<'_>) -> Result<()> {
        let deadline = wait.deadline();
        let lead = self.lead as u64;
        let bs = self.source.columns().block_steps();
        // The rows of this call as a stream: `pad` padding rows, then the steps.
        let pad = if self.streaming { 0 } else { lead };
        let total = pad + steps as u64;
        let mut started = self.streaming;
        let mut runs: Vec<(Run, u64)> = Vec::new(); // (run, copies at its start)
        let mut left = total;
        while left > 0 {
            let copies = if started && self.cursor.room(bs) == 0 { lead } else { 0 };
            match self.cursor.take(&mut self.source, (left + copies).min(u32::MAX as u64) as u32, wait.until(deadline)) {
                Ok(run) => {
                    // Hold the block before the next take may let the cursor drop it.
                    self.source.retain(run.block);
                    // A fresh block holds more than `lead` rows (`layout` checks), so
                    // every run carries some of the stream.
                    left -= run.len as u64 - copies;
                    runs.push((run, copies));
                    started = true;
                }
                Err(e) => {
                    runs.iter().for_each(|(r, _)| self.source.release(r.block));
                    return Err(e);
                }
            }
        }
        let cols = self.source.columns();
        let zero: Vec<Vec<u8>> = cols
            .signature()
            .fields()
            .iter()
            .map(|f| if pad > 0 && f.padding == crate::StackPadding::Zero && f.stack > 1 { vec![0; f.row_bytes()] } else { Vec::new() })
            .collect();
        // Row `pos` of the stream for column `col` (negative: the episode's rows
        // before this call, kept in `recent`; before the episode's start: padding).
        let row_of = |col: usize, pos: i64| -> &[u8] {
            let rb = cols.row_bytes(col);
            if pos < 0 && pad == 0 {
                let i = (lead as i64 + pos) as usize;
                &self.recent[col][i * rb..(i + 1) * rb]
            } else if pos < pad as i64 {
                if zero[col].is_empty() { &columns[col][..rb] } else { &zero[col] }
            } else {
                let i = (pos - pad as i64) as usize;
                &columns[col][i * rb..(i + 1) * rb]
            }
        };
        let mut pos = 0i64; // the next stream row to write
        let mut steps_of: Vec<Run> = Vec::with_capacity(runs.len());
        for &(run, copies) in &runs {
            let stream = run.len as u64 - copies;
            for (col, data) in columns.iter().enumerate() {
                let write = |row: u64, src: &[u8]| {
                    // SAFETY: the run was taken by this writer's cursor from a block
                    // leased to it and is retained above; no item covers it yet.
                    unsafe { cols.write_rows(col, row, src) }
                };
                for j in 0..copies {
                    write(run.start + j, row_of(col, pos - lead as i64 + j as i64));
                }
                let (a, b) = (pos, pos + stream as i64);
                for p in a..b.min(pad as i64) {
                    write(run.start + copies + (p - a) as u64, row_of(col, p));
                }
                let first = a.max(pad as i64);
                if first < b {
                    let rb = cols.row_bytes(col);
                    let i = (first - pad as i64) as usize;
                    write(run.start + copies + (first - a) as u64, &data[i * rb..(b - pad as i64) as usize * rb]);
                }
            }
            let first = pos.max(pad as i64);
            let end = pos + stream as i64;
            if first < end {
                let start = run.start + copies + (first - pos) as u64;
                steps_of.push(Run { block: run.block, start, len: (end - first) as u32 });
            } else {
                steps_of.push(Run { block: run.block, start: run.start, len: 0 });
            }
            pos = end;
        }
        // The episode's last `lead` rows, for the next block's copies.
        let recent: Vec<Vec<u8>> = (0..columns.len())
            .map(|col| (total as i64 - lead as i64..total as i64).flat_map(|p| row_of(col, p).iter().copied()).collect())
            .collect();
        self.recent = recent;
        self.streaming = true;
        for run in steps_of {
            if run.len == 0 {
                self.source.release(run.block);
            } else {
                self.record(run, true);
            }
        }
        Ok(())
    }

    /// Adds a written run to the episode history. `held` says whether the caller
    /// already holds a reference on the run's block for the history to take over.
    fn record(&mut self, run: Run, held: bool) {
        match self.history.back_mut() {
            Some(last) if last.block == run.block && last.start + last.len as u64 == run.start => {
                last.len += run.len;
                if held {
                    self.source.release(run.block);
                }
            }
            _ => {
                if !held {
                    self.source.retain(run.block);
                }
                self.history.push_back(run);
            }
        }
        self.kept += run.len as u64;
        self.episode_steps += run.len as u64;
        match self.max_sequence_length {
            Some(max) => self.trim(max),
            None => {
                let pressure = self.source.pressure();
                if pressure != self.pressure_seen {
                    self.pressure_seen = pressure;
                    self.bounded = true;
                }
                if self.bounded {
                    self.trim(self.longest.load(Ordering::Relaxed));
                }
            }
        }
    }

    /// Drops history beyond the last `max` steps.
    fn trim(&mut self, max: u64) {
        while self.kept > max {
            let excess = self.kept - max;
            let front = self.history.front_mut().expect("kept > 0 implies history");
            if front.len as u64 <= excess {
                self.kept -= front.len as u64;
                let block = front.block;
                self.history.pop_front();
                self.source.release(block);
            } else {
                front.start += excess;
                front.len -= excess as u32;
                self.kept -= excess;
            }
        }
    }

    /// The rows of the last `num_steps` steps of this episode, oldest first, for
    /// an item in `table`. Fails when the episode (or the kept history) is shorter.
    pub fn window(&self, table: &str, num_steps: u64) -> Result<Window> {
        self.check_window(table, num_steps, 0)?;
        Ok(self.window_back(num_steps, 0))
    }

    /// Windows for `count` items of `num_steps` steps ending at each of the last
    /// `count` steps, oldest first (one item per step of an `extend`).
    pub fn windows(&self, table: &str, num_steps: u64, count: u64) -> Result<Vec<Window>> {
        if count == 0 {
            return Ok(Vec::new());
        }
        self.check_window(table, num_steps, count - 1)?;
        let tail = self.tail(num_steps + count - 1);
        Ok((0..count).map(|j| tail.window(j, num_steps)).collect())
    }

    /// Checks that `num_steps` steps ending `back` steps before the newest exist.
    fn check_window(&self, table: &str, num_steps: u64, back: u64) -> Result<()> {
        if num_steps == 0 {
            return Err(invalid!("num_steps must be >= 1, got 0"));
        }
        let need = num_steps + back;
        let what = || {
            if back == 0 {
                format!("item of {num_steps} steps for table '{table}'")
            } else {
                format!("{} items of {num_steps} steps for table '{table}' (one per step)", back + 1)
            }
        };
        if need > self.episode_steps {
            return Err(invalid!("{} need {need} steps: longer than the episode so far ({} steps)", what(), self.episode_steps));
        }
        if need > self.kept {
            return Err(match self.max_sequence_length {
                Some(max) => invalid!("{} need {need} steps: more than the writer's max_sequence_length ({max})", what()),
                None => invalid!(
                    "{} need {need} steps, but the writer keeps only the last {}: when the store filled, it let go of \
                     steps older than its longest item so far; pass max_sequence_length={need} (the longest item you \
                     create) to writer() to keep them, or give the store more capacity",
                    what(),
                    self.kept
                ),
            });
        }
        self.longest.fetch_max(need, Ordering::Relaxed);
        Ok(())
    }

    /// The rows of the last `num_steps` steps appended (for stores whose step data
    /// lives elsewhere, such as GPU memory: the caller writes those rows itself).
    pub fn recent_rows(&self, num_steps: u64) -> Result<Window> {
        if num_steps == 0 || num_steps > self.kept {
            return Err(invalid!("asked for the rows of the last {num_steps} steps; the writer holds {}", self.kept));
        }
        Ok(self.window_back(num_steps, 0))
    }

    /// The rows of the last `steps` steps (at most what the writer keeps), oldest
    /// first, for windows cut out of them: one pass over the history, so that `n`
    /// windows cost O(n log runs), not O(n x history).
    fn tail(&self, steps: u64) -> Tail {
        let mut runs: Vec<RowRange> = Vec::new();
        let mut left = steps;
        for run in self.history.iter().rev() {
            if left == 0 {
                break;
            }
            let take = left.min(run.len as u64);
            runs.push(RowRange { start: run.start + run.len as u64 - take, len: take as u32 });
            left -= take;
        }
        runs.reverse();
        let mut starts = Vec::with_capacity(runs.len());
        let mut at = 0;
        for r in &runs {
            starts.push(at);
            at += r.len as u64;
        }
        Tail { runs, starts }
    }

    /// The rows of `num_steps` steps ending `back` steps before the newest.
    fn window_back(&self, num_steps: u64, back: u64) -> Window {
        let mut ranges: Vec<RowRange> = Vec::new();
        let mut skip = back;
        let mut left = num_steps;
        for run in self.history.iter().rev() {
            if left == 0 {
                break;
            }
            if skip >= run.len as u64 {
                skip -= run.len as u64;
                continue;
            }
            let avail = run.len as u64 - skip;
            let take = left.min(avail);
            let start = run.start + avail - take;
            skip = 0;
            match ranges.last_mut() {
                Some(next) if start + take == next.start => {
                    next.start = start;
                    next.len += take as u32;
                }
                _ => ranges.push(RowRange { start, len: take as u32 }),
            }
            left -= take;
        }
        ranges.reverse();
        Window::from_ranges(ranges)
    }

    /// Ends the episode: later items cannot reach back past this point, and the
    /// writer lets go of the episode's rows (items keep what they reference).
    pub fn end_episode(&mut self) {
        for run in std::mem::take(&mut self.history) {
            self.source.release(run.block);
        }
        self.kept = 0;
        self.episode_steps = 0;
        self.bounded = false;
        self.streaming = false;
    }

    /// Ends the episode and gives up the current block.
    pub fn close(&mut self) {
        self.end_episode();
        self.cursor.close(&mut self.source);
    }
}

impl Writer<Store> {
    pub fn store(&self) -> &Store {
        &self.source
    }

    /// Creates an item over the last `num_steps` steps of this episode in `table`,
    /// with attribute record `record` (empty without attributes), waiting for the
    /// table's rate limiter up to `timeout`. Returns its key ([`crate::table::DROPPED`]
    /// when the table dropped it as stale).
    pub fn create_item<'w>(&mut self, table: &Table, num_steps: u64, priority: f64, record: &[u8], wait: impl Into<Wait<'w>>) -> Result<u64> {
        if !table.store().same(&self.source) {
            return Err(invalid!("table '{}' is over a different store than this writer", table.name()));
        }
        let window = self.window(table.name(), num_steps)?;
        table.check_priority(priority, || format!("table '{}' new item", table.name()))?;
        table.check_records(1, record)?;
        // The window lies in this writer's rows; the priority and record are checked.
        let item = NewItem { window, priority };
        match table.insert_checked(std::slice::from_ref(&item), record, wait.into()) {
            Ok(keys) => Ok(keys[0]),
            Err(Error::Timeout { message, .. }) => Err(Error::Timeout { message, partial: Partial::Nothing }),
            Err(Error::Interrupted { .. }) => Err(Error::Interrupted { partial: Partial::Nothing }),
            Err(e) => Err(e),
        }
    }

    /// Creates one item per priority: item `j` of `n` covers `num_steps` steps
    /// ending `n - 1 - j` steps before the newest (one item per step of an
    /// `extend`), in one insert, with attribute records `records` end to end.
    /// Returns their keys.
    pub fn create_items<'w>(&mut self, table: &Table, num_steps: u64, priorities: &[f64], records: &[u8], wait: impl Into<Wait<'w>>) -> Result<Vec<u64>> {
        if !table.store().same(&self.source) {
            return Err(invalid!("table '{}' is over a different store than this writer", table.name()));
        }
        let windows = self.windows(table.name(), num_steps, priorities.len() as u64)?;
        table.check_priorities(priorities, |i| format!("table '{}' item {i}", table.name()))?;
        table.check_records(priorities.len(), records)?;
        let items: Vec<NewItem> = windows.into_iter().zip(priorities).map(|(window, &priority)| NewItem { window, priority }).collect();
        table.insert_checked(&items, records, wait.into())
    }

    /// Creates one item per priority: `n` items of `num_steps` steps that tile the
    /// last `n * num_steps` steps, oldest first (a batch of `n` episodes written
    /// back to back), in one insert, with attribute records `records` end to
    /// end. Returns their keys.
    pub fn create_tiled_items<'w>(&mut self, table: &Table, num_steps: u64, priorities: &[f64], records: &[u8], wait: impl Into<Wait<'w>>) -> Result<Vec<u64>> {
        if !table.store().same(&self.source) {
            return Err(invalid!("table '{}' is over a different store than this writer", table.name()));
        }
        let n = priorities.len() as u64;
        if n == 0 {
            return Ok(Vec::new());
        }
        self.check_window(table.name(), num_steps, (n - 1) * num_steps)?;
        table.check_priorities(priorities, |i| format!("table '{}' item {i}", table.name()))?;
        table.check_records(priorities.len(), records)?;
        let tail = self.tail(n * num_steps);
        let items: Vec<NewItem> = (0..n)
            .zip(priorities)
            .map(|(j, &priority)| NewItem { window: tail.window(j * num_steps, num_steps), priority })
            .collect();
        table.insert_checked(&items, records, wait.into())
    }

    /// The table named `table` over this writer's store.
    pub fn table(&self, table: &str) -> Result<Table> {
        Table::find(&self.source, table).ok_or_else(|| {
            Error::NotFound(format!(
                "no table named '{table}' over this writer's store; tables: {:?}",
                self.source.table_names()
            ))
        })
    }
}

/// The last steps of a writer's history as runs of rows, oldest first, with the step
/// each run starts at (see [`Writer::tail`]).
struct Tail {
    runs: Vec<RowRange>,
    starts: Vec<u64>,
}

impl Tail {
    /// The rows of steps `[begin, begin + len)` of the tail, adjacent rows merged
    /// into one range (as [`Writer::window_back`] gives them).
    fn window(&self, begin: u64, len: u64) -> Window {
        let mut ranges: Vec<RowRange> = Vec::new();
        let mut i = self.starts.partition_point(|&s| s <= begin) - 1;
        let mut skip = begin - self.starts[i];
        let mut left = len;
        while left > 0 {
            let run = self.runs[i];
            let take = left.min(run.len as u64 - skip);
            let start = run.start + skip;
            match ranges.last_mut() {
                Some(prev) if prev.start + prev.len as u64 == start => prev.len += take as u32,
                _ => ranges.push(RowRange { start, len: take as u32 }),
            }
            left -= take;
            skip = 0;
            i += 1;
        }
        Window::from_ranges(ranges)
    }
}

impl<B: BlockSource> Drop for Writer<B> {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests;

//! Drawing items: the sampler's picks under the rate limiter, `max_times_sampled`,
//! and external (device) selection's candidates. A draw holds the table lock only
//! for index work; the rows of drawn items are copied later by a collector.

use parking_lot::MutexGuard;

use super::{State, Table, Woke};
use crate::error::{Error, Partial, PartialSample, Result};
use crate::extensions::ItemEvent;
use crate::invalid;
use crate::sample::{SampleBatch, SampledItem};
use crate::selectors::external::{Candidate, Change};
use crate::wait::{SlowWait, Wait};

/// Why [`Table::under_limiter`] stopped before `n` draws.
pub(crate) enum Stopped {
    TimedOut(String),
    Interrupted,
    Invalid(Error),
}

impl Table {
    /// Draws `n` items (with replacement) by the sampler, waiting for the rate
    /// limiter as needed. Each draw counts toward `max_times_sampled`; an item that
    /// reaches it leaves the table at once, so the next draw of the same batch
    /// cannot return it. When the deadline passes first, fails with `Timeout`
    /// whose partial result holds the items drawn so far.
    pub fn sample<'w>(&self, n: usize, wait: impl Into<Wait<'w>>) -> Result<SampleBatch> {
        if self.shared.config.external_selection {
            return Err(invalid!(
                "table '{}' selects items on a device (selection_device): sample it through its Python Table",
                self.name()
            ));
        }
        let batch = SampleBatch::new(self.shared.store.clone(), 0);
        self.sample_into(batch, n, wait.into()).map(|(batch, _)| batch)
    }

    /// [`Table::sample`] into a [`SampleBatch::pinned`] batch: the rows are held by
    /// one epoch, pinned before the draw, instead of a reference per block. For
    /// collectors that read the rows after this returns (a device's gather) and drop
    /// the batch once that read has ended.
    pub fn sample_pinned<'w>(&self, n: usize, wait: impl Into<Wait<'w>>) -> Result<SampleBatch> {
        if self.shared.config.external_selection {
            return self.sample(n, wait);
        }
        let batch = SampleBatch::pinned(&self.shared.store);
        self.sample_into(batch, n, wait.into()).map(|(batch, _)| batch)
    }

    /// External selection: draws up to `n` items in total into `batch` (which may
    /// hold draws of earlier calls; None: a fresh [`SampleBatch::pinned`] batch) from `candidates`, waiting for the rate limiter
    /// as [`Table::sample`] does. Returns the batch and whether the candidates ran
    /// out first (then the caller synchronises its mirror, picks again and calls
    /// again with the same batch).
    pub fn sample_candidates<'w>(
        &self,
        batch: Option<SampleBatch>,
        n: usize,
        wait: impl Into<Wait<'w>>,
        candidates: &[Candidate],
    ) -> Result<(SampleBatch, bool)> {
        let sh = &*self.shared;
        if !sh.config.external_selection {
            return Err(invalid!("table '{}' selects on the host; candidates are only for external selection", self.name()));
        }
        let batch = batch.unwrap_or_else(|| SampleBatch::pinned(&sh.store));
        if !batch.store().same(&sh.store) {
            return Err(invalid!("table '{}': the sample being extended comes from another store", self.name()));
        }
        {
            let mut st = sh.state.lock();
            st.sampler.external().expect("external selection keeps an external sampler").set_candidates(candidates.iter().copied());
        }
        self.sample_into(batch, n, wait.into())
    }

    /// The slots whose items changed since the last call (external selection).
    pub fn drain_changes(&self) -> Result<Vec<Change>> {
        let mut st = self.shared.state.lock();
        match st.sampler.external() {
            Some(ext) => Ok(ext.drain_changes()),
            None => Err(invalid!("table '{}' selects on the host; it has no external changes", self.name())),
        }
    }

    fn sample_into(&self, mut batch: SampleBatch, n: usize, wait: Wait<'_>) -> Result<(SampleBatch, bool)> {
        let sh = &*self.shared;
        let mut st = sh.state.lock();
        let done = batch.len();
        let taken = self.under_limiter(&mut st, n, done, &wait, |table, st, permits| {
            if batch.is_empty() {
                batch.table_size = st.size;
            }
            let before = batch.len();
            let starved = table.draw(st, permits, &mut batch);
            (batch.len() - before, starved)
        });
        match taken {
            Ok((_, starved)) => Ok((batch, starved)),
            Err(Stopped::Interrupted) => Err(Error::Interrupted { partial: Partial::Sampled(PartialSample::new(batch)) }),
            Err(Stopped::TimedOut(message)) => Err(Error::Timeout { message, partial: Partial::Sampled(PartialSample::new(batch)) }),
            Err(Stopped::Invalid(e)) => Err(e),
        }
    }

    /// Hands out the rate limiter's sample permits until `n` draws are done
    /// (`done` of them already), waiting for it as needed. `take(table, state,
    /// permits)` uses up to `permits` and returns how many it used and whether
    /// it ran out of candidates (which ends the call). Returns `(done, starved)`.
    pub(crate) fn under_limiter(
        &self,
        st: &mut MutexGuard<'_, State>,
        n: usize,
        mut done: usize,
        wait: &Wait<'_>,
        mut take: impl FnMut(&Table, &mut MutexGuard<'_, State>, usize) -> (usize, bool),
    ) -> std::result::Result<(usize, bool), Stopped> {
        let sh = &*self.shared;
        if n == 0 {
            return Err(Stopped::Invalid(invalid!("table '{}': sample size must be >= 1, got 0", self.name())));
        }
        let deadline = wait.deadline();
        let mut slow = SlowWait::lazy();
        while done < n {
            let permits = if st.size == 0 { 0 } else { st.limiter.sample_permits((n - done) as u64, st.size) };
            if permits == 0 {
                slow.begin();
                if slow.is_due() {
                    let message = self.slow_message(st, &slow, false, (n - done) as u64, done);
                    MutexGuard::unlocked(st, || slow.say(&message));
                    continue;
                }
                match self.wait(st, &sh.sample_cv, deadline, wait, false, &slow) {
                    Woke::Interrupted => return Err(Stopped::Interrupted),
                    Woke::TimedOut => {
                        return Err(Stopped::TimedOut(format!(
                            "table '{}': {} of {} samples were possible before the {} timeout (size {}, \
                             min_size_to_sample {})",
                            self.name(),
                            done,
                            n,
                            wait.describe(),
                            st.size,
                            sh.config.rate_limiter.min_size_to_sample
                        )))
                    }
                    Woke::Again => continue,
                }
            }
            let (used, starved) = take(self, st, permits as usize);
            done += used;
            sh.insert_cv.notify_all();
            if starved {
                return Ok((done, true));
            }
        }
        Ok((done, false))
    }

    /// One draw of `slot` with `probability`: counted, added to `batch` with its
    /// attribute record, removed when it reached `max_times_sampled`. The caller
    /// flushes the extensions.
    #[inline]
    pub(crate) fn take(&self, st: &mut State, slot: u32, probability: f64, batch: &mut SampleBatch) {
        let sh = &*self.shared;
        let max_times = sh.config.max_times_sampled;
        let item = st.item(slot);
        item.times_sampled += 1;
        let sampled = SampledItem {
            key: item.key,
            probability,
            priority: item.priority,
            times_sampled: item.times_sampled,
            length: item.length,
            window: item.window.clone(),
        };
        let exhausted = max_times > 0 && item.times_sampled >= max_times;
        let event = ItemEvent { slot, seq: item.seq, priority: item.priority, times_sampled: item.times_sampled };
        let record = st.records.get(slot);
        batch.push(sampled, record);
        if let Some(v) = &mut st.versions {
            v.drawn(record);
        }
        st.limiter.samples += 1;
        st.num_samples += 1;
        st.ext.drawn(event, st.next_seq, &mut st.slots[slot as usize].window);
        if exhausted {
            st.remove(slot, &sh.store);
            st.num_evictions += 1;
        }
    }

    /// Draws whole items, by the sampler, until the next pick would take the batch
    /// past `budget` steps (that pick is put back: not counted, not sampled). It
    /// waits, as `sample` does, only for the first item; after that it stops
    /// early rather than wait, when the rate limiter allows no further draw now or
    /// the table is empty. Each pick is made as `sample(n)` makes it (with
    /// replacement, the same probabilities), so a sample of `k` items is the first
    /// `k` picks of a `sample(n)` draw; the budget only decides where it stops. A
    /// first pick longer than the whole budget fails with `InvalidArgument` and
    /// changes nothing.
    pub fn sample_tokens<'w>(&self, budget: u64, wait: impl Into<Wait<'w>>) -> Result<SampleBatch> {
        let sh = &*self.shared;
        if sh.config.external_selection {
            return Err(invalid!(
                "table '{}' selects items on a device (selection_device); a token budget needs selection on the host",
                self.name()
            ));
        }
        if budget == 0 {
            return Err(invalid!("table '{}': the token budget must be >= 1 step, got 0", self.name()));
        }
        let wait = wait.into();
        let mut batch = SampleBatch::pinned(&sh.store);
        let mut st = sh.state.lock();
        let mut refused = None;
        let taken = self.under_limiter(&mut st, 1, 0, &wait, |table, st, _| {
            batch.table_size = st.size;
            let mut left = budget;
            let mut pick = Vec::with_capacity(1);
            while st.size > 0 && st.limiter.sample_permits(1, st.size) > 0 {
                pick.clear();
                let state = &mut **st;
                state.sampler.sample(1, &mut state.rng, &mut pick);
                let Some(p) = pick.first() else { break };
                let length = st.item(p.slot).length as u64;
                if length > left {
                    if batch.is_empty() {
                        refused = Some(invalid!(
                            "table '{}': a drawn item has {length} steps, more than the whole token budget of {budget}; \
                             raise the budget to at least the longest item",
                            table.name()
                        ));
                    }
                    break;
                }
                let (slot, probability) = (p.slot, p.probability);
                table.take(st, slot, probability, &mut batch);
                left -= length;
            }
            st.ext.flush();
            (batch.len(), refused.is_some())
        });
        if let Some(e) = refused {
            return Err(e);
        }
        match taken {
            Ok(_) => Ok(batch),
            Err(Stopped::Interrupted) => Err(Error::Interrupted { partial: Partial::Nothing }),
            Err(Stopped::TimedOut(message)) => Err(Error::Timeout { message, partial: Partial::Nothing }),
            Err(Stopped::Invalid(e)) => Err(e),
        }
    }

    /// Draws up to `count` items (fewer when the table empties). Returns true when
    /// an external sampler's candidates ran out first.
    fn draw(&self, st: &mut MutexGuard<'_, State>, count: usize, batch: &mut SampleBatch) -> bool {
        let max_times = self.shared.config.max_times_sampled;
        let mut picks = std::mem::take(&mut st.picks);
        let mut left = count;
        while left > 0 && st.size > 0 {
            // Without max_times_sampled no draw can remove an item: one batch call.
            let chunk = if max_times == 0 { left } else { 1 };
            picks.clear();
            let state = &mut **st;
            state.sampler.sample(chunk, &mut state.rng, &mut picks);
            // Items are read in pick order with the slot a few picks ahead already
            // requested: random slots of a large table miss every cache, and a
            // bounded distance keeps enough loads in flight without overflowing
            // the core's miss buffers (prefetching a whole batch up front does).
            const AHEAD: usize = 12;
            for pick in picks.iter().take(AHEAD) {
                crate::memory::prefetch(&st.slots[pick.slot as usize]);
            }
            for (i, pick) in picks.iter().enumerate() {
                if let Some(next) = picks.get(i + AHEAD) {
                    crate::memory::prefetch(&st.slots[next.slot as usize]);
                }
                self.take(st, pick.slot, pick.probability, batch);
            }
            st.ext.flush();
            let starved = picks.len() < chunk;
            left -= picks.len();
            if starved {
                st.picks = picks;
                return true;
            }
        }
        st.picks = picks;
        false
    }
}

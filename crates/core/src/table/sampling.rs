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
        self.check_group_multiple(n)?;
        let batch = SampleBatch::new(self.shared.store.clone(), 0);
        self.sample_into(batch, n, wait.into()).map(|(batch, _)| batch)
    }

    /// With groups a sample takes whole groups: `n` must be a multiple of `group_size`.
    fn check_group_multiple(&self, n: usize) -> Result<()> {
        match self.shared.config.groups {
            Some(g) if n % g.size as usize != 0 || n == 0 => Err(invalid!(
                "table '{}' samples whole groups of {}: n must be a multiple of group_size, got {n}",
                self.name(),
                g.size
            )),
            _ => Ok(()),
        }
    }

    /// [`Table::sample`] into a [`SampleBatch::pinned`] batch: the rows are held by
    /// one epoch, pinned before the draw, instead of a reference per block. For
    /// collectors that read the rows after this returns (a device's gather) and drop
    /// the batch once that read has ended.
    pub fn sample_pinned<'w>(&self, n: usize, wait: impl Into<Wait<'w>>) -> Result<SampleBatch> {
        if self.shared.config.external_selection {
            return self.sample(n, wait);
        }
        self.check_group_multiple(n)?;
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
                batch.table_size = st.units();
            }
            if st.groups.is_some() {
                return (table.draw_groups(st, permits, &mut batch), false);
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
        // With groups a draw takes a whole group: permits come in group_size.
        let unit = st.groups.as_ref().map_or(1, |g| g.config.size as u64);
        while done < n {
            st.expire_groups(&sh.store);
            let permits = if st.size == 0 { 0 } else { st.limiter.sample_permits((n - done) as u64, st.size) };
            let permits = permits - permits % unit;
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

    /// One draw of the group led by `leader` with `probability`: every member,
    /// in order, counted and added to `batch`; the group leaves when its leader
    /// reached `max_times_sampled`. Returns the group's steps.
    pub(crate) fn take_group(&self, st: &mut State, leader: u32, probability: f64, batch: &mut SampleBatch) -> u64 {
        let sh = &*self.shared;
        let members = st.groups.as_ref().expect("a table with groups").members(leader).to_vec();
        let mut steps = 0;
        let mut leader_times = 0;
        for &m in &members {
            let (times, length) = self.count_draw(st, m, probability, batch);
            steps += length as u64;
            if m == leader {
                leader_times = times;
            }
        }
        let max_times = sh.config.max_times_sampled;
        if max_times > 0 && leader_times >= max_times {
            let gone = st.remove(leader, &sh.store);
            st.num_evictions += gone;
        }
        steps
    }

    /// Draws up to `count / group_size` groups (fewer when the table empties);
    /// returns `group_size` per group drawn (what the limiter's loop counts).
    fn draw_groups(&self, st: &mut MutexGuard<'_, State>, count: usize, batch: &mut SampleBatch) -> usize {
        let unit = st.groups.as_ref().map_or(1, |g| g.config.size as usize);
        let mut pick = Vec::with_capacity(1);
        let mut used = 0;
        while used + unit <= count && st.size > 0 {
            pick.clear();
            let state = &mut **st;
            state.sampler.sample(1, &mut state.rng, &mut pick);
            let Some(&p) = pick.first() else { break };
            self.take_group(st, p.slot, p.probability, batch);
            used += unit;
        }
        st.ext.flush();
        used
    }

    /// One draw of `slot` with `probability`: counted, added to `batch` with its
    /// attribute record, removed when it reached `max_times_sampled`. The caller
    /// flushes the extensions.
    #[inline(always)]
    pub(crate) fn take(&self, st: &mut State, slot: u32, probability: f64, batch: &mut SampleBatch) {
        let sh = &*self.shared;
        let max_times = sh.config.max_times_sampled;
        let (times, _) = self.count_draw(st, slot, probability, batch);
        if max_times > 0 && times >= max_times {
            st.remove(slot, &sh.store);
            st.num_evictions += 1;
        }
    }

    /// Counts one draw of `slot` and adds it to `batch`; returns its times
    /// sampled (this draw included) and its length.
    #[inline(always)]
    fn count_draw(&self, st: &mut State, slot: u32, probability: f64, batch: &mut SampleBatch) -> (u32, u32) {
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
        let done = (item.times_sampled, item.length);
        let event = ItemEvent { slot, seq: item.seq, priority: item.priority, times_sampled: item.times_sampled };
        let record = st.records.get(slot);
        batch.push(sampled, record);
        if let Some(v) = &mut st.versions {
            v.drawn(record);
        }
        st.limiter.samples += 1;
        st.num_samples += 1;
        st.ext.drawn(event, st.next_seq, &mut st.slots[slot as usize].window);
        done
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
        let unit = st.groups.as_ref().map_or(1, |g| g.config.size as usize);
        let taken = self.under_limiter(&mut st, unit, 0, &wait, |table, st, _| {
            batch.table_size = st.units();
            let mut left = budget;
            let mut pick = Vec::with_capacity(1);
            while st.size > 0 && st.limiter.sample_permits(unit as u64, st.size) >= unit as u64 {
                pick.clear();
                let state = &mut **st;
                state.sampler.sample(1, &mut state.rng, &mut pick);
                let Some(&p) = pick.first() else { break };
                let length = match &st.groups {
                    None => st.item(p.slot).length as u64,
                    Some(g) => g.members(p.slot).to_vec().iter().map(|&m| st.item(m).length as u64).sum(),
                };
                if length > left {
                    if batch.is_empty() {
                        let what = if unit > 1 { "group" } else { "item" };
                        refused = Some(invalid!(
                            "table '{}': a drawn {what} has {length} steps, more than the whole token budget of {budget}; \
                             raise the budget to at least the longest {what}",
                            table.name()
                        ));
                    }
                    break;
                }
                if st.groups.is_some() {
                    table.take_group(st, p.slot, p.probability, &mut batch);
                } else {
                    table.take(st, p.slot, p.probability, &mut batch);
                }
                left -= length;
            }
            st.ext.flush();
            // Anything drawn ends the call (a partial group may hold fewer than
            // `unit` items); nothing drawn means the limiter or an empty table
            // stopped it, and the loop waits for the first draw.
            if batch.is_empty() && refused.is_none() {
                (0, false)
            } else {
                (unit, true)
            }
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

//! Device-resident draws: the table admits a number of draws in bulk and hands
//! over what changed since its mirror last looked; the picks themselves, and
//! everything per item (keys, rows, probabilities, times sampled), are computed
//! on the device from that mirror (`reprise.torch.resident`). No work per drawn
//! item is done here.
//!
//! A draw is *linearised* at the moment [`Table::admit`] returns: it drains the
//! changes and pins an epoch under one lock, so the mirror after applying them
//! is the table as it was then, and no block of an item present then is reused
//! until the epoch (held by [`Admitted::rows`]) ends. Items that leave later
//! may still be drawn by this call, exactly as if they had left after it.
//!
//! The mirror counts its draws per slot; the table's `times_sampled` catches up
//! when the mirror credits them back ([`Table::credit_draws`]), which it does
//! before anything reads them (`items()`, checkpoints). Hence the conditions of
//! [`Table::resident_refusal`]: no `max_times_sampled` (a draw may remove its item),
//! a Uniform or Prioritized sampler, and no extension that looks at each draw.

use super::sampling::Stopped;
use super::{State, Table};
use crate::error::{Error, Partial, Result};
use crate::invalid;
use crate::item::Item;
use crate::sample::SampleBatch;
use crate::selectors::SelectorSpec;
use crate::wait::Wait;

/// A slot that changed: its item now (`None`: the slot is empty).
#[derive(Clone, Debug)]
pub struct ResidentChange {
    pub slot: u32,
    pub item: Option<Item>,
}

/// What [`Table::admit`] hands over.
#[derive(Debug)]
pub struct Admitted {
    /// Draws admitted by the rate limiter (< n only with `stopped`).
    pub count: usize,
    /// Items in the table at the first admitted draw.
    pub table_size: u64,
    /// Items in the table now, and how many of them have a priority > 0.
    pub size: u64,
    pub positive: u64,
    /// The items fill slots `0..size` (no slot is free): a uniform pick is a
    /// random slot below `size`.
    pub dense: bool,
    /// The shortest and longest item the table holds now (0 when empty).
    pub shortest: u32,
    pub longest: u32,
    /// Every slot that changed since the last admission, each once.
    pub changes: Vec<ResidentChange>,
    /// No items; holds the epoch pinned before the changes were drained.
    pub rows: SampleBatch,
    /// Why fewer than n draws were admitted (a timeout or an interrupt whose
    /// partial result is these `count` draws).
    pub stopped: Option<Error>,
}

impl Table {
    /// Why this table's draws cannot be made on a device from its mirror; `None`
    /// when they can.
    pub fn resident_refusal(&self) -> Option<String> {
        self.refusal(&self.shared.state.lock())
    }

    fn refusal(&self, st: &State) -> Option<String> {
        let c = &self.shared.config;
        if !c.external_selection {
            Some("it selects on the host".into())
        } else if c.max_times_sampled > 0 {
            Some(format!("max_times_sampled is {} (a draw may remove its item)", c.max_times_sampled))
        } else if !matches!(c.sampler, SelectorSpec::Uniform | SelectorSpec::Prioritized { .. }) {
            Some(format!("its sampler is {} (only Uniform and Prioritized draw on the device)", c.sampler.describe()))
        } else if st.ext.observes_each_draw() {
            Some("an extension looks at each draw (times_sampled, sampled_age, unique_samples)".into())
        } else {
            None
        }
    }

    /// Admits up to `n` draws under the rate limiter, waiting for it as
    /// [`Table::sample`] does, counts them, and hands over the changes since the
    /// last admission with an epoch that holds every present item's rows. With
    /// no draw admitted at all, a timeout or interrupt is an error; after some,
    /// it is [`Admitted::stopped`].
    ///
    /// `longest_allowed` (for draws into buffers of a fixed number of steps):
    /// while the table holds an item longer than that, nothing is admitted and
    /// the call fails without changing anything (or, when it had admitted some
    /// draws before such an item arrived while it waited, stops with them).
    pub fn admit<'w>(&self, n: usize, wait: impl Into<Wait<'w>>, longest_allowed: Option<u32>) -> Result<Admitted> {
        let wait = wait.into();
        let sh = &*self.shared;
        let mut st = sh.state.lock();
        if let Some(why) = self.refusal(&st) {
            return Err(invalid!("table '{}' cannot draw on a device from its mirror: {why}", self.name()));
        }
        let mut table_size = None;
        let mut count = 0usize;
        let mut too_long = None;
        let taken = self.under_limiter(&mut st, n, 0, &wait, |_, st, permits| {
            let (_, longest) = item_lengths(st);
            if longest_allowed.is_some_and(|most| longest > most) {
                too_long = Some(longest);
                return (0, true);
            }
            table_size.get_or_insert(st.size);
            count += permits;
            st.limiter.samples += permits as u64;
            st.num_samples += permits as u64;
            st.ext.drawn_in_bulk(permits as u64);
            st.ext.flush();
            (permits, false)
        });
        let stopped = match taken {
            Ok(_) => match too_long {
                None => None,
                Some(longest) => {
                    let e = invalid!(
                        "table '{}' holds an item of {longest} steps; draws of at most {} steps were asked for \
                         (a static sample's steps must be >= the longest item)",
                        self.name(),
                        longest_allowed.unwrap_or(0)
                    );
                    if count == 0 {
                        return Err(e);
                    }
                    Some(e)
                }
            },
            Err(Stopped::Invalid(e)) => return Err(e),
            Err(stop) => {
                let e = match stop {
                    Stopped::TimedOut(message) => Error::Timeout { message, partial: Partial::Nothing },
                    _ => Error::Interrupted { partial: Partial::Nothing },
                };
                if count == 0 {
                    return Err(e);
                }
                Some(e)
            }
        };
        // Pin before draining: a block whose last item leaves after this point
        // waits in limbo until the device has read what it drew.
        let mut rows = SampleBatch::pinned(&sh.store);
        let table_size = table_size.unwrap_or(st.size);
        rows.table_size = table_size;
        let state = &mut *st;
        let ext = state.sampler.external().expect("external selection keeps an external sampler");
        let positive = ext.positive() as u64;
        let changes = ext
            .drain_changes()
            .into_iter()
            .map(|c| ResidentChange {
                slot: c.slot,
                item: c.item.and_then(|_| state.slots[c.slot as usize].item.clone()),
            })
            .collect();
        let (shortest, longest) = item_lengths(state);
        let dense = state.free_slots.is_empty();
        Ok(Admitted { count, table_size, size: state.size, positive, dense, shortest, longest, changes, rows, stopped })
    }

    /// Adds draws made on a device to the items' `times_sampled`: `counts[i]`
    /// draws of the item with insertion sequence `seqs[i]` in slot `slots[i]`.
    /// Items that left since (their slot is empty or holds another) are skipped.
    /// Returns how many items were credited.
    pub fn credit_draws(&self, slots: &[u32], seqs: &[u64], counts: &[u32]) -> Result<usize> {
        if slots.len() != seqs.len() || slots.len() != counts.len() {
            return Err(invalid!(
                "table '{}': {} slots, {} seqs and {} counts; expected one of each per item",
                self.name(),
                slots.len(),
                seqs.len(),
                counts.len()
            ));
        }
        let mut st = self.shared.state.lock();
        let mut credited = 0;
        for ((&slot, &seq), &count) in slots.iter().zip(seqs).zip(counts) {
            let item = st.slots.get_mut(slot as usize).and_then(|s| s.item.as_mut()).filter(|i| i.seq == seq);
            if let Some(item) = item {
                item.times_sampled = item.times_sampled.saturating_add(count);
                credited += 1;
            }
        }
        Ok(credited)
    }
}

/// The steps of the shortest and the longest item of a table with external
/// selection (which counts its items' lengths); 0 when it is empty.
fn item_lengths(st: &State) -> (u32, u32) {
    let lengths = st.lengths.as_ref().expect("external selection counts lengths");
    let shortest = lengths.keys().next().copied().unwrap_or(0);
    let longest = lengths.keys().next_back().copied().unwrap_or(0);
    (shortest, longest)
}

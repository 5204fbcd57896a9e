//! A table as one shard of a cluster-mode table (`crate::cluster`): its figures
//! for a step's plan, its local best for a merge, and draws at planned targets.
//!
//! Between [`Table::freeze`] and [`Table::thaw`] inserts wait, so the figures a
//! step gathered are the state its draws resolve against (inserts become visible
//! at the next step boundary). Draws made here skip the table's own rate limiter:
//! cluster mode decides globally whether a step may sample; they still count as
//! samples in the limiter (which keeps pacing this shard's inserts).

use super::Table;
use crate::cluster::merge::Candidate;
use crate::cluster::plan::{ShardFigures, Target};
use crate::cluster::GENERATION_BITS;
use crate::sample::SampleBatch;

/// A shard's figures for one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardSummary {
    /// Units a draw picks among: items, or admitted groups (`group_size`).
    pub size: u64,
    /// The sampler's total weight (Prioritized), else the size.
    pub mass: f64,
    /// The next insertion sequence number (items below it are in this summary).
    pub next_seq: u64,
    pub num_inserts: u64,
    pub num_samples: u64,
    /// The longest item ever inserted, in steps.
    pub max_length: u32,
}

impl Table {
    /// Makes inserts wait until [`Table::thaw`].
    pub fn freeze(&self) {
        self.shared.state.lock().frozen = true;
    }

    pub fn thaw(&self) {
        self.shared.state.lock().frozen = false;
        self.shared.insert_cv.notify_all();
    }

    /// The shard's figures now; pending groups whose timeout passed are settled
    /// first, so the step's draws resolve against what the summary says.
    pub fn shard_summary(&self) -> ShardSummary {
        let mut st = self.shared.state.lock();
        st.expire_groups(&self.shared.store);
        let units = st.units();
        ShardSummary {
            size: units,
            mass: st.sampler.mass().unwrap_or(units as f64),
            next_seq: st.next_seq,
            num_inserts: st.num_inserts,
            num_samples: st.num_samples,
            max_length: st.max_length,
        }
    }

    /// The first `k` units (items, or groups by their leaders) in the sampler's
    /// order, as merge candidates whose visible step is filled in by the caller.
    /// Empty for random samplers.
    pub fn ranked(&self, k: usize) -> Vec<Candidate> {
        let st = self.shared.state.lock();
        let slots = st.sampler.ranked(k).unwrap_or_default();
        slots
            .into_iter()
            .filter_map(|slot| {
                let item = st.slots[slot as usize].item.as_ref()?;
                Some(Candidate {
                    slot,
                    seq: item.seq,
                    priority: item.priority,
                    times_sampled: item.times_sampled,
                    visible_step: 0,
                    length: unit_length(&st, slot),
                })
            })
            .collect()
    }

    /// Draws the items at `targets` (in order) for a planned global draw whose
    /// probabilities divide by `divisor` over `table_size` items (`summary`: as
    /// [`resolve`] takes it). Returns the batch and whether each row was filled:
    /// one row per target, or with `group_size` G, G rows per target, its group's
    /// members first (false where the shard ran out of units, and past a partial
    /// group's members).
    pub fn draw_planned(&self, targets: &[Target], divisor: f64, table_size: u64, summary: &ShardFigures) -> (SampleBatch, Vec<bool>) {
        let sh = &*self.shared;
        let mut batch = SampleBatch::new(sh.store.clone(), table_size);
        let mut st = sh.state.lock();
        let width = unit_width(&st);
        let mut filled = Vec::with_capacity(targets.len() * width);
        for t in targets {
            let slot = resolve(&st, t, summary);
            let Some(slot) = slot else {
                filled.extend((0..width).map(|_| false));
                continue;
            };
            let probability = match *t {
                Target::Index(_) => 1.0 / divisor,
                Target::Mass(_) => st.sampler.weight(slot) / divisor,
            };
            let taken = self.take_unit(&mut st, slot, probability, &mut batch);
            filled.extend((0..width).map(|r| r < taken));
        }
        st.ext.flush();
        sh.insert_cv.notify_all();
        (batch, filled)
    }

    /// The length in steps of the unit (item, or a group's members together) each
    /// of `targets` would draw now (0 where none would), without drawing: what a
    /// token-budget step cuts on. Equal to
    /// the lengths `draw_planned` then draws as long as no item leaves in between
    /// (the shard is frozen, and items used up by `max_times_sampled` within the
    /// batch would shift later targets, so token budgets exclude it).
    pub fn planned_lengths(&self, targets: &[Target], summary: &ShardFigures) -> Vec<u32> {
        let st = self.shared.state.lock();
        targets.iter().map(|t| resolve(&st, t, summary).map_or(0, |slot| unit_length(&st, slot))).collect()
    }

    /// Draws the merged candidates `(slot, seq)` in order (probability 1). A
    /// candidate whose unit left since is not filled; rows as `draw_planned`'s.
    pub fn draw_ranked(&self, picks: &[(u32, u64)], table_size: u64) -> (SampleBatch, Vec<bool>) {
        let sh = &*self.shared;
        let mut batch = SampleBatch::new(sh.store.clone(), table_size);
        let mut st = sh.state.lock();
        let width = unit_width(&st);
        let mut filled = Vec::with_capacity(picks.len() * width);
        for &(slot, seq) in picks {
            let live = matches!(st.slots.get(slot as usize), Some(s) if s.item.as_ref().is_some_and(|i| i.seq == seq));
            let taken = if live { self.take_unit(&mut st, slot, 1.0, &mut batch) } else { 0 };
            filled.extend((0..width).map(|r| r < taken));
        }
        st.ext.flush();
        sh.insert_cv.notify_all();
        (batch, filled)
    }

    /// Draws the unit at `slot` (an item, or the group it leads); returns how
    /// many items it added to `batch`.
    fn take_unit(&self, st: &mut super::State, slot: u32, probability: f64, batch: &mut SampleBatch) -> usize {
        let before = batch.len();
        if st.groups.is_some() {
            self.take_group(st, slot, probability, batch);
        } else {
            self.take(st, slot, probability, batch);
        }
        batch.len() - before
    }

    /// The current key of `slot` when its generation's low bits are `generation`
    /// (a global key's local part); `None` when the item is gone.
    pub fn local_key(&self, slot: u32, generation: u32) -> Option<u64> {
        let st = self.shared.state.lock();
        let s = st.slots.get(slot as usize)?;
        let item = s.item.as_ref()?;
        (s.generation & ((1 << GENERATION_BITS) - 1) == generation).then_some(item.key)
    }
}

/// The slot a planned target resolves to in the shard's selector now; `summary` is
/// the size and mass the shard reported for the step: when the shard changed since
/// (items used up by `max_times_sampled` within this batch), targets are scaled to
/// what is left.
fn resolve(st: &super::State, t: &Target, summary: &ShardFigures) -> Option<u32> {
    let units = st.units();
    match *t {
        _ if units == 0 => None,
        Target::Index(i) => {
            let i = if units == summary.size { i } else { (i as u128 * units as u128 / summary.size.max(1) as u128) as u64 };
            st.sampler.at_index(i.min(units - 1) as usize)
        }
        Target::Mass(m) => {
            let now = st.sampler.mass().unwrap_or(0.0);
            if now > 0.0 {
                st.sampler.at_mass(if now == summary.mass { m } else { m * (now / summary.mass) })
            } else {
                // Every weight left is zero: uniform over what is left.
                let i = (m / summary.mass * units as f64) as usize;
                st.sampler.at_index(i.min(units as usize - 1))
            }
        }
    }
}

/// Rows a drawn unit takes in cluster mode's exchange: `group_size`, else 1.
fn unit_width(st: &super::State) -> usize {
    st.groups.as_ref().map_or(1, |g| g.config.size as usize)
}

/// The steps of the unit at `slot`: its item's, or its group members' together.
fn unit_length(st: &super::State, slot: u32) -> u32 {
    let length = |s: u32| st.slots[s as usize].item.as_ref().map_or(0, |i| i.length);
    match &st.groups {
        Some(g) => g.members(slot).iter().map(|&m| length(m)).sum(),
        None => length(slot),
    }
}

//! External selection: the picks of a table's sampler are made elsewhere (on a
//! GPU, by `reprise.torch`) from a mirror of the table's items, and handed to the
//! table as *candidates*.
//!
//! The table keeps this selector in its sampler's place. It records which slots
//! changed (inserted, re-prioritised, removed) since the mirror last synchronised,
//! and turns candidates into picks under the table lock, so that the rate
//! limiter, `max_times_sampled` and eviction work exactly as with a host sampler:
//!
//! * a candidate is `(slot, seq, probability)`; it is valid while that slot still
//!   holds the item with insertion sequence `seq` (a removed or replaced item is
//!   skipped, never returned);
//! * [`Order::Draws`] (Uniform, Prioritized, TopK): each candidate is one draw;
//! * [`Order::Repeat`] (Fifo, Lifo, MaxHeap, MinHeap): candidates are the items in
//!   the sampler's order, and the first valid one is drawn again and again until
//!   it leaves the table, as the host selectors do.
//!
//! When the candidates run out, [`Selector::sample`] returns fewer picks than
//! asked; the table then stops and reports that it needs more.

use std::collections::VecDeque;

use super::{Pick, Rng, Selector};

/// How candidates become draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Draws,
    Repeat,
}

/// One pick made outside the table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub slot: u32,
    pub seq: u64,
    pub probability: f64,
}

/// A slot's current state, as the mirror must record it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Change {
    pub slot: u32,
    /// `None` when the slot is now empty.
    pub item: Option<(u64, f64)>,
}

pub struct External {
    order: Order,
    /// Per slot: (seq, priority) of its item.
    members: Vec<Option<(u64, f64)>>,
    len: usize,
    /// Members whose priority is > 0 (a weighted draw over none is uniform).
    positive: usize,
    dirty: Vec<u32>,
    is_dirty: Vec<bool>,
    candidates: VecDeque<Candidate>,
}

impl External {
    pub fn new(order: Order) -> External {
        External { order, members: Vec::new(), len: 0, positive: 0, dirty: Vec::new(), is_dirty: Vec::new(), candidates: VecDeque::new() }
    }

    pub fn order(&self) -> Order {
        self.order
    }

    /// How many members have a priority > 0.
    pub fn positive(&self) -> usize {
        self.positive
    }

    fn touch(&mut self, slot: u32) {
        let s = slot as usize;
        if self.is_dirty.len() <= s {
            self.is_dirty.resize(s + 1, false);
        }
        if !self.is_dirty[s] {
            self.is_dirty[s] = true;
            self.dirty.push(slot);
        }
    }

    /// The current state of every slot that changed since the last call, each
    /// slot once, in the order they first changed.
    pub fn drain_changes(&mut self) -> Vec<Change> {
        let dirty = std::mem::take(&mut self.dirty);
        dirty
            .into_iter()
            .map(|slot| {
                self.is_dirty[slot as usize] = false;
                Change { slot, item: self.members[slot as usize] }
            })
            .collect()
    }

    /// Replaces the candidates the next draws use.
    pub fn set_candidates(&mut self, candidates: impl IntoIterator<Item = Candidate>) {
        self.candidates.clear();
        self.candidates.extend(candidates);
    }

    fn valid(&self, c: &Candidate) -> bool {
        matches!(self.members.get(c.slot as usize), Some(Some((seq, _))) if *seq == c.seq)
    }
}

impl Selector for External {
    fn insert(&mut self, slot: u32, seq: u64, priority: f64) {
        let s = slot as usize;
        if self.members.len() <= s {
            self.members.resize(s + 1, None);
        }
        self.members[s] = Some((seq, priority));
        self.len += 1;
        self.positive += (priority > 0.0) as usize;
        self.touch(slot);
    }

    fn update(&mut self, slot: u32, priority: f64) {
        if let Some(Some(m)) = self.members.get_mut(slot as usize) {
            self.positive = self.positive + (priority > 0.0) as usize - (m.1 > 0.0) as usize;
            m.1 = priority;
            self.touch(slot);
        }
    }

    fn remove(&mut self, slot: u32) {
        if let Some(m) = self.members.get_mut(slot as usize) {
            if let Some((_, p)) = m.take() {
                self.len -= 1;
                self.positive -= (p > 0.0) as usize;
                self.touch(slot);
            }
        }
    }

    fn sample(&mut self, n: usize, _rng: &mut Rng, out: &mut Vec<Pick>) {
        let mut left = n;
        while left > 0 {
            let Some(c) = self.candidates.front().copied() else { return };
            if !self.valid(&c) {
                self.candidates.pop_front();
                continue;
            }
            out.push(Pick { slot: c.slot, probability: c.probability });
            left -= 1;
            if self.order == Order::Draws {
                self.candidates.pop_front();
            } else {
                // Repeat: the table removes the item when it is used up; the next
                // call then skips it. Without that, one call returns it n times.
                if n > 1 {
                    out.extend(std::iter::repeat_n(Pick { slot: c.slot, probability: c.probability }, left));
                    return;
                }
            }
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn clear(&mut self) {
        for slot in 0..self.members.len() as u32 {
            if self.members[slot as usize].take().is_some() {
                self.touch(slot);
            }
        }
        self.len = 0;
        self.positive = 0;
        self.candidates.clear();
    }

    fn external(&mut self) -> Option<&mut External> {
        Some(self)
    }
}

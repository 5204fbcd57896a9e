//! Fifo and Lifo: always the oldest (Fifo) or newest (Lifo) item, probability 1.
//! Sampling repeatedly returns the same item until it is removed, as with
//! `max_times_sampled=1` in a queue or stack.
//!
//! Insertion order is kept with O(1) amortised removal anywhere: removed slots
//! leave tombstones that are skipped at the ends and compacted away once they
//! outnumber the live entries.

use std::collections::VecDeque;

use super::{Pick, Rng, Selector};

/// Fifo (`newest_first == false`) or Lifo (`true`).
pub struct Ordered {
    order: InsertionOrder,
    newest_first: bool,
}

impl Ordered {
    pub fn fifo() -> Ordered {
        Ordered { order: InsertionOrder::default(), newest_first: false }
    }

    pub fn lifo() -> Ordered {
        Ordered { order: InsertionOrder::default(), newest_first: true }
    }
}

impl Selector for Ordered {
    fn insert(&mut self, slot: u32, seq: u64, _priority: f64) {
        self.order.insert(slot, seq);
    }
    fn update(&mut self, _slot: u32, _priority: f64) {}
    fn remove(&mut self, slot: u32) {
        self.order.remove(slot);
    }
    fn sample(&mut self, n: usize, rng: &mut Rng, out: &mut Vec<Pick>) {
        let pick = self.pick(rng);
        out.extend((0..n).map(|_| pick));
    }
    fn pick(&mut self, _rng: &mut Rng) -> Pick {
        let slot = if self.newest_first { self.order.newest() } else { self.order.oldest() };
        Pick { slot, probability: 1.0 }
    }
    fn len(&self) -> usize {
        self.order.len()
    }
    fn clear(&mut self) {
        self.order.clear();
    }
    fn ranked(&self, k: usize) -> Option<Vec<u32>> {
        Some(self.order.ranked(k, self.newest_first))
    }
}

#[derive(Default)]
pub struct InsertionOrder {
    entries: VecDeque<(u32, u64)>,
    /// Sequence number each present slot was inserted with; 0 when absent.
    stamp: Vec<u64>,
    live: usize,
}

impl InsertionOrder {
    pub fn insert(&mut self, slot: u32, seq: u64) {
        let stamp = seq + 1;
        let s = slot as usize;
        if self.stamp.len() <= s {
            self.stamp.resize(s + 1, 0);
        }
        debug_assert_eq!(self.stamp[s], 0, "slot {slot} inserted twice");
        self.stamp[s] = stamp;
        self.entries.push_back((slot, stamp));
        self.live += 1;
    }

    pub fn remove(&mut self, slot: u32) {
        debug_assert_ne!(self.stamp[slot as usize], 0, "slot {slot} removed but absent");
        self.stamp[slot as usize] = 0;
        self.live -= 1;
        if self.entries.len() > 2 * self.live + 64 {
            let stamp = &self.stamp;
            self.entries.retain(|&(s, t)| stamp[s as usize] == t);
        }
    }

    fn is_live(&self, &(slot, stamp): &(u32, u64)) -> bool {
        self.stamp[slot as usize] == stamp
    }

    /// The oldest present slot.
    pub fn oldest(&mut self) -> u32 {
        while let Some(e) = self.entries.front() {
            if self.is_live(e) {
                return e.0;
            }
            self.entries.pop_front();
        }
        unreachable!("oldest() on an empty insertion order")
    }

    /// The newest present slot.
    pub fn newest(&mut self) -> u32 {
        while let Some(e) = self.entries.back() {
            if self.is_live(e) {
                return e.0;
            }
            self.entries.pop_back();
        }
        unreachable!("newest() on an empty insertion order")
    }

    /// The first `k` present slots, oldest first (newest first when `newest_first`).
    pub fn ranked(&self, k: usize, newest_first: bool) -> Vec<u32> {
        let live = |e: &&(u32, u64)| self.is_live(e);
        if newest_first {
            self.entries.iter().rev().filter(live).take(k).map(|e| e.0).collect()
        } else {
            self.entries.iter().filter(live).take(k).map(|e| e.0).collect()
        }
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.stamp.clear();
        self.live = 0;
    }
}

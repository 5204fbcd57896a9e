//! TopK: a draw of n is the n items with the highest priorities, best first
//! (equal priorities oldest first), probability 1. When n exceeds the table size
//! the ranking repeats from the top. An ordered set: O(log n) insert, update and
//! remove, O(k) for a draw of k.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::{Pick, Rng, Selector};

/// Orders non-negative priorities like their values (`-0.0` counts as `0.0`).
fn rank(priority: f64) -> u64 {
    if priority == 0.0 {
        0
    } else {
        priority.to_bits()
    }
}

#[derive(Default)]
pub struct TopK {
    /// (priority rank descending, insertion sequence, slot).
    order: BTreeSet<(Reverse<u64>, u64, u32)>,
    /// Per slot: its key in `order`.
    entries: Vec<Option<(u64, u64)>>,
}

impl Selector for TopK {
    fn insert(&mut self, slot: u32, seq: u64, priority: f64) {
        let s = slot as usize;
        if self.entries.len() <= s {
            self.entries.resize(s + 1, None);
        }
        let r = rank(priority);
        self.entries[s] = Some((r, seq));
        self.order.insert((Reverse(r), seq, slot));
    }

    fn update(&mut self, slot: u32, priority: f64) {
        if let Some((r, seq)) = self.entries[slot as usize] {
            self.order.remove(&(Reverse(r), seq, slot));
            let r = rank(priority);
            self.entries[slot as usize] = Some((r, seq));
            self.order.insert((Reverse(r), seq, slot));
        }
    }

    fn remove(&mut self, slot: u32) {
        if let Some((r, seq)) = self.entries[slot as usize].take() {
            self.order.remove(&(Reverse(r), seq, slot));
        }
    }

    fn sample(&mut self, n: usize, _rng: &mut Rng, out: &mut Vec<Pick>) {
        let mut left = n;
        while left > 0 && !self.order.is_empty() {
            let take = left.min(self.order.len());
            out.extend(self.order.iter().take(take).map(|&(_, _, slot)| Pick { slot, probability: 1.0 }));
            left -= take;
        }
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn clear(&mut self) {
        self.order.clear();
        self.entries.clear();
    }
    fn ranked(&self, k: usize) -> Option<Vec<u32>> {
        Some(self.order.iter().take(k).map(|&(_, _, slot)| slot).collect())
    }
}

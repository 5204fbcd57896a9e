//! Selectors: strategies that pick items, used as a table's sampler or remover.
//!
//! Every selector fits behind one small, batch-first interface and works on table
//! *slots* (dense indices the table assigns to live items). Adding a selector means
//! one new file and one line in [`SelectorSpec::build`].

pub mod external;
mod heap;
mod insertion_order;
mod prioritized;
pub mod sum_tree;
mod top_k;
mod uniform;

pub use external::External;
pub use heap::Heap;
pub use insertion_order::Ordered;
pub use prioritized::Prioritized;
pub use top_k::TopK;
pub use uniform::Uniform;

use crate::invalid;
use crate::Result;

/// The random generator of every table: PCG, seeded, reproducible.
pub type Rng = rand_pcg::Pcg64;

/// One pick: a slot and the probability that this draw picked it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pick {
    pub slot: u32,
    pub probability: f64,
}

pub trait Selector: Send {
    /// Adds a slot. `seq` is the table's insertion sequence number (strictly rising).
    fn insert(&mut self, slot: u32, seq: u64, priority: f64);
    /// Changes the priority of a present slot. O(log n) or better.
    fn update(&mut self, slot: u32, priority: f64);
    /// Changes many priorities; the same as calling `update` for each pair in order.
    fn update_batch(&mut self, slots: &[u32], priorities: &[f64]) {
        for (&s, &p) in slots.iter().zip(priorities) {
            self.update(s, p);
        }
    }
    /// Removes a present slot.
    fn remove(&mut self, slot: u32);
    /// Appends `n` picks (with replacement) to `out`. Requires `len() > 0`.
    fn sample(&mut self, n: usize, rng: &mut Rng, out: &mut Vec<Pick>);
    /// One pick (the remover's eviction path). Requires `len() > 0`.
    fn pick(&mut self, rng: &mut Rng) -> Pick {
        let mut out = Vec::with_capacity(1);
        self.sample(1, rng, &mut out);
        out[0]
    }
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn clear(&mut self);
    /// Internal order that picks depend on beyond the items themselves (the dense
    /// slot order of a uniform pick), for checkpoints; `None` when there is none.
    fn order(&self) -> Option<Vec<u32>> {
        None
    }
    /// Restores [`Selector::order`] over the same present slots; false when
    /// `order` is not a permutation of them.
    fn set_order(&mut self, _order: &[u32]) -> bool {
        true
    }
    /// The external selector, when picks are made outside the table.
    fn external(&mut self) -> Option<&mut External> {
        None
    }

    // Cluster mode (`crate::cluster`): a global draw is planned over every shard's
    // figures and resolved by each shard's own selector through these.

    /// The slot at dense position `index` (< `len()`), the order a uniform pick
    /// indexes; `None` for selectors without one.
    fn at_index(&self, _index: usize) -> Option<u32> {
        None
    }
    /// The total weight a weighted pick spreads over (`None` when unweighted).
    fn mass(&self) -> Option<f64> {
        None
    }
    /// The slot whose cumulative-weight interval holds `offset` in `[0, mass)`
    /// (never a zero-weight slot while the mass is positive); `None` when unweighted.
    fn at_mass(&self, _offset: f64) -> Option<u32> {
        None
    }
    /// The weight of `slot` in [`Selector::mass`].
    fn weight(&self, _slot: u32) -> f64 {
        0.0
    }
    /// The first `k` present slots in the order this selector picks them (each
    /// once); `None` for random selectors.
    fn ranked(&self, _k: usize) -> Option<Vec<u32>> {
        None
    }
}

/// The configuration of a selector: what users pass and checkpoints record.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SelectorSpec {
    Fifo,
    Lifo,
    Uniform,
    Prioritized { priority_exponent: f64 },
    MaxHeap,
    MinHeap,
    TopK,
}

impl SelectorSpec {
    pub fn validate(&self) -> Result<()> {
        if let SelectorSpec::Prioritized { priority_exponent } = *self {
            if !priority_exponent.is_finite() || priority_exponent < 0.0 {
                return Err(invalid!(
                    "Prioritized priority_exponent must be finite and >= 0, got {priority_exponent}"
                ));
            }
        }
        Ok(())
    }

    pub fn build(&self) -> Box<dyn Selector> {
        match *self {
            SelectorSpec::Fifo => Box::new(Ordered::fifo()),
            SelectorSpec::Lifo => Box::new(Ordered::lifo()),
            SelectorSpec::Uniform => Box::new(Uniform::default()),
            SelectorSpec::Prioritized { priority_exponent } => {
                Box::new(Prioritized::new(priority_exponent))
            }
            SelectorSpec::MaxHeap => Box::new(Heap::new(true)),
            SelectorSpec::MinHeap => Box::new(Heap::new(false)),
            SelectorSpec::TopK => Box::new(TopK::default()),
        }
    }

    /// The selector a table keeps when this sampler's picks are made outside it.
    /// With `max_times_sampled` a table draws one pick at a time, so TopK, whose
    /// one pick is its best item, repeats that item as the heaps do.
    pub fn build_external(&self, max_times_sampled: u32) -> Box<dyn Selector> {
        let order = match self {
            SelectorSpec::TopK if max_times_sampled > 0 => external::Order::Repeat,
            SelectorSpec::Uniform | SelectorSpec::Prioritized { .. } | SelectorSpec::TopK => external::Order::Draws,
            SelectorSpec::Fifo | SelectorSpec::Lifo | SelectorSpec::MaxHeap | SelectorSpec::MinHeap => external::Order::Repeat,
        };
        Box::new(External::new(order))
    }

    /// The names users pass (`selectors.py` class names), in one list.
    pub const NAMES: &'static str = "Fifo, Lifo, Uniform, Prioritized, MaxHeap, MinHeap or TopK";

    /// The selector called `name` (a `selectors.py` class name); `exponent` is
    /// Prioritized's and ignored by the others. `None` for an unknown name.
    pub fn from_name(name: &str, exponent: f64) -> Option<SelectorSpec> {
        Some(match name {
            "Fifo" => SelectorSpec::Fifo,
            "Lifo" => SelectorSpec::Lifo,
            "Uniform" => SelectorSpec::Uniform,
            "Prioritized" => SelectorSpec::Prioritized { priority_exponent: exponent },
            "MaxHeap" => SelectorSpec::MaxHeap,
            "MinHeap" => SelectorSpec::MinHeap,
            "TopK" => SelectorSpec::TopK,
            _ => return None,
        })
    }

    /// `(name, exponent)`: the inverse of [`SelectorSpec::from_name`].
    pub fn to_name(&self) -> (String, f64) {
        match *self {
            SelectorSpec::Prioritized { priority_exponent } => ("Prioritized".into(), priority_exponent),
            other => (format!("{other:?}"), 0.0),
        }
    }

    /// `Prioritized(priority_exponent=0.6)`.
    pub fn describe(&self) -> String {
        match *self {
            SelectorSpec::Prioritized { priority_exponent } => {
                format!("Prioritized(priority_exponent={priority_exponent})")
            }
            other => format!("{other:?}()"),
        }
    }

    /// True when picks depend on priorities (so priority updates matter).
    pub fn uses_priorities(&self) -> bool {
        matches!(
            self,
            SelectorSpec::Prioritized { .. } | SelectorSpec::MaxHeap | SelectorSpec::MinHeap | SelectorSpec::TopK
        )
    }
}

/// A dense set of slots with O(1) insert, remove and uniform pick. Shared by the
/// uniform selector and by Prioritized (for its all-zero fallback).
#[derive(Default)]
pub(crate) struct SlotSet {
    slots: Vec<u32>,
    pos: Vec<u32>,
}

const ABSENT: u32 = u32::MAX;

impl SlotSet {
    pub fn insert(&mut self, slot: u32) {
        let s = slot as usize;
        if self.pos.len() <= s {
            self.pos.resize(s + 1, ABSENT);
        }
        debug_assert_eq!(self.pos[s], ABSENT, "slot {slot} inserted twice");
        self.pos[s] = self.slots.len() as u32;
        self.slots.push(slot);
    }

    pub fn remove(&mut self, slot: u32) {
        let at = self.pos[slot as usize];
        debug_assert_ne!(at, ABSENT, "slot {slot} removed but absent");
        let last = self.slots.pop().expect("remove from an empty slot set");
        if last != slot {
            self.slots[at as usize] = last;
            self.pos[last as usize] = at;
        }
        self.pos[slot as usize] = ABSENT;
    }

    pub fn pick(&self, rng: &mut Rng) -> u32 {
        use rand::Rng as _;
        self.slots[rng.random_range(0..self.slots.len())]
    }

    /// `n` uniform picks, the same draws as `n` calls of [`SlotSet::pick`]. The
    /// positions are drawn first and each read a few picks after it was requested:
    /// a large set misses the caches on every random read.
    pub fn pick_batch(&self, n: usize, rng: &mut Rng, mut f: impl FnMut(u32)) {
        use rand::Rng as _;
        const AHEAD: usize = 16;
        let len = self.slots.len();
        let mut ring = [0usize; AHEAD];
        for (i, at) in ring.iter_mut().enumerate().take(n.min(AHEAD)) {
            *at = rng.random_range(0..len);
            crate::memory::prefetch(&self.slots[*at]);
            let _ = i;
        }
        for i in 0..n {
            let at = ring[i % AHEAD];
            if i + AHEAD < n {
                let next = rng.random_range(0..len);
                crate::memory::prefetch(&self.slots[next]);
                ring[i % AHEAD] = next;
            }
            f(self.slots[at]);
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn clear(&mut self) {
        self.slots.clear();
        self.pos.clear();
    }

    pub fn order(&self) -> Vec<u32> {
        self.slots.clone()
    }

    /// The slot at dense position `index`.
    pub fn at(&self, index: usize) -> Option<u32> {
        self.slots.get(index).copied()
    }

    /// Rearranges the dense order to `order`; false (and unchanged) unless it
    /// holds exactly the present slots.
    pub fn set_order(&mut self, order: &[u32]) -> bool {
        if order.len() != self.slots.len() {
            return false;
        }
        let mut seen = vec![false; self.pos.len()];
        for &s in order {
            match self.pos.get(s as usize) {
                Some(&p) if p != ABSENT && !seen[s as usize] => seen[s as usize] = true,
                _ => return false,
            }
        }
        self.slots.copy_from_slice(order);
        for (i, &s) in order.iter().enumerate() {
            self.pos[s as usize] = i as u32;
        }
        true
    }
}

#[cfg(test)]
mod tests;

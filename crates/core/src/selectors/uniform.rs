//! Uniform: every item equally likely, O(1) insert, remove and pick.

use super::{Pick, Rng, Selector, SlotSet};

#[derive(Default)]
pub struct Uniform {
    set: SlotSet,
}

impl Selector for Uniform {
    fn insert(&mut self, slot: u32, _seq: u64, _priority: f64) {
        self.set.insert(slot);
    }
    fn update(&mut self, _slot: u32, _priority: f64) {}
    fn remove(&mut self, slot: u32) {
        self.set.remove(slot);
    }
    fn sample(&mut self, n: usize, rng: &mut Rng, out: &mut Vec<Pick>) {
        let probability = 1.0 / self.set.len() as f64;
        out.reserve(n);
        self.set.pick_batch(n, rng, |slot| out.push(Pick { slot, probability }));
    }
    fn len(&self) -> usize {
        self.set.len()
    }
    fn order(&self) -> Option<Vec<u32>> {
        Some(self.set.order())
    }
    fn set_order(&mut self, order: &[u32]) -> bool {
        self.set.set_order(order)
    }
    fn clear(&mut self) {
        self.set.clear();
    }
    fn at_index(&self, index: usize) -> Option<u32> {
        self.set.at(index)
    }
}

//! Prioritized: item i is picked with probability p_i^a / sum_k p_k^a, through an
//! f64 [`SumTree`]: O(log n) per pick and per update. When every weight is zero the
//! pick is uniform over the present items (probability 1/n).

use rand::Rng as _;

use super::sum_tree::SumTree;
use super::{Pick, Rng, Selector, SlotSet};

pub struct Prioritized {
    exponent: f64,
    tree: SumTree,
    present: SlotSet,
}

impl Prioritized {
    pub fn new(priority_exponent: f64) -> Prioritized {
        Prioritized { exponent: priority_exponent, tree: SumTree::default(), present: SlotSet::default() }
    }

    /// The sampling weight of a priority: p^a.
    pub fn weight(exponent: f64, priority: f64) -> f64 {
        if exponent == 1.0 {
            priority
        } else {
            priority.powf(exponent)
        }
    }
}

impl Selector for Prioritized {
    fn insert(&mut self, slot: u32, _seq: u64, priority: f64) {
        self.tree.set(slot, Self::weight(self.exponent, priority));
        self.present.insert(slot);
    }

    fn update(&mut self, slot: u32, priority: f64) {
        self.tree.set(slot, Self::weight(self.exponent, priority));
    }

    fn update_batch(&mut self, slots: &[u32], priorities: &[f64]) {
        let weights: Vec<f64> = priorities.iter().map(|&p| Self::weight(self.exponent, p)).collect();
        self.tree.set_batch(slots, &weights);
    }

    fn remove(&mut self, slot: u32) {
        self.tree.set(slot, 0.0);
        self.present.remove(slot);
    }

    fn sample(&mut self, n: usize, rng: &mut Rng, out: &mut Vec<Pick>) {
        let total = self.tree.total();
        if total > 0.0 {
            let targets: Vec<f64> = (0..n).map(|_| rng.random::<f64>() * total).collect();
            let mut slots = Vec::with_capacity(n);
            self.tree.find_batch(&targets, &mut slots);
            out.extend(slots.into_iter().map(|slot| Pick { slot, probability: self.tree.get(slot) / total }));
        } else {
            let probability = 1.0 / self.present.len() as f64;
            out.extend((0..n).map(|_| Pick { slot: self.present.pick(rng), probability }));
        }
    }

    fn len(&self) -> usize {
        self.present.len()
    }

    fn order(&self) -> Option<Vec<u32>> {
        Some(self.present.order())
    }
    fn set_order(&mut self, order: &[u32]) -> bool {
        self.present.set_order(order)
    }
    fn clear(&mut self) {
        self.tree = SumTree::default();
        self.present.clear();
    }
    fn at_index(&self, index: usize) -> Option<u32> {
        self.present.at(index)
    }
    fn mass(&self) -> Option<f64> {
        Some(self.tree.total())
    }
    fn at_mass(&self, offset: f64) -> Option<u32> {
        (self.tree.total() > 0.0).then(|| self.tree.find(offset))
    }
    fn weight(&self, slot: u32) -> f64 {
        self.tree.get(slot)
    }
}

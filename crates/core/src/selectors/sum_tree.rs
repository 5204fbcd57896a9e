//! A sum tree over f64 weights, indexed by slot.
//!
//! Leaves hold weights, every inner node the sum of its two children. Setting a
//! weight recomputes its ancestors from their children (never by adding a delta),
//! so no rounding error accumulates however many updates are made: the root is
//! always the exact floating-point sum of the current leaves in tree order. The
//! tree grows by doubling when a slot beyond its leaves is set (O(n), amortised).
//!
//! Costs: set O(log n), find O(log n), total O(1); memory 16 bytes per leaf.

#[derive(Clone, Debug)]
pub struct SumTree {
    /// `nodes[1]` is the root; leaves start at `leaves`.
    nodes: Vec<f64>,
    leaves: usize,
}

impl Default for SumTree {
    fn default() -> Self {
        SumTree::with_leaves(1)
    }
}

impl SumTree {
    pub fn with_leaves(n: usize) -> SumTree {
        let leaves = n.max(1).next_power_of_two();
        let nodes = vec![0.0; 2 * leaves];
        crate::memory::advise_huge_pages(&nodes);
        SumTree { nodes, leaves }
    }

    pub fn total(&self) -> f64 {
        self.nodes[1]
    }

    pub fn get(&self, slot: u32) -> f64 {
        let i = slot as usize;
        if i < self.leaves {
            self.nodes[self.leaves + i]
        } else {
            0.0
        }
    }

    pub fn set(&mut self, slot: u32, weight: f64) {
        debug_assert!(weight.is_finite() && weight >= 0.0);
        let i = slot as usize;
        if i >= self.leaves {
            self.grow(i + 1);
        }
        let mut node = self.leaves + i;
        self.nodes[node] = weight;
        while node > 1 {
            node /= 2;
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1];
        }
    }

    /// The slot whose cumulative-weight interval holds `target` (in `[0, total)`).
    /// Never returns a zero-weight slot while the total is positive, even when
    /// rounding puts `target` at or past the total.
    pub fn find(&self, mut target: f64) -> u32 {
        debug_assert!(self.total() > 0.0);
        let mut node = 1;
        while node < self.leaves {
            let left = self.nodes[2 * node];
            let right = self.nodes[2 * node + 1];
            if (target < left && left > 0.0) || right <= 0.0 {
                node *= 2;
            } else {
                target -= left;
                node = 2 * node + 1;
            }
        }
        (node - self.leaves) as u32
    }

    /// Sets many weights at once. The ancestors of all of them are recomputed
    /// level by level, so the memory loads of different slots overlap instead of
    /// each walk waiting on its own cache misses. Same result as setting one by one.
    pub fn set_batch(&mut self, slots: &[u32], weights: &[f64]) {
        debug_assert_eq!(slots.len(), weights.len());
        if let Some(&max) = slots.iter().max() {
            if max as usize >= self.leaves {
                self.grow(max as usize + 1);
            }
        }
        let mut nodes: Vec<usize> = slots.iter().map(|&s| self.leaves + s as usize).collect();
        for (&node, &w) in nodes.iter().zip(weights) {
            debug_assert!(w.is_finite() && w >= 0.0);
            self.nodes[node] = w;
        }
        let mut width = self.leaves;
        while width > 1 {
            for node in nodes.iter_mut() {
                *node /= 2;
                self.nodes[*node] = self.nodes[2 * *node] + self.nodes[2 * *node + 1];
            }
            width /= 2;
        }
    }

    /// [`SumTree::find`] for many targets, descending level by level for all of
    /// them together (independent loads overlap in the memory system).
    pub fn find_batch(&self, targets: &[f64], out: &mut Vec<u32>) {
        debug_assert!(self.total() > 0.0);
        let mut nodes: Vec<(usize, f64)> = targets.iter().map(|&t| (1usize, t)).collect();
        let mut width = 1;
        while width < self.leaves {
            for (node, target) in nodes.iter_mut() {
                let left = self.nodes[2 * *node];
                let right = self.nodes[2 * *node + 1];
                // Branch-free form of `find`'s choice: the direction is random, so a
                // branch would be mispredicted half the time.
                let go_right = !((*target < left && left > 0.0) || right <= 0.0);
                *target -= if go_right { left } else { 0.0 };
                *node = 2 * *node + go_right as usize;
            }
            width *= 2;
        }
        out.extend(nodes.iter().map(|&(node, _)| (node - self.leaves) as u32));
    }

    pub fn clear(&mut self) {
        self.nodes.iter_mut().for_each(|w| *w = 0.0);
    }

    fn grow(&mut self, min_leaves: usize) {
        let leaves = min_leaves.next_power_of_two();
        let mut nodes = vec![0.0; 2 * leaves];
        crate::memory::advise_huge_pages(&nodes);
        nodes[leaves..leaves + self.leaves].copy_from_slice(&self.nodes[self.leaves..]);
        for node in (1..leaves).rev() {
            nodes[node] = nodes[2 * node] + nodes[2 * node + 1];
        }
        self.nodes = nodes;
        self.leaves = leaves;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_is_the_sum_of_leaves() {
        let mut t = SumTree::default();
        for i in 0..100u32 {
            t.set(i, i as f64);
        }
        assert_eq!(t.total(), (0..100).sum::<u32>() as f64);
        t.set(50, 0.0);
        assert_eq!(t.total(), (0..100).sum::<u32>() as f64 - 50.0);
    }

    #[test]
    fn find_maps_cumulative_intervals_to_slots() {
        let mut t = SumTree::default();
        t.set(0, 1.0);
        t.set(1, 0.0);
        t.set(2, 2.0);
        assert_eq!(t.find(0.0), 0);
        assert_eq!(t.find(0.999), 0);
        assert_eq!(t.find(1.0), 2);
        assert_eq!(t.find(2.999), 2);
        // Past the total (rounding): still a positive-weight slot.
        assert_eq!(t.find(3.5), 2);
    }

    #[test]
    fn batch_operations_match_single_ones() {
        let mut a = SumTree::default();
        let mut b = SumTree::default();
        let slots: Vec<u32> = (0..300).map(|i| (i * 7919) % 1000).collect();
        let weights: Vec<f64> = (0..300).map(|i| (i % 17) as f64 * 0.25).collect();
        for (&s, &w) in slots.iter().zip(&weights) {
            a.set(s, w);
        }
        b.set_batch(&slots, &weights);
        assert_eq!(a.nodes, b.nodes);
        let targets: Vec<f64> = (0..500).map(|i| a.total() * i as f64 / 500.0).collect();
        let mut found = Vec::new();
        a.find_batch(&targets, &mut found);
        let single: Vec<u32> = targets.iter().map(|&t| a.find(t)).collect();
        assert_eq!(found, single);
    }

    #[test]
    fn no_drift_after_many_updates() {
        let mut t = SumTree::default();
        for round in 0..10_000u32 {
            t.set(round % 7, 1e-3 * (round % 13) as f64);
        }
        let exact: f64 = (0..7).map(|i| t.get(i)).sum();
        assert!((t.total() - exact).abs() <= 1e-15, "{} vs {}", t.total(), exact);
        for i in 0..7 {
            t.set(i, 0.0);
        }
        assert_eq!(t.total(), 0.0);
    }
}

//! MaxHeap and MinHeap: always the item with the highest (lowest) priority,
//! probability 1. Equal priorities go in insertion order (oldest first). An indexed
//! binary heap: O(log n) insert, update and remove, O(1) pick.

use std::cmp::Ordering;

use super::{Pick, Rng, Selector};

const ABSENT: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Entry {
    slot: u32,
    priority: f64,
    seq: u64,
}

pub struct Heap {
    max_first: bool,
    heap: Vec<Entry>,
    pos: Vec<u32>,
}

impl Heap {
    pub fn new(max_first: bool) -> Heap {
        Heap { max_first, heap: Vec::new(), pos: Vec::new() }
    }

    /// True when `a` belongs above `b`.
    fn before(&self, a: &Entry, b: &Entry) -> bool {
        let by_priority = if self.max_first {
            b.priority.partial_cmp(&a.priority)
        } else {
            a.priority.partial_cmp(&b.priority)
        };
        match by_priority.unwrap_or(Ordering::Equal) {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal => a.seq < b.seq,
        }
    }

    fn place(&mut self, at: usize) {
        self.pos[self.heap[at].slot as usize] = at as u32;
    }

    fn swap(&mut self, i: usize, j: usize) {
        self.heap.swap(i, j);
        self.place(i);
        self.place(j);
    }

    fn up(&mut self, mut i: usize) -> usize {
        while i > 0 {
            let parent = (i - 1) / 2;
            if !self.before(&self.heap[i], &self.heap[parent]) {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
        i
    }

    fn down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut best = i;
            if l < self.heap.len() && self.before(&self.heap[l], &self.heap[best]) {
                best = l;
            }
            if r < self.heap.len() && self.before(&self.heap[r], &self.heap[best]) {
                best = r;
            }
            if best == i {
                return;
            }
            self.swap(i, best);
            i = best;
        }
    }

    fn fix(&mut self, i: usize) {
        if self.up(i) == i {
            self.down(i);
        }
    }
}

impl Selector for Heap {
    fn insert(&mut self, slot: u32, seq: u64, priority: f64) {
        let s = slot as usize;
        if self.pos.len() <= s {
            self.pos.resize(s + 1, ABSENT);
        }
        debug_assert_eq!(self.pos[s], ABSENT, "slot {slot} inserted twice");
        self.heap.push(Entry { slot, priority, seq });
        let at = self.heap.len() - 1;
        self.place(at);
        self.up(at);
    }

    fn update(&mut self, slot: u32, priority: f64) {
        let at = self.pos[slot as usize] as usize;
        self.heap[at].priority = priority;
        self.fix(at);
    }

    fn remove(&mut self, slot: u32) {
        let at = self.pos[slot as usize] as usize;
        let last = self.heap.len() - 1;
        if at != last {
            self.swap(at, last);
        }
        self.heap.pop();
        self.pos[slot as usize] = ABSENT;
        if at < self.heap.len() {
            self.fix(at);
        }
    }

    fn sample(&mut self, n: usize, _rng: &mut Rng, out: &mut Vec<Pick>) {
        let slot = self.heap[0].slot;
        out.extend((0..n).map(|_| Pick { slot, probability: 1.0 }));
    }

    fn len(&self) -> usize {
        self.heap.len()
    }

    fn clear(&mut self) {
        self.heap.clear();
        self.pos.clear();
    }

    /// The best `k` in order: a frontier of heap positions (a max-heap on the same
    /// order), whose children join it as each is taken. O(k log k).
    fn ranked(&self, k: usize) -> Option<Vec<u32>> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        // Priorities are finite and >= 0, so their bits order like their values.
        let rank = |e: &Entry| {
            let bits = if e.priority == 0.0 { 0 } else { e.priority.to_bits() };
            (if self.max_first { bits } else { u64::MAX - bits }, Reverse(e.seq))
        };
        let mut out = Vec::with_capacity(k.min(self.heap.len()));
        let mut frontier = BinaryHeap::new();
        if let Some(top) = self.heap.first() {
            frontier.push((rank(top), 0usize));
        }
        while out.len() < k {
            let Some((_, at)) = frontier.pop() else { break };
            out.push(self.heap[at].slot);
            for c in [2 * at + 1, 2 * at + 2] {
                if let Some(e) = self.heap.get(c) {
                    frontier.push((rank(e), c));
                }
            }
        }
        Some(out)
    }
}

//! The ordered selectors across shards: a merge of each shard's local best.
//!
//! Each shard sends its first k items in its selector's order (k = the batch, or 1
//! when one item fills the batch), with what the merge needs to place them in the
//! global order: priority, the step at which the item became visible to draws,
//! its insertion sequence and times sampled. Ties are broken by the global key
//! (visible step, shard, sequence), so every rank merges to the same result:
//! O(m·k) bytes, GEAR's decentralised bound.
//!
//! As on one table: Fifo, Lifo, MaxHeap, MinHeap (and TopK with
//! `max_times_sampled`) draw their first item again and again until it is used
//! up, then the next; TopK without a limit draws the best B distinct items, the
//! ranking repeating from the top when B exceeds the table.

use std::cmp::Ordering;

use crate::invalid;
use crate::selectors::SelectorSpec;
use crate::Result;

/// One candidate a shard sends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub slot: u32,
    pub seq: u64,
    pub priority: f64,
    pub times_sampled: u32,
    /// The step from which draws could see the item.
    pub visible_step: u64,
    /// The item's steps (what a token-budget step cuts on; the merge ignores it).
    pub length: u32,
}

/// `(shard, candidate index)` for every position of the batch.
pub type Merged = Vec<(u32, u32)>;

/// How many candidates each shard must send for a batch of `batch`.
pub fn candidates_needed(spec: SelectorSpec, max_times_sampled: u32, batch: usize) -> usize {
    if max_times_sampled == 0 && spec != SelectorSpec::TopK {
        1
    } else {
        batch
    }
}

fn compare(spec: SelectorSpec, a: (u32, &Candidate), b: (u32, &Candidate)) -> Ordering {
    let age = |(s, c): (u32, &Candidate)| (c.visible_step, s, c.seq);
    let oldest_first = age(a).cmp(&age(b));
    let by_priority = |high_first: bool| {
        let o = a.1.priority.partial_cmp(&b.1.priority).unwrap_or(Ordering::Equal);
        let o = if high_first { o.reverse() } else { o };
        o.then(oldest_first)
    };
    match spec {
        SelectorSpec::Fifo => oldest_first,
        SelectorSpec::Lifo => oldest_first.reverse(),
        SelectorSpec::MaxHeap | SelectorSpec::TopK => by_priority(true),
        SelectorSpec::MinHeap => by_priority(false),
        SelectorSpec::Uniform | SelectorSpec::Prioritized { .. } => Ordering::Equal,
    }
}

/// Merges the shards' candidates (each list in its shard's own order) into the
/// batch's positions. `table_size` is the global item count. Fails for random
/// selectors and when every shard is empty.
pub fn merge(spec: SelectorSpec, max_times_sampled: u32, shards: &[Vec<Candidate>], batch: usize, table_size: u64) -> Result<Merged> {
    if matches!(spec, SelectorSpec::Uniform | SelectorSpec::Prioritized { .. }) {
        return Err(invalid!("{} draws are planned, not merged", spec.describe()));
    }
    let mut all: Vec<(u32, u32)> = Vec::new();
    for (s, list) in shards.iter().enumerate() {
        all.extend((0..list.len() as u32).map(|i| (s as u32, i)));
    }
    if all.is_empty() || table_size == 0 {
        return Err(invalid!("cannot merge a draw: every shard is empty"));
    }
    let at = |&(s, i): &(u32, u32)| (s, &shards[s as usize][i as usize]);
    all.sort_by(|a, b| compare(spec, at(a), at(b)));
    let mut out = Vec::with_capacity(batch);
    if spec == SelectorSpec::TopK && max_times_sampled == 0 {
        // Distinct items best first; the ranking repeats when the batch is larger.
        while out.len() < batch {
            let take = (batch - out.len()).min(all.len());
            out.extend_from_slice(&all[..take]);
        }
        return Ok(out);
    }
    for c in &all {
        let left = batch - out.len();
        if left == 0 {
            break;
        }
        let uses = match max_times_sampled {
            0 => left,
            m => (m.saturating_sub(at(c).1.times_sampled) as usize).min(left),
        };
        out.extend(std::iter::repeat_n(*c, uses));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(seq: u64, priority: f64, step: u64) -> Candidate {
        Candidate { slot: seq as u32, seq, priority, times_sampled: 0, visible_step: step, length: 1 }
    }

    #[test]
    fn fifo_is_oldest_visible_step_then_shard_then_seq() {
        let shards = vec![vec![c(5, 0.0, 2), c(6, 0.0, 3)], vec![c(0, 0.0, 1), c(9, 0.0, 2)]];
        assert_eq!(merge(SelectorSpec::Fifo, 1, &shards, 3, 4).unwrap(), vec![(1, 0), (0, 0), (1, 1)]);
        assert_eq!(merge(SelectorSpec::Fifo, 0, &shards, 3, 4).unwrap(), vec![(1, 0); 3]);
        assert_eq!(merge(SelectorSpec::Lifo, 1, &shards, 2, 4).unwrap(), vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn heaps_and_top_k_rank_by_priority_with_age_ties() {
        let shards = vec![vec![c(1, 5.0, 1), c(2, 1.0, 1)], vec![c(0, 5.0, 1), c(3, 3.0, 0)]];
        assert_eq!(merge(SelectorSpec::MaxHeap, 2, &shards, 3, 4).unwrap(), vec![(0, 0), (0, 0), (1, 0)]);
        assert_eq!(merge(SelectorSpec::TopK, 0, &shards, 6, 4).unwrap(), vec![(0, 0), (1, 0), (1, 1), (0, 1), (0, 0), (1, 0)]);
        let min_first = vec![shards[0].iter().rev().copied().collect::<Vec<_>>(), shards[1].iter().rev().copied().collect()];
        assert_eq!(merge(SelectorSpec::MinHeap, 1, &min_first, 2, 4).unwrap(), vec![(0, 0), (1, 0)]);
    }

    #[test]
    fn used_items_count_against_the_limit_and_short_batches_stay_short() {
        let mut a = c(0, 0.0, 0);
        a.times_sampled = 2;
        let shards = vec![vec![a], vec![c(1, 0.0, 0)]];
        assert_eq!(merge(SelectorSpec::Fifo, 3, &shards, 8, 2).unwrap(), vec![(0, 0), (1, 0), (1, 0), (1, 0)]);
    }

    #[test]
    fn refuses_random_selectors_and_empty_tables() {
        assert!(merge(SelectorSpec::Uniform, 0, &[vec![c(0, 0.0, 0)]], 1, 1).is_err());
        assert!(merge(SelectorSpec::Fifo, 0, &[vec![], vec![]], 1, 0).unwrap_err().to_string().contains("every shard is empty"));
    }
}

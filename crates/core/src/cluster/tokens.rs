//! A token-budget step: how many of a global draw's positions fit, and which
//! consumer takes each.
//!
//! The positions are the draw's picks in order (the plan's, or the merge's),
//! each with its item's length. Each pick goes to the consumer holding the
//! fewest steps so far (the lowest rank among equals); the step stops at the
//! first pick that would take that consumer past `budget`, which is then put
//! back, as one table's `sample_tokens` stops at the first pick that does not
//! fit. With one consumer the two cut at the same pick. Every consumer ends
//! within `budget`, and the consumers' totals differ by at most the longest
//! item drawn.

use crate::invalid;
use crate::Result;

/// The picks that fit: per pick (a prefix of `lengths`) the index of the
/// consumer that takes it. `Ok` of an empty vector only when `lengths` is empty;
/// an error when the first pick alone is longer than `budget`.
pub fn cut(lengths: &[u32], consumers: usize, budget: u64) -> Result<Vec<u32>> {
    if consumers == 0 {
        return Err(invalid!("a token-budget step needs at least one consumer"));
    }
    if budget == 0 {
        return Err(invalid!("the token budget must be >= 1 step, got 0"));
    }
    let mut load = vec![0u64; consumers];
    let mut out = Vec::with_capacity(lengths.len());
    for &length in lengths {
        let (c, least) = load.iter().enumerate().min_by_key(|&(i, &l)| (l, i)).map(|(i, &l)| (i, l)).unwrap_or((0, 0));
        if least + length as u64 > budget {
            if out.is_empty() {
                return Err(invalid!(
                    "a drawn item has {length} steps, more than the whole token budget of {budget}; \
                     raise the budget to at least the longest item"
                ));
            }
            break;
        }
        load[c] += length as u64;
        out.push(c as u32);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_consumer_stops_at_the_first_pick_that_does_not_fit() {
        assert_eq!(cut(&[20, 50, 10, 40, 5], 1, 100).unwrap(), vec![0, 0, 0]);
        assert_eq!(cut(&[], 1, 10).unwrap(), Vec::<u32>::new());
        let e = cut(&[11, 1], 2, 10).unwrap_err().to_string();
        assert!(e.contains("a drawn item has 11 steps, more than the whole token budget of 10"), "{e}");
    }

    #[test]
    fn each_pick_goes_to_the_least_loaded_consumer() {
        // loads: [5,0] -> [5,3] -> [5,7] -> [9,7] -> next 4 would make 11 > 10 on consumer 1.
        assert_eq!(cut(&[5, 3, 4, 4, 4], 2, 10).unwrap(), vec![0, 1, 1, 0]);
    }

    proptest! {
        /// Against a plain model: within budget everywhere, stopped exactly where
        /// the least loaded consumer could not take the next pick, balanced within
        /// the longest pick.
        #[test]
        fn cut_matches_the_model(lengths in proptest::collection::vec(1u32..50, 0..40), consumers in 1usize..5, budget in 50u64..300) {
            let got = cut(&lengths, consumers, budget).unwrap();
            let mut load = vec![0u64; consumers];
            for (&l, &c) in lengths.iter().zip(&got) {
                let least = *load.iter().min().unwrap();
                prop_assert_eq!(load[c as usize], least);
                prop_assert!(load[..c as usize].iter().all(|&x| x > least));
                load[c as usize] += l as u64;
            }
            prop_assert!(load.iter().all(|&x| x <= budget));
            if got.len() < lengths.len() {
                prop_assert!(*load.iter().min().unwrap() + lengths[got.len()] as u64 > budget);
            }
            let longest = lengths[..got.len()].iter().copied().max().unwrap_or(0) as u64;
            prop_assert!(load.iter().max().unwrap() - load.iter().min().unwrap() <= longest);
        }
    }
}

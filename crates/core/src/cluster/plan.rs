//! The plan of one global draw with replacement.
//!
//! Every rank gathers each shard's figures (item count, and for Prioritized the
//! sum of its weights p^a) and calls [`plan`] with the same seed, table id and
//! step. The generator is PCG keyed by those three alone, so each rank draws the
//! same B numbers. Uniform: B integers in `[0, N)` with N the summed counts;
//! Prioritized: B numbers `u * W` with W the weights summed in shard order (a
//! fixed left fold, never an all-reduce). Position j goes to the shard whose
//! prefix interval holds its number, the remainder being the offset the shard
//! resolves in its own selector (a dense index, or a point in its sum tree).
//!
//! This is exactly one draw from a single table whose selection structure has
//! the shards' masses as its top level: item i of shard s is picked with
//! probability `w_i / W` (Uniform: `1 / N`), which [`Plan::divisor`] gives.

use rand::{Rng as _, SeedableRng};

use crate::invalid;
use crate::selectors::Rng;
use crate::Result;

/// One shard's figures for a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardFigures {
    pub size: u64,
    /// Sum of the shard's weights (Prioritized); ignored for Uniform.
    pub mass: f64,
}

/// Where one drawn position lands in its shard.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// The item at this dense position of the shard's selector.
    Index(u64),
    /// The item whose cumulative-weight interval holds this offset.
    Mass(f64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Per position: its shard.
    pub shard: Vec<u32>,
    /// Per position: where it lands in the shard.
    pub target: Vec<Target>,
    /// Probabilities are `weight / divisor` for `Target::Mass`, `1 / divisor`
    /// for `Target::Index`.
    pub divisor: f64,
    /// Items in all shards together (the `table_size` of importance weights).
    pub table_size: u64,
}

/// The generator of step `step` of table `table` under `seed`: PCG whose state and
/// stream are SplitMix64 mixes of the three (so neighbouring steps are unrelated).
pub fn generator(seed: u64, table: u64, step: u64) -> Rng {
    let mut x = seed;
    let mut next = |v: u64| {
        x = x.wrapping_add(v).wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let (a, b) = (next(table), next(step));
    let (c, d) = (next(a), next(b));
    let state = ((a as u128) << 64) | b as u128;
    let stream = ((c as u128) << 64) | d as u128;
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(&state.to_le_bytes());
    bytes[16..].copy_from_slice(&stream.to_le_bytes());
    Rng::from_seed(bytes)
}

/// Plans `batch` draws with replacement over `shards` (in shard order).
/// `weighted`: by mass (Prioritized), falling back to uniform over every item when
/// all masses are zero, as a single table does. Fails when every shard is empty.
pub fn plan(weighted: bool, shards: &[ShardFigures], batch: usize, seed: u64, table: u64, step: u64) -> Result<Plan> {
    let table_size: u64 = shards.iter().map(|s| s.size).sum();
    if table_size == 0 {
        return Err(invalid!("cannot plan a draw: every shard is empty"));
    }
    if let Some((s, f)) = shards.iter().enumerate().find(|(_, f)| weighted && (!f.mass.is_finite() || f.mass < 0.0)) {
        return Err(invalid!("shard {s} reported mass {}; expected a finite number >= 0", f.mass));
    }
    let mut rng = generator(seed, table, step);
    let mut out = Plan { shard: Vec::with_capacity(batch), target: Vec::with_capacity(batch), divisor: 0.0, table_size };
    // A fixed left fold in shard order: every rank gets the same bits.
    let total_mass = shards.iter().fold(0.0f64, |acc, s| acc + s.mass);
    if weighted && total_mass > 0.0 {
        let mut ends = Vec::with_capacity(shards.len());
        let mut acc = 0.0f64;
        for s in shards {
            acc += s.mass;
            ends.push(acc);
        }
        let last_positive = shards.iter().rposition(|s| s.mass > 0.0).expect("a positive mass");
        for _ in 0..batch {
            let u = rng.random::<f64>() * total_mass;
            let mut shard = ends.partition_point(|&e| e <= u);
            if shard >= shards.len() || shards[shard].mass <= 0.0 {
                shard = last_positive; // rounding put u at or past the end
            }
            let start = if shard == 0 { 0.0 } else { ends[shard - 1] };
            out.shard.push(shard as u32);
            out.target.push(Target::Mass(u - start));
        }
        out.divisor = total_mass;
    } else {
        let mut ends = Vec::with_capacity(shards.len());
        let mut acc = 0u64;
        for s in shards {
            acc += s.size;
            ends.push(acc);
        }
        for _ in 0..batch {
            let j = rng.random_range(0..table_size);
            let shard = ends.partition_point(|&e| e <= j);
            let start = if shard == 0 { 0 } else { ends[shard - 1] };
            out.shard.push(shard as u32);
            out.target.push(Target::Index(j - start));
        }
        out.divisor = table_size as f64;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(v: &[(u64, f64)]) -> Vec<ShardFigures> {
        v.iter().map(|&(size, mass)| ShardFigures { size, mass }).collect()
    }

    #[test]
    fn same_key_same_plan_other_step_other_plan() {
        let f = figures(&[(10, 3.0), (0, 0.0), (5, 1.5)]);
        let a = plan(true, &f, 64, 7, 1, 3).unwrap();
        assert_eq!(a, plan(true, &f, 64, 7, 1, 3).unwrap());
        assert_ne!(a.shard, plan(true, &f, 64, 7, 1, 4).unwrap().shard);
        assert_ne!(a.shard, plan(true, &f, 64, 8, 1, 3).unwrap().shard);
    }

    #[test]
    fn empty_and_zero_mass_shards_get_nothing() {
        let f = figures(&[(0, 0.0), (4, 0.0), (6, 2.0), (0, 0.0)]);
        let p = plan(true, &f, 1000, 1, 2, 3).unwrap();
        assert!(p.shard.iter().all(|&s| s == 2));
        assert!(p.target.iter().all(|t| matches!(*t, Target::Mass(m) if (0.0..2.0).contains(&m))));
        assert_eq!(p.divisor, 2.0);
        assert_eq!(p.table_size, 10);
        let u = plan(false, &f, 1000, 1, 2, 3).unwrap();
        assert!(u.shard.iter().all(|&s| s == 1 || s == 2));
        assert!(u.target.iter().zip(&u.shard).all(|(t, &s)| matches!(*t, Target::Index(i) if i < f[s as usize].size)));
    }

    #[test]
    fn all_zero_mass_falls_back_to_uniform_over_items() {
        let f = figures(&[(3, 0.0), (5, 0.0)]);
        let p = plan(true, &f, 10, 0, 0, 0).unwrap();
        assert!(p.target.iter().all(|t| matches!(t, Target::Index(_))));
        assert_eq!(p.divisor, 8.0);
    }

    #[test]
    fn refuses_empty_tables_and_bad_masses() {
        assert!(plan(false, &figures(&[(0, 0.0)]), 1, 0, 0, 0).unwrap_err().to_string().contains("every shard is empty"));
        let e = plan(true, &figures(&[(1, f64::NAN)]), 1, 0, 0, 0).unwrap_err().to_string();
        assert!(e.contains("shard 0 reported mass NaN"), "{e}");
    }

    /// Chi-square of the shard counts against the masses, and its negative
    /// control (equal shares per shard) which must fail.
    #[test]
    fn shards_are_drawn_in_proportion_to_mass() {
        let masses = [1.0, 2.0, 3.0, 10.0];
        let f: Vec<ShardFigures> = masses.iter().map(|&m| ShardFigures { size: 5, mass: m }).collect();
        let n = 40_000;
        let p = plan(true, &f, n, 11, 22, 33).unwrap();
        let mut counts = [0f64; 4];
        p.shard.iter().for_each(|&s| counts[s as usize] += 1.0);
        let total: f64 = masses.iter().sum();
        let chi = |expect: &dyn Fn(usize) -> f64| (0..4).map(|i| (counts[i] - expect(i)).powi(2) / expect(i)).sum::<f64>();
        // 3 degrees of freedom: the 0.999 quantile is 16.27.
        assert!(chi(&|i| n as f64 * masses[i] / total) < 16.27);
        assert!(chi(&|_| n as f64 / 4.0) > 16.27);
    }
}

//! Selector tests: every selector against a plain reference model (proptest), and
//! chi-square tests of the Uniform and Prioritized frequencies under fixed seeds.

use proptest::prelude::*;
use rand::SeedableRng;

use super::*;

#[derive(Clone, Debug)]
enum Op {
    Insert(f64),
    Update(usize, f64),
    Remove(usize),
    Sample(usize),
}

fn priority() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(1.0), Just(2.5), 0.0f64..100.0]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => priority().prop_map(Op::Insert),
            2 => (any::<usize>(), priority()).prop_map(|(i, p)| Op::Update(i, p)),
            2 => any::<usize>().prop_map(Op::Remove),
            2 => (1usize..5).prop_map(Op::Sample),
        ],
        1..120,
    )
}

/// The reference: present items as (slot, seq, priority), nothing clever.
/// A present item in the reference: (slot, seq, priority).
type Entry = (u32, u64, f64);

#[derive(Default)]
struct Model {
    items: Vec<Entry>,
    free: Vec<u32>,
    next_slot: u32,
    next_seq: u64,
}

impl Model {
    fn expected(&self, spec: SelectorSpec, pick: Pick) -> std::result::Result<(), String> {
        let find = |slot: u32| self.items.iter().find(|e| e.0 == slot).copied();
        let Some(item) = find(pick.slot) else {
            return Err(format!("picked absent slot {}", pick.slot));
        };
        let by = |better: &dyn Fn(&Entry, &Entry) -> bool| {
            let mut best = self.items[0];
            for e in &self.items[1..] {
                if better(e, &best) {
                    best = *e;
                }
            }
            best.0
        };
        let want = match spec {
            SelectorSpec::Fifo => Some(by(&|a, b| a.1 < b.1)),
            SelectorSpec::Lifo => Some(by(&|a, b| a.1 > b.1)),
            SelectorSpec::MaxHeap => Some(by(&|a, b| a.2 > b.2 || (a.2 == b.2 && a.1 < b.1))),
            SelectorSpec::MinHeap => Some(by(&|a, b| a.2 < b.2 || (a.2 == b.2 && a.1 < b.1))),
            _ => None,
        };
        if let Some(w) = want {
            if w != pick.slot || pick.probability != 1.0 {
                return Err(format!("{spec:?}: picked {pick:?}, expected slot {w}"));
            }
            return Ok(());
        }
        let n = self.items.len() as f64;
        let expected_p = match spec {
            SelectorSpec::Uniform => 1.0 / n,
            SelectorSpec::Prioritized { priority_exponent: a } => {
                let total: f64 = self.items.iter().map(|e| e.2.powf(a)).sum();
                if total > 0.0 {
                    item.2.powf(a) / total
                } else {
                    1.0 / n
                }
            }
            _ => unreachable!(),
        };
        if (pick.probability - expected_p).abs() > 1e-9 * expected_p.max(1e-300) || expected_p == 0.0 {
            return Err(format!("{spec:?}: probability {} for slot {}, expected {expected_p}", pick.probability, pick.slot));
        }
        Ok(())
    }
}

fn run(spec: SelectorSpec, ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
    let mut sel = spec.build();
    let mut model = Model::default();
    let mut rng = super::Rng::seed_from_u64(7);
    for op in ops {
        match op {
            Op::Insert(p) => {
                let slot = model.free.pop().unwrap_or_else(|| {
                    model.next_slot += 1;
                    model.next_slot - 1
                });
                sel.insert(slot, model.next_seq, p);
                model.items.push((slot, model.next_seq, p));
                model.next_seq += 1;
            }
            Op::Update(i, p) if !model.items.is_empty() => {
                let i = i % model.items.len();
                sel.update(model.items[i].0, p);
                model.items[i].2 = p;
            }
            Op::Remove(i) if !model.items.is_empty() => {
                let (slot, _, _) = model.items.swap_remove(i % model.items.len());
                sel.remove(slot);
                model.free.push(slot);
            }
            Op::Sample(n) if !model.items.is_empty() => {
                let mut out = Vec::new();
                sel.sample(n, &mut rng, &mut out);
                prop_assert_eq!(out.len(), n);
                if spec == SelectorSpec::TopK {
                    // The ranking (priority descending, oldest first), repeated.
                    let mut ranked = model.items.clone();
                    ranked.sort_by(|a, b| b.2.partial_cmp(&a.2).unwrap().then(a.1.cmp(&b.1)));
                    let want: Vec<u32> = ranked.iter().cycle().take(n).map(|e| e.0).collect();
                    prop_assert_eq!(out.iter().map(|p| p.slot).collect::<Vec<_>>(), want);
                    prop_assert!(out.iter().all(|p| p.probability == 1.0));
                    continue;
                }
                for pick in out {
                    model.expected(spec, pick).map_err(TestCaseError::fail)?;
                }
            }
            _ => {}
        }
        prop_assert_eq!(sel.len(), model.items.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test] fn fifo_matches_reference(ops in ops()) { run(SelectorSpec::Fifo, ops)?; }
    #[test] fn lifo_matches_reference(ops in ops()) { run(SelectorSpec::Lifo, ops)?; }
    #[test] fn uniform_matches_reference(ops in ops()) { run(SelectorSpec::Uniform, ops)?; }
    #[test] fn prioritized_matches_reference(ops in ops(), a in prop_oneof![Just(0.0), Just(1.0), 0.1f64..2.0]) {
        run(SelectorSpec::Prioritized { priority_exponent: a }, ops)?;
    }
    #[test] fn max_heap_matches_reference(ops in ops()) { run(SelectorSpec::MaxHeap, ops)?; }
    #[test] fn min_heap_matches_reference(ops in ops()) { run(SelectorSpec::MinHeap, ops)?; }
    #[test] fn top_k_matches_reference(ops in ops()) { run(SelectorSpec::TopK, ops)?; }
}

/// Pearson chi-square of observed counts against expected probabilities.
fn chi_square(counts: &[u64], probs: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

// Critical values of chi-square at p = 0.001.
const CHI2_DF9: f64 = 27.88;
const CHI2_DF19: f64 = 43.82;

#[test]
fn uniform_frequencies_pass_chi_square() {
    let mut sel = SelectorSpec::Uniform.build();
    for slot in 0..10 {
        sel.insert(slot, slot as u64, 1.0);
    }
    let mut rng = super::Rng::seed_from_u64(1);
    let mut out = Vec::new();
    sel.sample(100_000, &mut rng, &mut out);
    let mut counts = [0u64; 10];
    out.iter().for_each(|p| counts[p.slot as usize] += 1);
    let x2 = chi_square(&counts, &[0.1; 10]);
    assert!(x2 < CHI2_DF9, "chi-square {x2} for {counts:?}");
}

#[test]
fn prioritized_frequencies_follow_p_to_the_a() {
    let a = 0.6;
    let mut sel = SelectorSpec::Prioritized { priority_exponent: a }.build();
    let priorities: Vec<f64> = (1..=20).map(|i| i as f64 * 0.5).collect();
    for (slot, &p) in priorities.iter().enumerate() {
        sel.insert(slot as u32, slot as u64, p);
    }
    // Updates must be reflected too: move weight around and back.
    sel.update(3, 100.0);
    sel.update(3, priorities[3]);
    let total: f64 = priorities.iter().map(|p| p.powf(a)).sum();
    let probs: Vec<f64> = priorities.iter().map(|p| p.powf(a) / total).collect();
    let mut rng = super::Rng::seed_from_u64(2);
    let mut out = Vec::new();
    sel.sample(200_000, &mut rng, &mut out);
    let mut counts = [0u64; 20];
    for p in &out {
        counts[p.slot as usize] += 1;
        assert!((p.probability - probs[p.slot as usize]).abs() < 1e-12);
    }
    let x2 = chi_square(&counts, &probs);
    assert!(x2 < CHI2_DF19, "chi-square {x2} for {counts:?}");
}

#[test]
fn prioritized_all_zero_falls_back_to_uniform() {
    let mut sel = SelectorSpec::Prioritized { priority_exponent: 1.0 }.build();
    for slot in 0..4 {
        sel.insert(slot, slot as u64, 0.0);
    }
    let mut out = Vec::new();
    sel.sample(4000, &mut super::Rng::seed_from_u64(3), &mut out);
    assert!(out.iter().all(|p| p.probability == 0.25));
    let mut counts = [0u64; 4];
    out.iter().for_each(|p| counts[p.slot as usize] += 1);
    assert!(chi_square(&counts, &[0.25; 4]) < 16.27, "{counts:?}");
}

#[test]
fn zero_priority_items_are_never_picked_while_others_have_weight() {
    let mut sel = SelectorSpec::Prioritized { priority_exponent: 1.0 }.build();
    sel.insert(0, 0, 0.0);
    sel.insert(1, 1, 1e-300);
    sel.insert(2, 2, 0.0);
    let mut out = Vec::new();
    sel.sample(1000, &mut super::Rng::seed_from_u64(4), &mut out);
    assert!(out.iter().all(|p| p.slot == 1 && p.probability == 1.0));
}

#[test]
fn same_seed_gives_same_picks() {
    let picks = |seed| {
        let mut sel = SelectorSpec::Prioritized { priority_exponent: 0.7 }.build();
        for slot in 0..50 {
            sel.insert(slot, slot as u64, (slot % 7) as f64 + 0.5);
        }
        let mut out = Vec::new();
        sel.sample(100, &mut super::Rng::seed_from_u64(seed), &mut out);
        out.iter().map(|p| p.slot).collect::<Vec<_>>()
    };
    assert_eq!(picks(9), picks(9));
    assert_ne!(picks(9), picks(10));
}

#[test]
fn bad_exponent_is_rejected() {
    for a in [f64::NAN, -0.5, f64::INFINITY] {
        let e = SelectorSpec::Prioritized { priority_exponent: a }.validate().unwrap_err();
        assert!(e.to_string().contains("priority_exponent"), "{e}");
    }
}

//! Item attributes, policy versions and token budgets, against plain reference models.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::attributes::{AttributeSpec, Attributes};
use crate::selectors::SelectorSpec;
use crate::signature::{DType, Field, Signature};
use crate::writer::Writer;
use std::time::Instant;

fn store(capacity: u64) -> Store {
    let sig = Signature::new(vec![Field::new("x", DType::Int64, vec![]).unwrap()]).unwrap();
    Store::new(sig, capacity, 64, None).unwrap()
}

/// A table with attributes `version: int64, reward: float32` and `max_staleness`.
fn versioned(s: &Store, sampler: SelectorSpec, max_size: u64, max_staleness: Option<u64>) -> Table {
    let attributes = Attributes::new(vec![
        AttributeSpec { name: "version".into(), dtype: DType::Int64 },
        AttributeSpec { name: "reward".into(), dtype: DType::Float32 },
    ])
    .unwrap();
    let config = TableConfig {
        name: "t".into(),
        sampler,
        remover: SelectorSpec::Fifo,
        max_size,
        max_times_sampled: 0,
        rate_limiter: crate::RateLimiterConfig::min_size(1).unwrap(),
        seed: Some(7),
        evict_when_store_full: true,
        external_selection: false,
        extensions: crate::ExtensionSpec::defaults(),
        attributes,
        max_staleness,
        groups: None,
    };
    Table::new(config, s).unwrap()
}

fn record(version: i64, reward: f32) -> Vec<u8> {
    let mut r = version.to_le_bytes().to_vec();
    r.extend(reward.to_le_bytes());
    r
}

/// Inserts one item of `len` steps per version; returns the keys.
fn insert(t: &Table, versions: &[i64], len: usize) -> Vec<u64> {
    let n = versions.len();
    let data = vec![0u8; n * len * 8];
    let records: Vec<u8> = versions.iter().flat_map(|&v| record(v, v as f32 / 2.0)).collect();
    t.insert_batch(&[&data], n, len, &vec![1.0; n], &records, None).unwrap()
}

#[test]
fn attributes_come_back_with_draws_and_update_by_key() {
    let s = store(1024);
    let t = versioned(&s, SelectorSpec::Fifo, 100, None);
    let keys = insert(&t, &[3, 4], 1);
    let b = t.sample(1, None).unwrap();
    assert_eq!(b.attributes, record(3, 1.5));
    assert_eq!(t.update_attribute(&[keys[0], 999], "reward", &9.0f32.to_le_bytes().repeat(2)).unwrap(), 1);
    let (records, found) = t.attributes_of(&[keys[0], keys[1], 999]);
    assert_eq!(found, [true, true, false]);
    assert_eq!(records, [record(3, 9.0), record(4, 2.0), vec![0; 12]].concat());
    let e = t.update_attribute(&keys, "nope", &[]).unwrap_err().to_string();
    assert!(e.contains("no attribute 'nope'") && e.contains("version"), "{e}");
    let e = t.update_attribute(&keys, "reward", &[0; 4]).unwrap_err().to_string();
    assert!(e.contains("2 keys but 4 bytes"), "{e}");
    // Missing records are refused and nothing is inserted.
    let e = t.insert_batch(&[&[0u8; 8]], 1, 1, &[1.0], &[], None).unwrap_err().to_string();
    assert!(e.contains("needs its attributes"), "{e}");
    assert_eq!(t.size(), 2);
}

#[test]
fn set_version_removes_the_stale_at_once_and_late_inserts_are_dropped() {
    let s = store(4096);
    let t = versioned(&s, SelectorSpec::Uniform, 1000, Some(1));
    insert(&t, &[0, 1, 2, 2, 0], 1);
    assert_eq!(t.set_version(2).unwrap(), 2);
    let e = t.set_version(1).unwrap_err().to_string();
    assert!(e.contains("below the current version 2"), "{e}");
    assert_eq!(t.version(), Some(2));
    let limiter_inserts = t.info().limiter_inserts;
    let keys = insert(&t, &[0, 3], 1);
    assert_eq!(keys[0], DROPPED);
    assert_ne!(keys[1], DROPPED);
    let info = t.info();
    assert_eq!((info.size, info.stale_removed, info.stale_dropped), (4, 2, 1));
    assert_eq!(info.limiter_inserts, limiter_inserts + 1, "a dropped insert is not counted by the limiter");
    let b = t.sample(200, None).unwrap();
    for r in b.attributes.chunks(12) {
        assert!(Attributes::read_i64(r, 0) >= 1);
    }
    let stats = t.stats();
    assert_eq!(stats["staleness"]["draws"], 200);
    // Without max_staleness the version is tracked and nothing leaves.
    let s2 = store(1024);
    let u = versioned(&s2, SelectorSpec::Uniform, 100, None);
    insert(&u, &[0], 1);
    assert_eq!(u.set_version(10).unwrap(), 0);
    assert_eq!(u.size(), 1);
}

#[test]
fn max_staleness_needs_an_int64_version() {
    let s = store(1024);
    let mut c = versioned(&s, SelectorSpec::Uniform, 10, None).config().clone();
    c.name = "u".into();
    c.attributes = Attributes::new(vec![AttributeSpec { name: "version".into(), dtype: DType::Float32 }]).unwrap();
    c.max_staleness = Some(1);
    let e = Table::new(c, &s).err().expect("refused").to_string();
    assert!(e.contains("'version' to be int64"), "{e}");
}

#[test]
fn a_token_budget_takes_whole_items_until_the_next_would_not_fit() {
    let s = store(8192);
    let t = versioned(&s, SelectorSpec::Fifo, 100, None);
    // Fifo picks the oldest every time: 5-step items, budget 23 -> 4 items.
    insert(&t, &[0], 5);
    let b = t.sample_tokens(23, None).unwrap();
    assert_eq!(b.len(), 4);
    assert_eq!(b.items.iter().map(|i| i.length as u64).sum::<u64>(), 20);
    let before = t.info();
    let e = t.sample_tokens(4, None).unwrap_err().to_string();
    assert!(e.contains("5 steps, more than the whole token budget of 4"), "{e}");
    let after = t.info();
    assert_eq!((before.num_samples, before.limiter_samples), (after.num_samples, after.limiter_samples));
    assert!(t.sample_tokens(0, None).is_err());
}

#[test]
fn a_token_budget_waits_only_for_the_first_item() {
    let s = store(8192);
    let t = versioned(&s, SelectorSpec::Fifo, 100, None);
    let e = t.sample_tokens(10, Some(std::time::Duration::from_millis(20))).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    // A queue-like table: one item sampleable once; the budget stops when it is gone.
    let mut c = t.config().clone();
    c.name = "q".into();
    c.max_times_sampled = 1;
    let q = Table::new(c, &s).unwrap();
    insert(&q, &[0, 0, 0], 2);
    let b = q.sample_tokens(1000, None).unwrap();
    assert_eq!(b.len(), 3);
    assert_eq!(q.size(), 0);
}

#[test]
fn writers_give_records_with_each_item() {
    let s = store(1024);
    let t = versioned(&s, SelectorSpec::Fifo, 10, Some(0));
    let mut w = Writer::new(s.clone(), None).unwrap();
    for v in 0..3i64 {
        w.append(&[&v.to_le_bytes()], None).unwrap();
    }
    let k = w.create_item(&t, 2, 1.0, &record(0, 1.0), None).unwrap();
    t.set_version(1).unwrap();
    assert_eq!(t.size(), 0);
    assert_eq!(w.create_item(&t, 2, 1.0, &record(0, 1.0), None).unwrap(), DROPPED);
    let keys = w.create_items(&t, 1, &[1.0, 1.0], &[record(1, 0.0), record(2, 0.0)].concat(), None).unwrap();
    assert!(keys.iter().all(|&k| k != DROPPED) && k != DROPPED);
    assert!(w.create_item(&t, 1, 1.0, &[0; 3], None).is_err());
    assert_eq!(t.size(), 2);
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<i64>),
    SetVersion(i64),
    Delete(usize),
    Sample(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        prop::collection::vec(-2i64..12, 1..6).prop_map(Op::Insert),
        (0i64..3).prop_map(Op::SetVersion),
        (0usize..40).prop_map(Op::Delete),
        (1usize..8).prop_map(Op::Sample),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The table's items and counters match a plain model: a map key -> version,
    /// with set_version dropping every version below `current - k` and stale
    /// inserts never entering; no draw returns a stale item.
    #[test]
    fn staleness_matches_a_reference_model(ops in prop::collection::vec(op(), 1..40), k in 0u64..3) {
        let s = store(1 << 14);
        let t = versioned(&s, SelectorSpec::Uniform, 1000, Some(k));
        let mut model: BTreeMap<u64, i64> = BTreeMap::new();
        let (mut current, mut removed, mut dropped) = (0i64, 0u64, 0u64);
        let oldest = |c: i64| c - k as i64;
        for op in ops {
            match op {
                Op::Insert(versions) => {
                    let keys = insert(&t, &versions, 1);
                    for (key, v) in keys.into_iter().zip(versions) {
                        if v < oldest(current) {
                            prop_assert_eq!(key, DROPPED);
                            dropped += 1;
                        } else {
                            model.insert(key, v);
                        }
                    }
                }
                Op::SetVersion(step) => {
                    current += step;
                    let before = model.len();
                    model.retain(|_, v| *v >= oldest(current));
                    let gone = (before - model.len()) as u64;
                    prop_assert_eq!(t.set_version(current).unwrap(), gone);
                    removed += gone;
                }
                Op::Delete(i) => {
                    if let Some(&key) = model.keys().nth(i % model.len().max(1)) {
                        prop_assert_eq!(t.delete(&[key]), 1);
                        model.remove(&key);
                    }
                }
                Op::Sample(n) => {
                    if model.is_empty() {
                        continue;
                    }
                    let b = t.sample(n, None).unwrap();
                    for (item, r) in b.items.iter().zip(b.attributes.chunks(12)) {
                        prop_assert_eq!(model.get(&item.key), Some(&Attributes::read_i64(r, 0)));
                    }
                }
            }
            let info = t.info();
            prop_assert_eq!(info.size, model.len() as u64);
            prop_assert_eq!((info.stale_removed, info.stale_dropped), (removed, dropped));
            let held: Vec<u64> = t.items().iter().map(|i| i.key).collect();
            let mut held_sorted = held.clone();
            held_sorted.sort_unstable();
            prop_assert_eq!(held_sorted, model.keys().copied().collect::<Vec<_>>());
        }
    }
}

// --- groups ---------------------------------------------------------------------------

/// A table with attributes `version, group` (int64) and groups of `size`.
fn grouped(s: &Store, sampler: SelectorSpec, max_size: u64, size: u32, timeout: Option<u64>, on_timeout: OnTimeout) -> Table {
    let attributes = Attributes::new(vec![
        AttributeSpec { name: "version".into(), dtype: DType::Int64 },
        AttributeSpec { name: "group".into(), dtype: DType::Int64 },
    ])
    .unwrap();
    let mut c = versioned(s, sampler, max_size, Some(1)).config().clone();
    c.name = format!("g{}", s.table_names().len());
    c.attributes = attributes;
    c.groups = Some(GroupConfig { size, timeout: timeout.map(std::time::Duration::from_secs), on_timeout });
    Table::new(c, s).unwrap()
}

fn member(version: i64, group: i64) -> Vec<u8> {
    [version.to_le_bytes(), group.to_le_bytes()].concat()
}

/// Inserts one one-step item per `(version, group)`; returns the keys.
fn arrive(t: &Table, members: &[(i64, i64)]) -> Result<Vec<u64>> {
    let n = members.len();
    let records: Vec<u8> = members.iter().flat_map(|&(v, g)| member(v, g)).collect();
    t.insert_batch(&[&vec![0u8; n * 8]], n, 1, &vec![1.0; n], &records, None)
}

fn groups_info(t: &Table) -> serde_json::Value {
    t.info().groups.unwrap()
}

#[test]
fn groups_are_admitted_whole_in_any_arrival_order() {
    let s = store(4096);
    let t = grouped(&s, SelectorSpec::Fifo, 100, 3, None, OnTimeout::Drop);
    let keys = arrive(&t, &[(0, 7), (0, 8), (0, 7)]).unwrap();
    assert!(keys.iter().all(|&k| k != DROPPED));
    assert_eq!(t.size(), 0);
    assert!(t.sample(3, Some(std::time::Duration::from_millis(10))).is_err(), "nothing is sampleable yet");
    assert_eq!(groups_info(&t)["pending_items"], 3);
    arrive(&t, &[(0, 8), (0, 8), (0, 7)]).unwrap();
    assert_eq!(t.size(), 6);
    // Fifo by completion order: group 8 completed first.
    let b = t.sample(3, None).unwrap();
    let groups: Vec<i64> = b.attributes.chunks(16).map(|r| Attributes::read_i64(r, 8)).collect();
    assert_eq!(groups, [8, 8, 8]);
    assert_eq!(b.table_size, 2, "a grouped draw picks among groups");
    // A member of a complete group is refused, naming it, and nothing changes.
    let before = t.info();
    let e = arrive(&t, &[(0, 9), (0, 7)]).unwrap_err().to_string();
    assert!(e.contains("group 7 cannot take 1 more"), "{e}");
    assert_eq!(t.info(), before);
    let e = arrive(&t, &[(0, 9); 4]).unwrap_err().to_string();
    assert!(e.contains("group 9 cannot take 4 more"), "{e}");
    assert!(t.sample(2, None).unwrap_err().to_string().contains("multiple of group_size"));
}

#[test]
fn a_group_leaves_whole() {
    let s = store(4096);
    let t = grouped(&s, SelectorSpec::Fifo, 6, 2, None, OnTimeout::Drop);
    let keys = arrive(&t, &[(0, 1), (0, 1), (0, 2), (0, 2), (0, 3), (0, 3)]).unwrap();
    assert_eq!(t.size(), 6);
    // Admitting a fourth group evicts the oldest whole.
    arrive(&t, &[(0, 4), (0, 4)]).unwrap();
    assert_eq!((t.size(), t.info().num_evictions), (6, 2));
    // Deleting one member removes its group.
    assert_eq!(t.delete(&[keys[2]]), 2);
    assert_eq!(t.size(), 4);
    // A group is as old as its oldest member: max_staleness 1, set_version 2.
    arrive(&t, &[(2, 5), (0, 5)]).unwrap();
    arrive(&t, &[(2, 6)]).unwrap(); // pending, fresh
    arrive(&t, &[(0, 7)]).unwrap(); // pending, stale at version 2
    assert_eq!(t.set_version(2).unwrap(), 2 + 2 + 2 + 1, "groups 3, 4 and 5, and pending group 7");
    assert_eq!(t.size(), 0);
    assert_eq!(groups_info(&t)["pending_items"], 1);
    // A stale arrival drops its pending group with it.
    let k = arrive(&t, &[(0, 6)]).unwrap();
    assert_eq!(k, [DROPPED]);
    assert_eq!(groups_info(&t)["pending_items"], 0);
    assert_eq!(t.info().stale_dropped, 2);
}

#[test]
fn max_times_sampled_counts_per_group() {
    let s = store(4096);
    let mut c = grouped(&s, SelectorSpec::Fifo, 100, 2, None, OnTimeout::Drop).config().clone();
    c.name = "once".into();
    c.max_times_sampled = 1;
    let t = Table::new(c, &s).unwrap();
    arrive(&t, &[(0, 1), (0, 1), (0, 2), (0, 2)]).unwrap();
    let b = t.sample(4, None).unwrap();
    let groups: Vec<i64> = b.attributes.chunks(16).map(|r| Attributes::read_i64(r, 8)).collect();
    assert_eq!(groups, [1, 1, 2, 2]);
    assert_eq!(t.size(), 0);
}

#[test]
fn incomplete_groups_time_out_by_the_clock() {
    let s = store(4096);
    let drop = grouped(&s, SelectorSpec::Fifo, 100, 3, Some(30), OnTimeout::Drop);
    let partial = grouped(&s, SelectorSpec::Fifo, 100, 3, Some(30), OnTimeout::Partial);
    for t in [&drop, &partial] {
        arrive(t, &[(0, 1), (0, 1), (0, 2)]).unwrap();
        let later = Instant::now() + std::time::Duration::from_secs(31);
        t.shared.state.lock().expire_groups_at(later, &s);
    }
    let (d, p) = (groups_info(&drop), groups_info(&partial));
    assert_eq!((drop.size(), &d["dropped"], &d["pending"]), (0, &serde_json::json!(2), &serde_json::json!(0)));
    assert_eq!((partial.size(), &p["partial"], &p["live"]), (3, &serde_json::json!(2), &serde_json::json!(2)));
    // A partial group's size is what it has.
    let b = partial.sample(3, None).unwrap();
    assert_eq!(b.len(), 2);
    // Not yet due: nothing happens.
    arrive(&drop, &[(0, 3)]).unwrap();
    drop.shared.state.lock().expire_groups_at(Instant::now() + std::time::Duration::from_secs(29), &s);
    assert_eq!(groups_info(&drop)["pending"], 1);
}

#[test]
fn a_group_is_picked_by_its_priority_sum() {
    let s = store(4096);
    let t = grouped(&s, SelectorSpec::Prioritized { priority_exponent: 1.0 }, 100, 2, None, OnTimeout::Drop);
    let keys = arrive(&t, &[(0, 1), (0, 1), (0, 2), (0, 2)]).unwrap();
    assert_eq!(t.update_priorities(&keys, &[1.0, 2.0, 0.5, 0.5]).unwrap(), 4);
    let b = t.sample(2, None).unwrap();
    let p: Vec<f64> = b.items.iter().map(|i| i.probability).collect();
    let group = Attributes::read_i64(&b.attributes[..16], 8);
    let expected = if group == 1 { 3.0 / 4.0 } else { 1.0 / 4.0 };
    assert!(p.iter().all(|&q| (q - expected).abs() < 1e-12), "{p:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Group admission against a plain model (pending counts per id, admitted
    /// ids): in any arrival order a group is sampleable exactly when all its
    /// members are in, a member beyond group_size is refused with nothing
    /// changed, and a draw returns one whole group side by side.
    #[test]
    fn group_admission_matches_a_reference_model(batches in prop::collection::vec(prop::collection::vec(0i64..6, 1..4), 1..25)) {
        const G: usize = 3;
        let s = store(1 << 14);
        let t = grouped(&s, SelectorSpec::Uniform, 1000, G as u32, None, OnTimeout::Drop);
        let mut pending: BTreeMap<i64, usize> = BTreeMap::new();
        let mut live: Vec<i64> = Vec::new();
        for batch in batches {
            let mut arriving: BTreeMap<i64, usize> = BTreeMap::new();
            for &g in &batch {
                *arriving.entry(g).or_default() += 1;
            }
            let refused = arriving.iter().any(|(g, n)| live.contains(g) || pending.get(g).copied().unwrap_or(0) + n > G);
            let members: Vec<(i64, i64)> = batch.iter().map(|&g| (0, g)).collect();
            let before = t.info();
            match arrive(&t, &members) {
                Err(_) => {
                    prop_assert!(refused);
                    prop_assert_eq!(t.info(), before);
                }
                Ok(_) => {
                    prop_assert!(!refused);
                    for (g, n) in arriving {
                        let p = pending.entry(g).or_default();
                        *p += n;
                        if *p == G {
                            pending.remove(&g);
                            live.push(g);
                        }
                    }
                }
            }
            prop_assert_eq!(t.size(), (live.len() * G) as u64);
            let info = groups_info(&t);
            prop_assert_eq!(info["pending_items"].as_u64().unwrap(), pending.values().sum::<usize>() as u64);
            if !live.is_empty() {
                let b = t.sample(G, None).unwrap();
                let ids: Vec<i64> = b.attributes.chunks(16).map(|r| Attributes::read_i64(r, 8)).collect();
                prop_assert_eq!(ids.len(), G);
                prop_assert!(ids.iter().all(|&g| g == ids[0]) && live.contains(&ids[0]));
            }
        }
    }
}

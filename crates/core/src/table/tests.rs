//! Table tests: eviction, max_times_sampled, keys, rate limiting, bad input.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::*;
use crate::item::RowRange;
use crate::sample::{Collect, SampleBatch};
use crate::selectors::external::Candidate;
use crate::signature::{DType, Field, Signature};
use crate::writer::Writer;

fn store(capacity: u64) -> Store {
    let sig = Signature::new(vec![Field::new("x", DType::Int64, vec![]).unwrap()]).unwrap();
    Store::new(sig, capacity, 4, None).unwrap()
}

fn config(name: &str, sampler: SelectorSpec, remover: SelectorSpec, max_size: u64) -> TableConfig {
    TableConfig {
        name: name.into(),
        sampler,
        remover,
        max_size,
        max_times_sampled: 0,
        rate_limiter: RateLimiterConfig::min_size(1).unwrap(),
        seed: Some(0),
        evict_when_store_full: true,
        external_selection: false,
        extensions: crate::ExtensionSpec::defaults(),
        attributes: Default::default(),
        max_staleness: None,
        groups: None,
    }
}

/// Inserts items whose single step holds `value`, returning their keys.
fn put(table: &Table, values: &[i64], priorities: &[f64]) -> Vec<u64> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    table.insert_batch(&[&bytes], values.len(), 1, priorities, &[], None).unwrap()
}

fn values(table: &Table, batch: &SampleBatch) -> Vec<i64> {
    let mut out = vec![0u8; 8 * batch.len() * batch.max_length() as usize];
    batch.gather(0, batch.max_length(), &mut out);
    let _ = table;
    out.chunks(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn fifo_remover_evicts_oldest_first() {
    let s = store(64);
    let t = Table::new(config("t", SelectorSpec::Fifo, SelectorSpec::Fifo, 3), &s).unwrap();
    let keys = put(&t, &[1, 2, 3, 4, 5], &[1.0; 5]);
    assert_eq!(t.size(), 3);
    assert_eq!(t.items().iter().map(|i| i.key).collect::<Vec<_>>(), keys[2..]);
    let b = t.sample(1, Some(Duration::ZERO)).unwrap();
    assert_eq!(values(&t, &b), vec![3]);
    assert_eq!(t.info().num_evictions, 2);
}

#[test]
fn max_times_sampled_removes_within_one_batch() {
    let s = store(64);
    let mut c = config("q", SelectorSpec::Fifo, SelectorSpec::Fifo, 10);
    c.max_times_sampled = 1;
    let t = Table::new(c, &s).unwrap();
    put(&t, &[10, 20, 30], &[1.0; 3]);
    let b = t.sample(3, Some(Duration::ZERO)).unwrap();
    assert_eq!(values(&t, &b), vec![10, 20, 30]);
    assert_eq!(t.size(), 0);
    assert!(b.items.iter().all(|i| i.times_sampled == 1));
}

#[test]
fn stale_keys_are_skipped_and_counted() {
    let s = store(64);
    let t = Table::new(config("t", SelectorSpec::Uniform, SelectorSpec::Fifo, 2), &s).unwrap();
    let keys = put(&t, &[1, 2, 3], &[1.0; 3]);
    // keys[0] was evicted; its slot was reused with a new generation.
    assert_eq!(t.update_priorities(&keys, &[5.0, 5.0, 5.0]).unwrap(), 2);
    assert_eq!(t.delete(&keys), 2);
    assert_eq!(t.delete(&keys), 0);
    assert_eq!(t.size(), 0);
}

#[test]
fn bad_priority_changes_nothing_and_names_the_key() {
    let s = store(64);
    let t = Table::new(config("t", SelectorSpec::Prioritized { priority_exponent: 1.0 }, SelectorSpec::Fifo, 8), &s).unwrap();
    let keys = put(&t, &[1, 2], &[1.0, 2.0]);
    let e = t.update_priorities(&keys, &[3.0, f64::NAN]).unwrap_err().to_string();
    assert!(e.contains(&keys[1].to_string()) && e.contains("NaN"), "{e}");
    let p: Vec<f64> = t.items().iter().map(|i| i.priority).collect();
    assert_eq!(p, vec![1.0, 2.0]);
    let free = s.free_blocks();
    let e = t.insert_batch(&[&[0u8; 16]], 2, 1, &[1.0, -1.0], &[], None).unwrap_err().to_string();
    assert!(e.contains("item 1") && e.contains("-1"), "{e}");
    assert_eq!((t.size(), s.free_blocks()), (2, free));
}

#[test]
fn max_size_larger_than_store_is_rejected() {
    let s = store(8);
    let e = Table::new(config("big", SelectorSpec::Uniform, SelectorSpec::Fifo, 9), &s).err().unwrap().to_string();
    assert!(e.contains("'big'") && e.contains("max_size 9") && e.contains("8 steps"), "{e}");
    assert!(Table::new(config("z", SelectorSpec::Uniform, SelectorSpec::Fifo, 0), &s).is_err());
}

#[test]
fn duplicate_table_names_on_one_store_are_rejected() {
    let s = store(8);
    let _a = Table::new(config("a", SelectorSpec::Uniform, SelectorSpec::Fifo, 4), &s).unwrap();
    let e = Table::new(config("a", SelectorSpec::Uniform, SelectorSpec::Fifo, 4), &s).err().unwrap();
    assert!(e.to_string().contains("already exists"));
}

#[test]
fn blocks_return_when_items_leave_every_table() {
    let s = store(16);
    let a = Table::new(config("a", SelectorSpec::Uniform, SelectorSpec::Fifo, 16), &s).unwrap();
    let b = Table::new(config("b", SelectorSpec::Uniform, SelectorSpec::Fifo, 16), &s).unwrap();
    let mut w = Writer::new(s.clone(), None).unwrap();
    for v in 0..4i64 {
        w.append(&[&v.to_ne_bytes()], None).unwrap();
    }
    let ka = w.create_item(&a, 4, 1.0, &[], None).unwrap();
    let kb = w.create_item(&b, 2, 1.0, &[], None).unwrap();
    w.close();
    assert_eq!(s.free_blocks(), 3);
    a.delete(&[ka]);
    assert_eq!(s.free_blocks(), 3, "table b still references the block");
    b.delete(&[kb]);
    assert_eq!(s.free_blocks(), 4);
}

#[test]
fn sample_times_out_on_empty_table_and_counts_blocked_time() {
    let s = store(8);
    let t = Table::new(config("t", SelectorSpec::Uniform, SelectorSpec::Fifo, 4), &s).unwrap();
    match t.sample(2, Some(Duration::from_millis(30))) {
        Err(Error::Timeout { message, partial: Partial::Sampled(b) }) => {
            assert!(message.contains("'t'") && message.contains("0 of 2"), "{message}");
            assert!(b.batch().is_empty());
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(t.info().blocked_sample_seconds >= 0.025);
    assert!(matches!(t.sample(1, Some(Duration::ZERO)), Err(Error::Timeout { .. })));
}

#[test]
fn blocked_sampler_wakes_on_insert() {
    let s = store(8);
    let t = Table::new(config("t", SelectorSpec::Uniform, SelectorSpec::Fifo, 4), &s).unwrap();
    let t2 = t.clone();
    let h = thread::spawn(move || t2.sample(1, None).map(|b| b.items[0].key));
    thread::sleep(Duration::from_millis(20));
    let keys = put(&t, &[7], &[1.0]);
    assert_eq!(h.join().unwrap().unwrap(), keys[0]);
}

#[test]
fn queue_blocks_inserts_until_sampled() {
    let s = store(32);
    let mut c = config("q", SelectorSpec::Fifo, SelectorSpec::Fifo, 2);
    c.max_times_sampled = 1;
    c.rate_limiter = RateLimiterConfig::queue(2).unwrap();
    let t = Table::new(c, &s).unwrap();
    put(&t, &[1, 2], &[1.0; 2]);
    let bytes = 3i64.to_ne_bytes();
    match t.insert_batch(&[&bytes], 1, 1, &[1.0], &[], Some(Duration::from_millis(10))) {
        Err(Error::Timeout { partial: Partial::Inserted(k), .. }) => assert!(k.is_empty()),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let t2 = t.clone();
    let h = thread::spawn(move || put(&t2, &[3, 4], &[1.0; 2]));
    let got = values(&t, &t.sample(4, None).unwrap());
    h.join().unwrap();
    assert_eq!(got, vec![1, 2, 3, 4]);
}

#[test]
fn reset_empties_the_table_and_invalidates_keys() {
    let s = store(16);
    let t = Table::new(config("t", SelectorSpec::Uniform, SelectorSpec::Fifo, 8), &s).unwrap();
    let keys = put(&t, &[1, 2, 3], &[1.0; 3]);
    t.reset();
    assert_eq!(t.size(), 0);
    put(&t, &[4], &[1.0]);
    assert_eq!(t.delete(&keys), 0);
    assert_eq!(t.size(), 1);
}

#[test]
fn sampled_rows_stay_valid_after_eviction() {
    let s = store(8);
    let t = Table::new(config("t", SelectorSpec::Fifo, SelectorSpec::Fifo, 4), &s).unwrap();
    put(&t, &[1, 2, 3, 4], &[1.0; 4]);
    let b = t.sample(1, None).unwrap();
    // Evict everything and fill the store again: the sampled block is still held,
    // so the new items go to the other block.
    t.reset();
    assert_eq!(s.free_blocks(), 1);
    put(&t, &[5, 6, 7, 8], &[1.0; 4]);
    assert_eq!(s.free_blocks(), 0);
    assert_eq!(values(&t, &b), vec![1]);
    drop(b);
    assert_eq!(s.free_blocks(), 1);
}

#[test]
fn concurrent_inserts_and_samples_account_exactly() {
    let s = store(1 << 14);
    let mut c = config("q", SelectorSpec::Fifo, SelectorSpec::Fifo, 64);
    c.max_times_sampled = 1;
    c.rate_limiter = RateLimiterConfig::queue(64).unwrap();
    let t = Table::new(c, &s).unwrap();
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let t = t.clone();
            thread::spawn(move || {
                for i in 0..500 {
                    put(&t, &[w * 1000 + i], &[1.0]);
                }
            })
        })
        .collect();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (t, seen) = (t.clone(), seen.clone());
            thread::spawn(move || {
                for _ in 0..750 {
                    let b = t.sample(1, None).unwrap();
                    seen.lock().extend(values(&t, &b));
                }
            })
        })
        .collect();
    writers.into_iter().for_each(|h| h.join().unwrap());
    readers.into_iter().for_each(|h| h.join().unwrap());
    let mut seen = seen.lock().clone();
    seen.sort();
    let mut want: Vec<i64> = (0..3).flat_map(|w| (0..500).map(move |i| w * 1000 + i)).collect();
    want.sort();
    assert_eq!(seen, want, "every item sampled exactly once");
    assert_eq!(t.size(), 0);
}

#[test]
fn full_store_evicts_the_oldest_block_like_a_ring() {
    let s = store(8);
    let t = Table::new(config("t", SelectorSpec::Fifo, SelectorSpec::Uniform, 8), &s).unwrap();
    put(&t, &[1, 2, 3, 4, 5, 6, 7, 8], &[1.0; 8]);
    put(&t, &[9, 10], &[1.0; 2]);
    let info = t.info();
    assert_eq!((info.size, info.num_store_evictions, info.num_evictions), (6, 4, 4));
    let mut left = Vec::new();
    for item in t.items() {
        left.extend(values(&t, &t.sample(1, None).unwrap()));
        t.delete(&[item.key]);
    }
    assert_eq!(left, vec![5, 6, 7, 8, 9, 10]);
}

#[test]
fn queues_keep_their_items_when_the_store_is_full() {
    let s = store(8);
    let mut c = config("q", SelectorSpec::Fifo, SelectorSpec::Fifo, 8);
    c.max_times_sampled = 1;
    c.evict_when_store_full = false;
    let t = Table::new(c, &s).unwrap();
    put(&t, &[1, 2, 3, 4, 5, 6, 7, 8], &[1.0; 8]);
    let bytes = 9i64.to_ne_bytes();
    let e = t.insert_batch(&[&bytes], 1, 1, &[1.0], &[], None).unwrap_err();
    assert!(matches!(e, Error::ResourceExhausted(_)), "{e}");
    assert_eq!(t.size(), 8);
    // Consuming the first block's items makes room.
    values(&t, &t.sample(4, None).unwrap());
    put(&t, &[9], &[1.0]);
    assert_eq!(values(&t, &t.sample(5, None).unwrap()), vec![5, 6, 7, 8, 9]);
}

#[test]
fn store_pressure_never_evicts_blocks_a_writer_still_holds() {
    let s = store(8);
    let t = Table::new(config("t", SelectorSpec::Fifo, SelectorSpec::Fifo, 8), &s).unwrap();
    // Asked to keep 8 steps, the writer holds both blocks whatever the pressure.
    let mut w = Writer::new(s.clone(), Some(8)).unwrap();
    for v in 0..8i64 {
        w.append(&[&v.to_ne_bytes()], None).unwrap();
        w.create_item(&t, 1, 1.0, &[], None).unwrap();
    }
    // The episode still holds both blocks: evicting their items would free nothing.
    let e = w.append(&[&8i64.to_ne_bytes()], None).unwrap_err();
    assert!(matches!(e, Error::ResourceExhausted(_)), "{e}");
    let m = e.to_string();
    assert!(m.contains("2 by writers' episode history") && m.contains("This writer holds 8 steps") && m.contains("max_sequence_length is 8"), "{m}");
    assert_eq!(t.size(), 8);
    w.end_episode();
    w.append(&[&8i64.to_ne_bytes()], None).unwrap();
    assert_eq!(t.size(), 4);
    assert_eq!(t.info().num_store_evictions, 4);
}

#[test]
fn an_interrupt_check_stops_a_blocked_sample_with_its_partial_result() {
    let s = store(8);
    let t = Table::new(config("t", SelectorSpec::Uniform, SelectorSpec::Fifo, 4), &s).unwrap();
    let calls = std::sync::atomic::AtomicU32::new(0);
    let stop = || calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 2;
    let wait = crate::Wait { timeout: None, interrupt: Some(&stop) };
    match t.sample(1, wait) {
        Err(Error::Interrupted { partial: Partial::Sampled(b) }) => assert!(b.batch().is_empty()),
        other => panic!("expected an interruption, got {other:?}"),
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[test]
fn large_gathers_split_across_threads_copy_every_row_in_place() {
    let row = 64 << 10;
    let sig = Signature::new(vec![Field::new("x", DType::UInt8, vec![row]).unwrap()]).unwrap();
    let s = Store::new(sig, 256, 8, None).unwrap();
    let mut c = config("q", SelectorSpec::Fifo, SelectorSpec::Fifo, 256);
    c.max_times_sampled = 1;
    let t = Table::new(c, &s).unwrap();
    let n = 200;
    let data: Vec<u8> = (0..n).flat_map(|i| (0..row).map(move |j| (i * 7 + j / 4096) as u8)).collect();
    t.insert_batch(&[&data], n, 1, &vec![1.0; n], &[], None).unwrap();
    let b = t.sample(n, Some(Duration::ZERO)).unwrap();
    assert!(b.items.len() * row > 2 * crate::sample::PARALLEL_BYTES);
    let mut out = vec![0u8; n * row];
    b.gather(0, 1, &mut out);
    assert!(out == data, "rows differ after a parallel gather");
}

/// Candidates for the items whose single step holds each of `values`, by the
/// mirror's view of the table (slot and sequence from the drained changes).
fn candidates(t: &Table, mirror: &mut std::collections::HashMap<u32, (u64, f64)>, keys: &[u64], values: &[i64], want: &[i64]) -> Vec<Candidate> {
    for ch in t.drain_changes().unwrap() {
        match ch.item {
            Some(item) => mirror.insert(ch.slot, item),
            None => mirror.remove(&ch.slot),
        };
    }
    want.iter()
        .map(|w| {
            let key = keys[values.iter().position(|v| v == w).unwrap()];
            let slot = key as u32;
            let (seq, _) = mirror.get(&slot).copied().unwrap_or((u64::MAX, 0.0));
            Candidate { slot, seq, probability: 0.5 }
        })
        .collect()
}

#[test]
fn external_draws_use_each_candidate_once_and_skip_stale_ones() {
    let s = store(64);
    let mut c = config("g", SelectorSpec::Uniform, SelectorSpec::Fifo, 10);
    c.external_selection = true;
    let t = Table::new(c, &s).unwrap();
    let vals = [1, 2, 3, 4];
    let keys = put(&t, &vals, &[1.0; 4]);
    let mut mirror = Default::default();
    let cands = candidates(&t, &mut mirror, &keys, &vals, &[3, 3, 1]);
    assert_eq!(mirror.len(), 4);
    // Host sampling is refused: the picks come from outside.
    assert!(matches!(t.sample(1, None), Err(Error::InvalidArgument(_))));
    let (b, starved) = t.sample_candidates(None, 3, None, &cands).unwrap();
    assert!(!starved);
    assert_eq!(values(&t, &b), vec![3, 3, 1]);
    assert!(b.items.iter().all(|i| i.probability == 0.5));
    assert_eq!(b.items[1].times_sampled, 2);
    // Deleted items are skipped; running out of candidates is reported.
    t.delete(&[keys[2]]);
    let cands = candidates(&t, &mut mirror, &keys, &vals, &[2]);
    let stale = Candidate { slot: keys[2] as u32, seq: 2, probability: 0.5 };
    let (b, starved) = t.sample_candidates(Some(b), 6, None, &[stale, cands[0]]).unwrap();
    assert!(starved);
    assert_eq!(values(&t, &b), vec![3, 3, 1, 2]);
    assert_eq!(mirror.len(), 3);
    assert_eq!(t.info().num_samples, 4);
}

#[test]
fn external_repeat_order_draws_the_first_until_it_is_used_up() {
    let s = store(64);
    let mut c = config("q", SelectorSpec::Fifo, SelectorSpec::Fifo, 10);
    c.external_selection = true;
    c.max_times_sampled = 2;
    let t = Table::new(c, &s).unwrap();
    let vals = [10, 20, 30];
    let keys = put(&t, &vals, &[1.0; 3]);
    let mut mirror = Default::default();
    let cands = candidates(&t, &mut mirror, &keys, &vals, &[10, 20, 30]);
    let (b, starved) = t.sample_candidates(None, 5, None, &cands).unwrap();
    assert!(!starved);
    // Each item twice (max_times_sampled), in the given order: as the host Fifo.
    assert_eq!(values(&t, &b), vec![10, 10, 20, 20, 30]);
    assert_eq!(t.size(), 1);
    let changes = t.drain_changes().unwrap();
    assert_eq!(changes.iter().filter(|c| c.item.is_none()).count(), 2);
}

#[test]
fn top_k_draws_the_best_items_in_order() {
    let s = store(64);
    let t = Table::new(config("k", SelectorSpec::TopK, SelectorSpec::Fifo, 10), &s).unwrap();
    put(&t, &[1, 2, 3, 4], &[0.5, 3.0, 3.0, 1.0]);
    let b = t.sample(3, None).unwrap();
    assert_eq!(values(&t, &b), vec![2, 3, 4]);
    let b = t.sample(6, None).unwrap();
    assert_eq!(values(&t, &b), vec![2, 3, 4, 1, 2, 3]);
}

/// A copy of `t` over a new store: the snapshot's blocks written back at the same rows.
fn restored(t: &Table) -> (Store, Table) {
    let (snap, pins) = t.snapshot();
    let src = t.store();
    let dst = Store::new(src.signature().clone(), src.capacity(), src.block_steps(), None).unwrap();
    let reserved = dst.reserve_blocks(pins.blocks()).unwrap();
    let bs = src.block_steps() as u64;
    for &b in pins.blocks() {
        let range = RowRange { start: b as u64 * bs, len: bs as u32 };
        let mut buf = vec![0u8; bs as usize * src.row_bytes(0)];
        // SAFETY: the snapshot's pins hold these blocks for the duration of the read.
        unsafe { src.columns().read_ranges(0, &[range], &mut buf) };
        dst.write_reserved(&reserved, 0, range.start, &buf).unwrap();
    }
    let t2 = Table::restore(&snap, &dst).unwrap();
    drop(reserved);
    drop(pins);
    (dst, t2)
}

#[test]
fn restored_tables_continue_exactly() {
    for (sampler, remover) in [
        (SelectorSpec::Uniform, SelectorSpec::Fifo),
        (SelectorSpec::Prioritized { priority_exponent: 0.7 }, SelectorSpec::Uniform),
        (SelectorSpec::Fifo, SelectorSpec::Lifo),
        (SelectorSpec::MaxHeap, SelectorSpec::MinHeap),
        (SelectorSpec::TopK, SelectorSpec::Fifo),
    ] {
        let s = store(256);
        let mut c = config("t", sampler, remover, 20);
        c.max_times_sampled = 3;
        c.rate_limiter = RateLimiterConfig::sample_to_insert_ratio(2.0, 2, 1000.0).unwrap();
        let t = Table::new(c, &s).unwrap();
        let keys = put(&t, &(0..30).collect::<Vec<_>>(), &(0..30).map(|i| (i % 7) as f64).collect::<Vec<_>>());
        t.delete(&keys[25..27]);
        t.sample(9, None).unwrap();
        let (_s2, t2) = restored(&t);
        assert_eq!(t.items(), t2.items());
        assert_eq!(t.info(), t2.info());
        for round in 0..6 {
            let a = t.sample(5, Some(Duration::ZERO));
            let b = t2.sample(5, Some(Duration::ZERO));
            match (a, b) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(values(&t, &a), values(&t2, &b), "{sampler:?} round {round}");
                    assert_eq!(a.items.iter().map(|i| (i.key, i.times_sampled)).collect::<Vec<_>>(),
                               b.items.iter().map(|i| (i.key, i.times_sampled)).collect::<Vec<_>>());
                }
                (Err(_), Err(_)) => {}
                (a, b) => panic!("{sampler:?}: {a:?} vs {b:?}"),
            }
            let k1 = put(&t, &[100 + round], &[1.5]);
            let k2 = put(&t2, &[100 + round], &[1.5]);
            assert_eq!(k1, k2, "future keys continue the same way");
            assert_eq!(t.info(), t2.info());
        }
    }
}

#[test]
fn restore_refuses_inconsistent_snapshots() {
    let s = store(64);
    let t = Table::new(config("t", SelectorSpec::Uniform, SelectorSpec::Fifo, 10), &s).unwrap();
    put(&t, &[1, 2, 3], &[1.0; 3]);
    let (snap, pins) = t.snapshot();
    let dst = store(64);
    let _reserved = dst.reserve_blocks(pins.blocks()).unwrap();
    let mut bad = snap.clone();
    bad.items[1].key ^= 1 << 40;
    assert!(matches!(Table::restore(&bad, &dst), Err(Error::Corrupt(m)) if m.contains("does not match slot")));
    let mut bad = snap.clone();
    bad.items[0].ranges[0].start = 1 << 40;
    assert!(matches!(Table::restore(&bad, &dst), Err(Error::Corrupt(m)) if m.contains("outside the store")));
    let mut bad = snap.clone();
    bad.rng = "{".into();
    assert!(matches!(Table::restore(&bad, &dst), Err(Error::Corrupt(m)) if m.contains("random generator")));
    let mut bad = snap.clone();
    bad.sampler_order = Some(vec![0, 0, 1]);
    assert!(matches!(Table::restore(&bad, &dst), Err(Error::Corrupt(m)) if m.contains("sampler order")));
    assert_eq!(dst.table_names(), Vec::<String>::new());
    // Blocks already in use cannot be reserved again.
    assert!(dst.reserve_blocks(pins.blocks()).is_err());
}

// ---- a table as a cluster-mode shard (table/shard.rs)

fn figures(s: &ShardSummary) -> crate::cluster::plan::ShardFigures {
    crate::cluster::plan::ShardFigures { size: s.size, mass: s.mass }
}

#[test]
fn a_frozen_table_holds_inserts_until_thawed() {
    let s = store(64);
    let t = Table::new(config("t", SelectorSpec::Uniform, SelectorSpec::Fifo, 10), &s).unwrap();
    t.freeze();
    let err = t.insert_batch(&[&5i64.to_ne_bytes()], 1, 1, &[1.0], &[], Some(Duration::from_millis(30))).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert_eq!(t.size(), 0);
    let t2 = t.clone();
    let waiting = thread::spawn(move || put(&t2, &[7], &[1.0]));
    thread::sleep(Duration::from_millis(30));
    assert_eq!(t.shard_summary().size, 0);
    t.thaw();
    waiting.join().unwrap();
    let sum = t.shard_summary();
    assert_eq!((sum.size, sum.mass, sum.next_seq, sum.max_length), (1, 1.0, 1, 1));
}

#[test]
fn planned_draws_resolve_targets_in_the_shard_and_count_as_samples() {
    use crate::cluster::plan::Target;
    let s = store(64);
    let t = Table::new(config("t", SelectorSpec::Prioritized { priority_exponent: 1.0 }, SelectorSpec::Fifo, 10), &s).unwrap();
    put(&t, &[10, 20, 30], &[1.0, 0.0, 3.0]);
    let sum = t.shard_summary();
    assert_eq!(sum.mass, 4.0);
    let (b, filled) = t.draw_planned(&[Target::Mass(0.5), Target::Mass(1.0), Target::Mass(3.99)], 8.0, 9, &figures(&sum));
    assert_eq!(filled, vec![true; 3]);
    assert_eq!(values(&t, &b), vec![10, 30, 30]);
    assert_eq!(b.items.iter().map(|i| i.probability).collect::<Vec<_>>(), vec![1.0 / 8.0, 3.0 / 8.0, 3.0 / 8.0]);
    assert_eq!(b.table_size, 9);
    assert_eq!(t.info().num_samples, 3);
    let (b, _) = t.draw_planned(&[Target::Index(1)], 9.0, 9, &figures(&sum));
    assert_eq!(b.items[0].probability, 1.0 / 9.0);
}

#[test]
fn planned_draws_after_items_are_used_up_land_on_what_is_left() {
    use crate::cluster::plan::Target;
    let s = store(64);
    let mut c = config("t", SelectorSpec::Uniform, SelectorSpec::Fifo, 10);
    c.max_times_sampled = 1;
    let t = Table::new(c, &s).unwrap();
    put(&t, &[1, 2], &[1.0; 2]);
    let sum = t.shard_summary();
    let (b, filled) = t.draw_planned(&[Target::Index(1), Target::Index(1), Target::Index(0)], 2.0, 2, &figures(&sum));
    assert_eq!(filled, vec![true, true, false]);
    let mut got = values(&t, &b);
    got.sort();
    assert_eq!(got, vec![1, 2]);
    assert_eq!(t.size(), 0);
}

#[test]
fn ranked_candidates_follow_the_sampler_and_ranked_draws_skip_departed_items() {
    let s = store(64);
    for (spec, want) in [
        (SelectorSpec::Fifo, vec![1, 2, 3]),
        (SelectorSpec::Lifo, vec![4, 3, 2]),
        (SelectorSpec::MaxHeap, vec![3, 1, 4]),
        (SelectorSpec::MinHeap, vec![2, 4, 1]),
        (SelectorSpec::TopK, vec![3, 1, 4]),
    ] {
        let t = Table::new(config(&format!("{spec:?}"), spec, SelectorSpec::Fifo, 10), &s).unwrap();
        let keys = put(&t, &[1, 2, 3, 4], &[5.0, 1.0, 9.0, 2.0]);
        let c = t.ranked(3);
        let priority_of = |v: i64| [5.0, 1.0, 9.0, 2.0][v as usize - 1];
        assert_eq!(c.iter().map(|c| c.priority).collect::<Vec<_>>(), want.iter().map(|&v| priority_of(v)).collect::<Vec<_>>(), "{spec:?}");
        t.delete(&keys[..1]);
        let picks: Vec<(u32, u64)> = c.iter().map(|c| (c.slot, c.seq)).collect();
        let (_, filled) = t.draw_ranked(&picks, 4);
        assert_eq!(filled, c.iter().map(|c| c.seq != 0).collect::<Vec<_>>(), "{spec:?}");
    }
    let t = Table::new(config("u", SelectorSpec::Uniform, SelectorSpec::Fifo, 10), &s).unwrap();
    put(&t, &[1], &[1.0]);
    assert!(t.ranked(3).is_empty());
}

#[test]
fn local_keys_come_back_from_global_keys_until_the_item_leaves() {
    let s = store(64);
    let t = Table::new(config("t", SelectorSpec::Uniform, SelectorSpec::Fifo, 10), &s).unwrap();
    let keys = put(&t, &[1, 2], &[1.0; 2]);
    let (shard, generation, slot) = crate::cluster::split_key(crate::cluster::global_key(3, keys[1]));
    assert_eq!(shard, 3);
    assert_eq!(t.local_key(slot, generation), Some(keys[1]));
    t.delete(&keys[1..]);
    assert_eq!(t.local_key(slot, generation), None);
    put(&t, &[3], &[1.0]); // reuses the slot with a new generation
    assert_eq!(t.local_key(slot, generation), None);
}

#[test]
fn a_default_writer_keeps_only_its_longest_item_once_the_store_is_full() {
    let s = store(8);
    let t = Table::new(config("t", SelectorSpec::Fifo, SelectorSpec::Fifo, 8), &s).unwrap();
    let mut w = Writer::new(s.clone(), None).unwrap();
    // A continuing task: one episode, one-step items, for ten times the store.
    for v in 0..80i64 {
        w.append(&[&v.to_ne_bytes()], None).unwrap();
        w.create_item(&t, 1, 1.0, &[], None).unwrap();
    }
    let mut got = Vec::new();
    for item in t.items() {
        got.extend(values(&t, &t.sample(1, None).unwrap()));
        t.delete(&[item.key]);
    }
    assert_eq!(got.last(), Some(&79));
    assert!(got.len() >= 4 && got.windows(2).all(|p| p[1] == p[0] + 1), "{got:?}");
    // An item longer than what the writer kept says how to keep more.
    let e = w.create_item(&t, 3, 1.0, &[], None).unwrap_err();
    assert!(e.to_string().contains("max_sequence_length=3"), "{e}");
    // A new episode keeps everything again until the store fills.
    w.end_episode();
    for v in 0..4i64 {
        w.append(&[&v.to_ne_bytes()], None).unwrap();
    }
    w.create_item(&t, 4, 1.0, &[], None).unwrap();
}

fn resident_config(max_times_sampled: u32, extensions: Vec<crate::ExtensionSpec>) -> TableConfig {
    let mut c = config("r", SelectorSpec::Uniform, SelectorSpec::Fifo, 8);
    c.external_selection = true;
    c.max_times_sampled = max_times_sampled;
    c.extensions = extensions;
    c
}

#[test]
fn admit_counts_draws_in_bulk_and_hands_over_changes_once() {
    let s = store(64);
    let t = Table::new(resident_config(0, vec![]), &s).unwrap();
    let keys = put(&t, &[1, 2, 3], &[1.0, 0.0, 2.0]);
    let a = t.admit(5, Some(Duration::ZERO), None).unwrap();
    assert_eq!((a.count, a.table_size, a.size, a.positive, a.dense), (5, 3, 3, 2, true));
    assert_eq!((a.shortest, a.longest), (1, 1));
    assert!(a.stopped.is_none() && a.rows.is_pinned() && a.rows.is_empty());
    let got: Vec<_> = a.changes.iter().map(|c| (c.slot, c.item.as_ref().map(|i| (i.key, i.priority)))).collect();
    assert_eq!(got, vec![(0, Some((keys[0], 1.0))), (1, Some((keys[1], 0.0))), (2, Some((keys[2], 2.0)))]);
    assert_eq!((t.info().num_samples, t.info().limiter_samples), (5, 5));
    // Nothing changed since: no changes. A delete shows as an empty slot; slots are no longer dense.
    assert!(t.admit(1, None, None).unwrap().changes.is_empty());
    t.delete(&keys[1..2]);
    let a = t.admit(1, None, None).unwrap();
    assert!(matches!(&a.changes[..], [ResidentChange { slot: 1, item: None }]), "{:?}", a.changes);
    assert_eq!((a.size, a.positive, a.dense), (2, 2, false));
    // Credits: stale seqs are skipped; the rest reach times_sampled.
    assert_eq!(t.credit_draws(&[0, 1, 2], &[0, 1, 2], &[4, 9, 2]).unwrap(), 2);
    assert_eq!(t.items().iter().map(|i| i.times_sampled).collect::<Vec<_>>(), vec![4, 2]);
    let e = t.credit_draws(&[0], &[0, 1], &[1]).unwrap_err().to_string();
    assert!(e.contains("1 slots, 2 seqs and 1 counts"), "{e}");
}

#[test]
fn admit_stops_at_the_limiter_with_the_draws_it_admitted() {
    let s = store(64);
    let mut c = resident_config(0, vec![]);
    c.rate_limiter = RateLimiterConfig::new(1.0, 1, 0.0, 1e9).unwrap();
    let t = Table::new(c, &s).unwrap();
    put(&t, &[1, 2], &[1.0, 1.0]);
    let a = t.admit(5, Some(Duration::from_millis(10)), None).unwrap();
    assert_eq!(a.count, 2);
    assert!(matches!(a.stopped, Some(Error::Timeout { .. })));
    let e = t.admit(1, Some(Duration::from_millis(10)), None).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }));
    assert_eq!(t.info().num_samples, 2);
}

#[test]
fn admit_is_refused_where_draws_need_the_host() {
    let s = store(64);
    let host = Table::new(config("h", SelectorSpec::Uniform, SelectorSpec::Fifo, 8), &s).unwrap();
    assert!(host.admit(1, None, None).unwrap_err().to_string().contains("selects on the host"));
    let t = Table::new(resident_config(2, vec![]), &s).unwrap();
    assert!(t.admit(1, None, None).unwrap_err().to_string().contains("max_times_sampled is 2"));
    let mut c = resident_config(0, vec![crate::ExtensionSpec::TimesSampled]);
    c.name = "e".into();
    let t = Table::new(c, &s).unwrap();
    assert!(t.resident_refusal().unwrap().contains("extension looks at each draw"));
    let mut c = resident_config(0, vec![crate::ExtensionSpec::PriorityHistogram]);
    c.name = "f".into();
    c.sampler = SelectorSpec::Fifo;
    let t = Table::new(c, &s).unwrap();
    assert!(t.resident_refusal().unwrap().contains("sampler is Fifo"));
}

#[test]
fn admit_refuses_items_longer_than_asked_for_without_changing_anything() {
    let s = store(64);
    let t = Table::new(resident_config(0, vec![]), &s).unwrap();
    let bytes: Vec<u8> = (0..6i64).flat_map(|v| v.to_ne_bytes()).collect();
    t.insert_batch(&[&bytes], 2, 3, &[1.0, 1.0], &[], None).unwrap();
    let e = t.admit(4, None, Some(2)).unwrap_err().to_string();
    assert!(e.contains("holds an item of 3 steps; draws of at most 2 steps"), "{e}");
    assert_eq!((t.info().num_samples, t.info().limiter_samples), (0, 0));
    // The changes were not drained: the next admission hands them over.
    let a = t.admit(4, None, Some(3)).unwrap();
    assert_eq!((a.count, a.longest, a.changes.len()), (4, 3, 2));
    assert!(a.stopped.is_none());
}

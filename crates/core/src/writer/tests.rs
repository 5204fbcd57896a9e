//! Writer tests: windows against a plain reference model (proptest), episode
//! boundaries, max_sequence_length, store-full atomicity, bad input.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::sample::Collect;
use crate::rate_limiter::RateLimiterConfig;
use crate::selectors::SelectorSpec;
use crate::signature::{DType, Field, Signature};
use crate::table::TableConfig;

fn store(capacity: u64, block_steps: u32) -> Store {
    let sig = Signature::new(vec![
        Field::new("v", DType::Int64, vec![]).unwrap(),
        Field::new("w", DType::UInt8, vec![3]).unwrap(),
    ])
    .unwrap();
    Store::new(sig, capacity, block_steps, None).unwrap()
}

fn table(s: &Store, name: &str, max_size: u64) -> Table {
    let c = TableConfig {
        name: name.into(),
        sampler: SelectorSpec::Fifo,
        remover: SelectorSpec::Fifo,
        max_size,
        max_times_sampled: 0,
        rate_limiter: RateLimiterConfig::min_size(1).unwrap(),
        seed: Some(1),
        evict_when_store_full: true,
        external_selection: false,
        extensions: crate::ExtensionSpec::defaults(),
        attributes: Default::default(),
        max_staleness: None,
        groups: None,
    };
    Table::new(c, s).unwrap()
}

fn step(v: i64) -> (Vec<u8>, Vec<u8>) {
    (v.to_ne_bytes().to_vec(), vec![v as u8; 3])
}

fn append(w: &mut Writer, v: i64) {
    let (a, b) = step(v);
    w.append(&[&a, &b], None).unwrap();
}

/// Reads back the `v` values of every item in `t`, oldest first, by sampling
/// each with a Fifo sampler after deleting the ones before it.
fn contents(s: &Store, t: &Table) -> Vec<Vec<i64>> {
    let _ = s;
    let mut out = Vec::new();
    for info in t.items() {
        let b = t.sample(1, Some(Duration::ZERO)).unwrap();
        assert_eq!(b.items[0].key, info.key);
        let len = b.items[0].length as usize;
        let mut bytes = vec![0u8; 8 * len];
        b.gather(0, len as u32, &mut bytes);
        let mut w = vec![0u8; 3 * len];
        b.gather(1, len as u32, &mut w);
        let vs: Vec<i64> = bytes.chunks(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(w, vs.iter().flat_map(|&v| [v as u8; 3]).collect::<Vec<_>>());
        out.push(vs);
        drop(b);
        t.delete(&[info.key]);
    }
    out
}

#[derive(Clone, Debug)]
enum Op {
    Append,
    Extend(usize),
    Item(u64),
    Items(u64, u64),
    EndEpisode,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => Just(Op::Append),
            2 => (1usize..9).prop_map(Op::Extend),
            4 => (1u64..7).prop_map(Op::Item),
            2 => (1u64..4, 1u64..5).prop_map(|(k, n)| Op::Items(k, n)),
            1 => Just(Op::EndEpisode),
        ],
        1..60,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// Items hold exactly the last num_steps values of their episode, whatever the
    /// block size, the mix of append/extend and max_sequence_length.
    #[test]
    fn windows_match_reference(ops in ops(), bs in 1u32..6, max_seq in prop_oneof![Just(None), (1u64..8).prop_map(Some)]) {
        let s = store(512, bs);
        let t = table(&s, "t", 512);
        let mut w = Writer::new(s.clone(), max_seq).unwrap();
        let mut episode: Vec<i64> = Vec::new();
        let mut expected: Vec<Vec<i64>> = Vec::new();
        let mut next = 0i64;
        for op in ops {
            match op {
                Op::Append => { append(&mut w, next); episode.push(next); next += 1; }
                Op::Extend(n) => {
                    let vs: Vec<i64> = (next..next + n as i64).collect();
                    let a: Vec<u8> = vs.iter().flat_map(|v| v.to_ne_bytes()).collect();
                    let b: Vec<u8> = vs.iter().flat_map(|&v| [v as u8; 3]).collect();
                    w.extend(&[&a, &b], n, None).unwrap();
                    episode.extend(&vs);
                    next += n as i64;
                }
                Op::Item(k) => {
                    let allowed = (k as usize) <= episode.len() && max_seq.is_none_or(|m| k <= m);
                    let r = w.create_item(&t, k, 1.0, &[], None);
                    prop_assert_eq!(r.is_ok(), allowed, "{:?}", r);
                    if allowed {
                        expected.push(episode[episode.len() - k as usize..].to_vec());
                    }
                }
                Op::Items(k, n) => {
                    let need = k + n - 1;
                    let allowed = (need as usize) <= episode.len() && max_seq.is_none_or(|m| need <= m);
                    let r = w.create_items(&t, k, &vec![1.0; n as usize], &[], None);
                    prop_assert_eq!(r.is_ok(), allowed, "{:?}", r);
                    if allowed {
                        for back in (0..n as usize).rev() {
                            let end = episode.len() - back;
                            expected.push(episode[end - k as usize..end].to_vec());
                        }
                    }
                }
                Op::EndEpisode => { w.end_episode(); episode.clear(); }
            }
        }
        w.close();
        prop_assert_eq!(contents(&s, &t), expected);
        prop_assert_eq!(s.free_blocks(), s.num_blocks() as usize, "all blocks return once items are gone");
    }

    /// The windows cut from one pass over the history (`tail`) are the windows the
    /// walk from the newest step gives (`window_back`), ranges and all, for items
    /// one per step and tiled.
    #[test]
    fn windows_from_the_tail_equal_windows_walked_back(sizes in proptest::collection::vec(1usize..9, 1..12), bs in 1u32..6, k in 1u64..5, n in 1u64..12) {
        let s = store(512, bs);
        let mut w = Writer::new(s.clone(), None).unwrap();
        let mut next = 0i64;
        for size in sizes {
            let vs: Vec<i64> = (next..next + size as i64).collect();
            let a: Vec<u8> = vs.iter().flat_map(|v| v.to_ne_bytes()).collect();
            let b: Vec<u8> = vs.iter().flat_map(|&v| [v as u8; 3]).collect();
            w.extend(&[&a, &b], size, None).unwrap();
            next += size as i64;
        }
        let kept = w.episode_steps();
        if k + n - 1 <= kept {
            let got: Vec<Vec<RowRange>> = w.windows("t", k, n).unwrap().iter().map(|x| x.ranges().to_vec()).collect();
            let want: Vec<Vec<RowRange>> = (0..n).rev().map(|back| w.window_back(k, back).ranges().to_vec()).collect();
            prop_assert_eq!(got, want);
        }
        if n * k <= kept {
            let tail = w.tail(n * k);
            let got: Vec<Vec<RowRange>> = (0..n).map(|j| tail.window(j * k, k).ranges().to_vec()).collect();
            let want: Vec<Vec<RowRange>> = (0..n).map(|j| w.window_back(k, (n - 1 - j) * k).ranges().to_vec()).collect();
            prop_assert_eq!(got, want);
        }
    }
}

#[test]
fn items_never_span_episodes() {
    let s = store(64, 4);
    let t = table(&s, "t", 8);
    let mut w = Writer::new(s.clone(), None).unwrap();
    append(&mut w, 1);
    append(&mut w, 2);
    w.end_episode();
    append(&mut w, 3);
    let e = w.create_item(&t, 2, 1.0, &[], None).unwrap_err().to_string();
    assert!(e.contains("longer than the episode so far (1 steps)"), "{e}");
    assert_eq!(t.size(), 0);
}

#[test]
fn create_item_by_name_finds_tables_on_the_store() {
    let s = store(64, 4);
    let a = table(&s, "a", 8);
    let b = table(&s, "b", 8);
    let mut w = Writer::new(s.clone(), None).unwrap();
    append(&mut w, 1);
    append(&mut w, 2);
    let (by_a, by_b) = (w.table("a").unwrap(), w.table("b").unwrap());
    w.create_item(&by_a, 2, 1.0, &[], None).unwrap();
    w.create_item(&by_b, 1, 1.0, &[], None).unwrap();
    assert_eq!((a.size(), b.size()), (1, 1));
    let e = w.table("nope").err().unwrap();
    assert!(matches!(e, Error::NotFound(_)) && e.to_string().contains("'nope'"), "{e}");
}

#[test]
fn wrong_row_size_names_the_field_and_changes_nothing() {
    let s = store(64, 4);
    let mut w = Writer::new(s.clone(), None).unwrap();
    let e = w.append(&[&[0u8; 8], &[0u8; 2]], None).unwrap_err().to_string();
    assert!(e.contains("field 'w'") && e.contains("uint8[3]"), "{e}");
    assert_eq!(w.episode_steps(), 0);
    assert_eq!(s.free_blocks(), 16);
}

#[test]
fn extend_into_a_full_store_appends_nothing() {
    let s = store(8, 4);
    let t = table(&s, "t", 8);
    let mut w = Writer::new(s.clone(), None).unwrap();
    let vs: Vec<i64> = (0..6).collect();
    let a: Vec<u8> = vs.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let b: Vec<u8> = vs.iter().flat_map(|&v| [v as u8; 3]).collect();
    w.extend(&[&a[..48], &b[..18]], 6, None).unwrap();
    w.create_item(&t, 6, 1.0, &[], None).unwrap();
    let e = w.extend(&[&a[..24], &b[..9]], 3, None).unwrap_err();
    assert!(matches!(e, Error::ResourceExhausted(_)), "{e}");
    assert_eq!(w.episode_steps(), 6);
    w.close();
    assert_eq!(contents(&s, &t), vec![vs]);
}

#[test]
fn writer_for_another_store_is_rejected() {
    let s1 = store(8, 4);
    let s2 = store(8, 4);
    let t = table(&s2, "t", 4);
    let mut w = Writer::new(s1.clone(), None).unwrap();
    append(&mut w, 1);
    let e = w.create_item(&t, 1, 1.0, &[], None).unwrap_err().to_string();
    assert!(e.contains("different store"), "{e}");
}

#[test]
fn create_items_makes_one_item_per_step_of_an_extend() {
    let s = store(64, 4);
    let t = table(&s, "t", 32);
    let mut w = Writer::new(s.clone(), None).unwrap();
    let vs: Vec<i64> = (0..6).collect();
    let a: Vec<u8> = vs.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let b: Vec<u8> = vs.iter().flat_map(|&v| [v as u8; 3]).collect();
    w.extend(&[&a, &b], 6, None).unwrap();
    let keys = w.create_items(&t, 2, &[1.0, 2.0, 3.0], &[], None).unwrap();
    assert_eq!(keys.len(), 3);
    let e = w.create_items(&t, 2, &[1.0; 6], &[], None).unwrap_err().to_string();
    assert!(e.contains("6 items of 2 steps") && e.contains("need 7 steps"), "{e}");
    assert_eq!(contents(&s, &t), vec![vec![2, 3], vec![3, 4], vec![4, 5]]);
}

/// A store whose `v` samples as stacks of 3 (padded with the episode's first
/// value), `w` as stacks of 2 (padded with zeros) and `x` unstacked.
fn stacked_store(capacity: u64, block_steps: u32, compress: bool) -> Store {
    use crate::signature::StackPadding;
    let level = compress.then_some(3);
    let sig = Signature::new(vec![
        Field::new("v", DType::Int64, vec![]).unwrap().stacked(3, StackPadding::Reset).unwrap().compressed(level).unwrap(),
        Field::new("w", DType::UInt8, vec![2]).unwrap().stacked(2, StackPadding::Zero).unwrap(),
        Field::new("x", DType::Int64, vec![]).unwrap(),
    ])
    .unwrap();
    Store::new(sig, capacity, block_steps, None).unwrap()
}

fn stacked_columns(vs: &[i64]) -> [Vec<u8>; 3] {
    let v: Vec<u8> = vs.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let w: Vec<u8> = vs.iter().flat_map(|&v| [v as u8, (v + 1) as u8]).collect();
    [v.clone(), w, v]
}

/// What a sample of the item over `episode[end - k..end]` holds per column, as
/// gymnasium's FrameStackObservation would have stacked the episode's values.
fn stacked_expected(episode: &[i64], end: usize, k: usize) -> [Vec<u8>; 3] {
    let (mut v, mut w, mut x) = (Vec::new(), Vec::new(), Vec::new());
    for i in end - k..end {
        for j in (0..3).rev() {
            v.extend(episode[i.saturating_sub(j)].to_ne_bytes());
        }
        match i {
            0 => w.extend([0, 0]),
            _ => w.extend([episode[i - 1] as u8, (episode[i - 1] + 1) as u8]),
        }
        w.extend([episode[i] as u8, (episode[i] + 1) as u8]);
        x.extend(episode[i].to_ne_bytes());
    }
    [v, w, x]
}

fn stacked_contents(t: &Table) -> Vec<[Vec<u8>; 3]> {
    let mut out = Vec::new();
    for info in t.items() {
        let b = t.sample(1, Some(Duration::ZERO)).unwrap();
        let len = b.items[0].length;
        let cols = b.columns();
        let got: Vec<Vec<u8>> = (0..3)
            .map(|c| {
                let mut bytes = vec![0u8; len as usize * cols.sample_bytes(c)];
                b.gather(c, len, &mut bytes);
                bytes
            })
            .collect();
        out.push([got[0].clone(), got[1].clone(), got[2].clone()]);
        drop(b);
        t.delete(&[info.key]);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]
    /// Stacked fields sample the last frames of the item's episode, padded at its
    /// start, across block boundaries, appends and extends, compressed or not.
    #[test]
    fn stacks_match_a_frame_stacking_reference(ops in ops(), bs in 3u32..9, compress in any::<bool>(),
                                               max_seq in prop_oneof![Just(None), (1u64..8).prop_map(Some)]) {
        let s = stacked_store(1024, bs, compress);
        let t = table(&s, "t", 1024);
        let mut w = Writer::new(s.clone(), max_seq).unwrap();
        let mut episode: Vec<i64> = Vec::new();
        let mut expected = Vec::new();
        let mut next = 1i64;
        for op in ops {
            match op {
                Op::Append | Op::Extend(_) => {
                    let n = if let Op::Extend(n) = op { n } else { 1 };
                    let vs: Vec<i64> = (next..next + n as i64).map(|v| v * 7).collect();
                    let [a, b, c] = stacked_columns(&vs);
                    if n == 1 { w.append(&[&a, &b, &c], None).unwrap() } else { w.extend(&[&a, &b, &c], n, None).unwrap() }
                    episode.extend(&vs);
                    next += n as i64;
                }
                Op::Item(k) => {
                    if w.create_item(&t, k, 1.0, &[], None).is_ok() {
                        expected.push(stacked_expected(&episode, episode.len(), k as usize));
                    }
                }
                Op::Items(k, n) => {
                    if w.create_items(&t, k, &vec![1.0; n as usize], &[], None).is_ok() {
                        for back in (0..n as usize).rev() {
                            expected.push(stacked_expected(&episode, episode.len() - back, k as usize));
                        }
                    }
                }
                Op::EndEpisode => { w.end_episode(); episode.clear(); }
            }
        }
        w.close();
        prop_assert_eq!(stacked_contents(&t), expected);
        prop_assert_eq!(s.free_blocks(), s.num_blocks() as usize, "all blocks return once items are gone");
    }
}

#[test]
fn a_stack_larger_than_a_block_is_refused() {
    use crate::signature::StackPadding;
    let sig = Signature::new(vec![Field::new("v", DType::Int64, vec![]).unwrap().stacked(4, StackPadding::Reset).unwrap()]).unwrap();
    let e = Store::new(sig, 12, 3, None).unwrap_err().to_string();
    assert!(e.contains("'v'") && e.contains("stacks 4 frames") && e.contains("block_steps must be at least"), "{e}");
}

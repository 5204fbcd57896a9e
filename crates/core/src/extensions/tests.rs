//! Extension tests: the built-ins' statistics against a plain reference model
//! over random operation sequences (proptest), through snapshots, and bad specs.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::{ExtensionSpec, Histogram, Scale};
use crate::rate_limiter::RateLimiterConfig;
use crate::selectors::SelectorSpec;
use crate::signature::{DType, Field, Signature};
use crate::{Store, Table, TableConfig};

const WINDOW: u32 = 5;

fn store() -> Store {
    let sig = Signature::new(vec![Field::new("x", DType::Int64, vec![]).unwrap()]).unwrap();
    Store::new(sig, 256, 4, None).unwrap()
}

fn table(store: &Store, sampler: SelectorSpec, max_times_sampled: u32) -> Table {
    let config = TableConfig {
        name: "t".into(),
        sampler,
        remover: SelectorSpec::Fifo,
        max_size: 6,
        max_times_sampled,
        rate_limiter: RateLimiterConfig::min_size(1).unwrap(),
        seed: Some(7),
        evict_when_store_full: true,
        external_selection: false,
        extensions: vec![
            ExtensionSpec::PriorityHistogram,
            ExtensionSpec::SampledAge,
            ExtensionSpec::TimesSampled,
            ExtensionSpec::UniqueSamples { window: WINDOW },
            ExtensionSpec::Rates { seconds: 60 },
        ],
        attributes: Default::default(),
        max_staleness: None,
        groups: None,
    };
    Table::new(config, store).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<f64>),
    Sample(usize),
    Update(usize, f64),
    Delete(usize),
    Reset,
}

fn priority() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(1e-30), 0.0..10.0f64, Just(3e20)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(priority(), 1..4).prop_map(Op::Insert),
        4 => (1usize..5).prop_map(Op::Sample),
        2 => (0usize..8, priority()).prop_map(|(i, p)| Op::Update(i, p)),
        1 => (0usize..8).prop_map(Op::Delete),
        1 => Just(Op::Reset),
    ]
}

/// The reference: live items by key (seq, priority, times sampled), and what the
/// draws saw.
#[derive(Default)]
struct Model {
    live: BTreeMap<u64, (u64, f64, u32)>,
    next_seq: u64,
    ages: Vec<u64>,
    window_keys: Vec<u64>,
    last_fraction: Option<f64>,
    windows: u64,
    inserts: u64,
    draws: u64,
}

impl Model {
    fn histogram(&self, scale: Scale, value: impl Fn(&(u64, f64, u32)) -> f64) -> Value {
        let mut h = Histogram::new(scale);
        self.live.values().for_each(|v| h.add_real(value(v)));
        h.to_json()
    }

    fn check(&self, t: &Table) {
        let s = t.stats();
        assert_eq!(s["priority_histogram"], self.histogram(Scale::Real, |v| v.1), "priority histogram");
        assert_eq!(s["times_sampled"], self.histogram(Scale::Count, |v| v.2 as f64), "times sampled");
        let mut ages = Histogram::new(Scale::Count);
        self.ages.iter().for_each(|&a| ages.add_count(a));
        assert_eq!(s["sampled_age"]["inserts"], ages.to_json(), "sampled age in inserts");
        assert_eq!(s["sampled_age"]["count"], json!(self.ages.len()));
        assert_eq!(s["sampled_age"]["seconds"]["total"], json!(self.ages.len()));
        let mut distinct = self.window_keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let u = &s["unique_samples"];
        assert_eq!((u["fraction"].as_f64(), u["windows"].as_u64()), (self.last_fraction, Some(self.windows)), "unique samples");
        assert_eq!((u["current"].as_u64(), u["current_draws"].as_u64()), (Some(distinct.len() as u64), Some(self.window_keys.len() as u64)));
        let r = &s["rates"];
        let sum = |k: &str| r[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum::<u64>();
        assert_eq!((sum("inserts"), sum("samples")), (self.inserts, self.draws), "rates (a test runs within a minute)");
    }
}

fn run(ops: &[Op], sampler: SelectorSpec, max_times: u32) {
    let s = store();
    let t = table(&s, sampler, max_times);
    let mut m = Model::default();
    for op in ops {
        match op {
            Op::Insert(ps) => {
                let bytes = vec![0u8; 8 * ps.len()];
                let keys = t.insert_batch(&[&bytes], ps.len(), 1, ps, &[], None).unwrap();
                for (k, &p) in keys.iter().zip(ps) {
                    if m.live.len() == 6 {
                        let oldest = *m.live.iter().min_by_key(|(_, v)| v.0).unwrap().0;
                        m.live.remove(&oldest);
                    }
                    m.live.insert(*k, (m.next_seq, p, 0));
                    m.next_seq += 1;
                    m.inserts += 1;
                }
            }
            Op::Sample(n) => {
                if m.live.is_empty() {
                    continue;
                }
                // A draw cut short (the table emptied by max_times_sampled) still counts.
                let batch = match t.sample(*n, Some(Duration::ZERO)) {
                    Ok(b) => b,
                    Err(crate::Error::Timeout { partial: crate::error::Partial::Sampled(p), .. }) => p.into_batch(),
                    Err(e) => panic!("{e}"),
                };
                for item in &batch.items {
                    let v = m.live.get_mut(&item.key).expect("a drawn item is live in the model");
                    v.2 += 1;
                    assert_eq!(v.2, item.times_sampled);
                    m.ages.push(m.next_seq - 1 - v.0);
                    m.draws += 1;
                    m.window_keys.push(item.key);
                    if m.window_keys.len() == WINDOW as usize {
                        let mut d = m.window_keys.clone();
                        d.sort_unstable();
                        d.dedup();
                        m.last_fraction = Some(d.len() as f64 / WINDOW as f64);
                        m.windows += 1;
                        m.window_keys.clear();
                    }
                    if max_times > 0 && v.2 >= max_times {
                        m.live.remove(&item.key);
                    }
                }
            }
            Op::Update(i, p) => {
                let Some(&k) = m.live.keys().nth(*i % m.live.len().max(1)) else { continue };
                t.update_priorities(&[k], &[*p]).unwrap();
                m.live.get_mut(&k).unwrap().1 = *p;
            }
            Op::Delete(i) => {
                let Some(&k) = m.live.keys().nth(*i % m.live.len().max(1)) else { continue };
                assert_eq!(t.delete(&[k]), 1);
                m.live.remove(&k);
            }
            Op::Reset => {
                t.reset();
                m.live.clear();
            }
        }
        m.check(&t);
    }
    // A snapshot carries every statistic: the restored table reports the same.
    let (snap, pins) = t.snapshot();
    let s2 = store();
    let rows = s2.reserve_blocks(pins.blocks()).unwrap();
    let restored = Table::restore(&snap, &s2).unwrap();
    drop(rows);
    let (mut a, mut b) = (t.stats(), restored.stats());
    // Rates move to the seconds before the restored table's clock (checked by sums).
    for v in [&mut a, &mut b] {
        v.as_object_mut().unwrap().remove("rates");
    }
    assert_eq!(a, b);
    m.check(&restored);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn uniform_tables_report_what_the_model_says(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops, SelectorSpec::Uniform, 0);
    }

    #[test]
    fn prioritized_tables_with_max_times_sampled_report_what_the_model_says(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops, SelectorSpec::Prioritized { priority_exponent: 0.8 }, 2);
    }
}

#[test]
fn no_extensions_report_nothing() {
    let s = store();
    let mut config = table(&s, SelectorSpec::Uniform, 0).config().clone();
    config.name = "bare".into();
    config.extensions.clear();
    let t = Table::new(config, &s).unwrap();
    t.insert_batch(&[&[0u8; 8]], 1, 1, &[1.0], &[], None).unwrap();
    assert_eq!(t.stats(), json!({}));
}

#[test]
fn bad_specs_are_refused_and_nothing_is_made() {
    let s = store();
    let base = table(&s, SelectorSpec::Uniform, 0).config().clone();
    let cases = [
        (vec![ExtensionSpec::UniqueSamples { window: 0 }], "UniqueSamples window must be >= 1 draw, got 0"),
        (vec![ExtensionSpec::Rates { seconds: 0 }], "Rates seconds must be 1 to 86400, got 0"),
        (vec![ExtensionSpec::SampledAge, ExtensionSpec::SampledAge], "extensions: sampled_age is attached twice"),
    ];
    for (specs, message) in cases {
        let mut c = base.clone();
        c.name = "other".into();
        c.extensions = specs;
        let err = Table::new(c, &s).err().expect("refused").to_string();
        assert!(err.contains("table 'other'") && err.contains(message), "{err}");
        assert!(Table::find(&s, "other").is_none());
    }
    assert_eq!(ExtensionSpec::from_json(&json!({"kind": "nope"})), Err("unknown extension kind 'nope'".into()));
    for spec in ExtensionSpec::defaults() {
        assert_eq!(ExtensionSpec::from_json(&spec.to_json()), Ok(spec));
    }
}

#[test]
fn rates_count_per_second_and_average_complete_seconds() {
    use super::Extension;
    let mut r = super::rates::Rates::new(12);
    r.add(0.5, 3, 0);
    r.add(1.2, 2, 0);
    r.add(3.9, 0, 4);
    let s = r.stats(4.0);
    let ins: Vec<u64> = serde_json::from_value(s["inserts"].clone()).unwrap();
    assert_eq!(&ins[7..], [3, 2, 0, 0, 0]);
    assert_eq!(s["insert_rate"], json!(5.0 / 4.0));
    assert_eq!(s["sample_rate"], json!(4.0 / 4.0));
    // 30 s later nothing of that is left in the series or the rate.
    let s = r.stats(34.0);
    assert_eq!(s["insert_rate"], json!(0.0));
    // Saved and restored on a new clock: the counts become the seconds before it.
    let saved = r.save(4.0);
    let mut back = super::rates::Rates::new(12);
    back.restore(&saved, &[], 0.0).unwrap();
    let ins: Vec<u64> = serde_json::from_value(back.stats(0.0)["inserts"].clone()).unwrap();
    assert_eq!(&ins[6..], [3, 2, 0, 0, 0, 0]);
}

//! A drawn batch sent in parts (`remote::sample_parts`), encoded with the hand-written
//! `SampleResponse` (rows gathered from the store as each part is encoded) and decoded
//! as a client does, joins back into exactly what `Collect::gather` makes, for any
//! part size: ragged items, fields of different widths, items larger than a part.

use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message;
use reprise_core::{Collect, DType, Field, RateLimiterConfig, SelectorSpec, Signature, Store, Table, TableConfig, Writer};
use reprise_server::remote::sample_parts;
use reprise_wire::pb;

/// A table over `a: uint8[3]` and `b: int64[2]`, holding one item per length in `lengths`
/// (each its own episode, step values counting up).
fn table_with(lengths: &[u32]) -> Table {
    let sig = Signature::new(vec![Field::new("a", DType::UInt8, vec![3]).unwrap(), Field::new("b", DType::Int64, vec![2]).unwrap()]).unwrap();
    let store = Store::new(sig, 4096, 8, None).unwrap();
    let config = TableConfig {
        name: "t".into(),
        sampler: SelectorSpec::Fifo,
        remover: SelectorSpec::Fifo,
        max_size: 1000,
        max_times_sampled: 0,
        rate_limiter: RateLimiterConfig::min_size(1).unwrap(),
        seed: Some(1),
        evict_when_store_full: true,
        external_selection: false,
        extensions: Vec::new(),
        attributes: Default::default(),
        max_staleness: None,
        groups: None,
    };
    let table = Table::new(config, &store).unwrap();
    let mut w = Writer::new(store, None).unwrap();
    let mut v = 1u8;
    for &len in lengths {
        for _ in 0..len {
            let a = [v, v.wrapping_add(1), v.wrapping_add(2)];
            let b = [i64::from(v), -i64::from(v)];
            let b: Vec<u8> = b.iter().flat_map(|x| x.to_ne_bytes()).collect();
            w.append(&[&a, &b], None).unwrap();
            v = v.wrapping_add(3);
        }
        w.create_item(&table, u64::from(len), 1.0, &[], None).unwrap();
        w.end_episode();
    }
    table
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn parts_join_into_the_gathered_batch(lengths in vec(1u32..20, 1..12), part in 1usize..2000, both in any::<bool>()) {
        let table = table_with(&lengths);
        let n = lengths.len();
        let batch = table.sample(n, None).unwrap();
        let fields: Vec<usize> = if both { vec![0, 1] } else { vec![1] };
        let t = batch.max_length();
        let expected: Vec<Vec<u8>> = fields
            .iter()
            .map(|&c| {
                let mut out = vec![0u8; n * t as usize * batch.columns().row_bytes(c)];
                batch.gather(c, t, &mut out);
                out
            })
            .collect();
        let keys: Vec<u64> = batch.items.iter().map(|i| i.key).collect();
        let parts = sample_parts(batch, &fields, false, part, &Default::default());
        let mut joined = vec![Vec::new(); fields.len()];
        for (i, p) in parts.iter().enumerate() {
            prop_assert_eq!(p.more, i + 1 < parts.len());
            prop_assert!(p.column_bytes() <= part, "a part of {} column bytes, limit {}", p.column_bytes(), part);
            let bytes = p.encode_to_vec();
            prop_assert_eq!(bytes.len(), p.encoded_len());
            let got = pb::SampleResponse::decode(bytes.as_slice()).unwrap();
            if i == 0 {
                prop_assert_eq!(&got.keys, &keys);
                prop_assert_eq!(got.max_length, t);
                prop_assert_eq!(got.fields.len(), fields.len());
            } else {
                prop_assert!(got.keys.is_empty() && got.fields.is_empty());
            }
            prop_assert_eq!(got.columns.len(), fields.len());
            for (j, c) in got.columns.iter().enumerate() {
                joined[j].extend_from_slice(c.bytes().unwrap());
            }
        }
        prop_assert_eq!(joined, expected);
    }
}

#[test]
fn a_batch_that_fits_is_one_message_with_every_column() {
    let table = table_with(&[2, 3]);
    let batch = table.sample(2, None).unwrap();
    let t = batch.max_length() as usize;
    let parts = sample_parts(batch, &[0, 1], true, 1 << 20, &Default::default());
    assert_eq!(parts.len(), 1);
    let got = pb::SampleResponse::decode(parts[0].encode_to_vec().as_slice()).unwrap();
    assert!(got.partial && !got.more);
    assert_eq!(got.columns.iter().map(|c| c.len()).collect::<Vec<_>>(), vec![2 * t * 3, 2 * t * 16]);
}

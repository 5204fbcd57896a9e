//! The `insert_messages` fuzz target's body (`support/insert_messages.rs`) under
//! `cargo test`: over arbitrary bytes, over streams of well-formed and malformed
//! `Insert` messages, and on one stream whose items must all be stored (so the
//! properties cannot hold just because nothing was ever applied).

#[path = "support/insert_messages.rs"]
mod insert_messages;

use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message;
use reprise_client::pb;

/// Frames messages as `insert_messages::messages` splits them.
fn frame(messages: &[pb::InsertRequest]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        let bytes = m.encode_to_vec();
        out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

fn op(kind: pb::insert_op::Op) -> pb::InsertOp {
    pb::InsertOp { op: Some(kind) }
}

/// Steps of the fuzz store's signature (9 bytes a step), mostly of the right sizes.
fn steps() -> impl Strategy<Value = pb::InsertOp> {
    let sized = (1u32..9).prop_map(|n| (n, vec![vec![7u8; 8 * n as usize], vec![1u8; n as usize]]));
    let any_sizes = (0u32..9, vec(vec(any::<u8>(), 0..40), 0..4));
    prop_oneof![4 => sized, 1 => any_sizes].prop_map(|(num_steps, columns)| {
        op(pb::insert_op::Op::Steps(pb::Steps { num_steps, columns: columns.into_iter().map(Into::into).collect() }))
    })
}

fn priority() -> impl Strategy<Value = f64> {
    prop_oneof![8 => 0.0..10.0f64, 1 => Just(f64::NAN), 1 => Just(-1.0), 1 => Just(f64::INFINITY), 1 => Just(f64::MAX)]
}

fn table_name() -> impl Strategy<Value = String> {
    prop_oneof![9 => Just("t".to_string()), 1 => Just("nope".to_string())]
}

fn insert_op() -> impl Strategy<Value = pb::InsertOp> {
    prop_oneof![
        4 => steps(),
        3 => (table_name(), 0u32..10, priority())
            .prop_map(|(table, num_steps, priority)| op(pb::insert_op::Op::CreateItem(pb::CreateItem { table, num_steps, priority, attributes: Default::default() }))),
        1 => (table_name(), 0u32..6, vec(priority(), 0..5))
            .prop_map(|(table, num_steps, priorities)| op(pb::insert_op::Op::CreateItems(pb::CreateItems { table, num_steps, priorities, attributes: Default::default() }))),
        1 => Just(op(pb::insert_op::Op::EndEpisode(pb::EndEpisode {}))),
        1 => any::<u64>().prop_map(|id| op(pb::insert_op::Op::Flush(pb::Flush { id }))),
        1 => Just(pb::InsertOp { op: None }),
    ]
}

fn insert_request() -> impl Strategy<Value = pb::InsertRequest> {
    (0u32..12, vec(insert_op(), 0..8)).prop_map(|(max_sequence_length, ops)| pb::InsertRequest {
        table: "t".into(),
        max_sequence_length,
        timeout_seconds: 0.0,
        ops,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_and_leave_only_whole_items(data in vec(any::<u8>(), 0..1024)) {
        insert_messages::run(&data);
    }

    #[test]
    fn insert_message_streams_never_panic_and_leave_only_whole_items(stream in vec(insert_request(), 1..6)) {
        insert_messages::run(&frame(&stream));
    }
}

#[test]
fn a_well_formed_stream_stores_its_items() {
    let mut stream = Vec::new();
    for n in 1..=3u32 {
        let steps = pb::Steps { num_steps: 2 * n, columns: vec![vec![0u8; 16 * n as usize].into(), vec![0u8; 2 * n as usize].into()] };
        let item = pb::CreateItem { table: "t".into(), num_steps: n, priority: f64::from(n), attributes: Default::default() };
        let ops = vec![op(pb::insert_op::Op::Steps(steps)), op(pb::insert_op::Op::CreateItem(item))];
        stream.push(pb::InsertRequest { table: "t".into(), ops, ..Default::default() });
    }
    assert_eq!(insert_messages::run(&frame(&stream)), 3);
    // Arbitrary bytes are split the same way: a message cut short is still offered to prost.
    assert_eq!(insert_messages::messages(&[3, 0, 1, 2, 3, 5, 0, 9]), vec![&[1u8, 2, 3][..], &[9u8][..]]);
}

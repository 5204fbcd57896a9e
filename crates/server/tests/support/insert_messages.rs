//! The body of the `insert_messages` fuzz target, shared with a property test so that
//! `cargo test` compiles and runs it on stable Rust (API drift breaks the build, not
//! only the nightly fuzz run). `fuzz/fuzz_targets/insert_messages.rs` and
//! `crates/server/tests/insert_messages.rs` both include this file by path.
//!
//! Arbitrary bytes become `Insert` stream messages: decoded with prost as the service
//! decodes them, then applied by the service's own `InsertSession` to a small store.
//! Nothing may panic; every item that exists must be whole (1 to capacity steps, a
//! finite priority >= 0); once the stream is over and the table emptied, every block
//! must be free again.

use prost::Message;
use reprise_client::pb;
use reprise_core::{DType, Field, RateLimiterConfig, SelectorSpec, Signature, Store, Table, TableConfig};
use reprise_server::remote::InsertSession;

/// The store every run writes to: `x: float32[2]` and `y: int8` per step (9 bytes),
/// 16 blocks of 4 steps, one table "t" of at most 16 items.
pub fn fresh_table() -> (Store, Table) {
    let sig = Signature::new(vec![
        Field::new("x", DType::Float32, vec![2]).expect("a valid field"),
        Field::new("y", DType::Int8, vec![]).expect("a valid field"),
    ])
    .expect("a valid signature");
    let store = Store::new(sig, 64, 4, None).expect("a small store in /dev/shm");
    let config = TableConfig {
        name: "t".into(),
        sampler: SelectorSpec::Uniform,
        remover: SelectorSpec::Fifo,
        max_size: 16,
        max_times_sampled: 0,
        rate_limiter: RateLimiterConfig::new(1.0, 1, f64::NEG_INFINITY, f64::INFINITY).expect("a valid limiter"),
        seed: Some(0),
        evict_when_store_full: true,
        external_selection: false,
        extensions: reprise_core::ExtensionSpec::defaults(),
        attributes: Default::default(),
        max_staleness: None,
        groups: None,
    };
    let table = Table::new(config, &store).expect("a valid table");
    (store, table)
}

/// Splits `data` into messages, each a little-endian u16 length and that many bytes
/// (the last may be short), like the messages of one gRPC stream.
pub fn messages(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let len = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        let (msg, tail) = rest[2..].split_at(len.min(rest.len() - 2));
        out.push(msg);
        rest = tail;
    }
    out
}

/// Runs `data` as one insert stream; returns how many items the table held after it.
pub fn run(data: &[u8]) -> u64 {
    let (store, table) = fresh_table();
    let tables = [table.clone()];
    let mut session: Option<InsertSession> = None;
    for msg in messages(data) {
        let Ok(mut req) = pb::InsertRequest::decode(msg) else { continue };
        let session = match &mut session {
            Some(s) => s,
            None => {
                req.table = "t".into();
                req.timeout_seconds = 0.0;
                match InsertSession::open(&tables[..], &req) {
                    Ok(s) => session.insert(s),
                    Err(_) => continue,
                }
            }
        };
        let never = || false;
        if session.apply(&tables[..], std::mem::take(&mut req.ops), &never).is_err() {
            break; // the service ends the stream at the first error
        }
    }
    drop(session);
    let items = table.items();
    for item in &items {
        assert!(item.length >= 1 && u64::from(item.length) <= store.capacity(), "item {} has {} steps", item.key, item.length);
        assert!(item.priority.is_finite() && item.priority >= 0.0, "item {} has priority {}", item.key, item.priority);
    }
    assert_eq!(items.len() as u64, table.size());
    table.reset();
    assert_eq!(store.free_blocks(), store.num_blocks() as usize, "blocks held after the stream ended and the table was emptied");
    store.unlink();
    items.len() as u64
}

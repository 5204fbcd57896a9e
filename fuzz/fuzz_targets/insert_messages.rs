//! Arbitrary bytes as `Insert` stream messages: decoded with prost as the service decodes
//! them, then applied by the service's own `InsertSession` to a small store. Nothing may
//! panic, and every item that exists must lie inside the store.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use reprise_client::pb;
use reprise_core::{DType, Field, RateLimiterConfig, SelectorSpec, Signature, Store, Table, TableConfig};
use reprise_server::grpc::InsertSession;

fuzz_target!(|data: &[u8]| {
    let sig = Signature::new(vec![
        Field::new("x", DType::Float32, vec![2]).unwrap(),
        Field::new("y", DType::Int8, vec![]).unwrap(),
    ])
    .unwrap();
    let store = Store::new(sig, 64, 4, None).unwrap();
    let config = TableConfig {
        name: "t".into(),
        sampler: SelectorSpec::Uniform,
        remover: SelectorSpec::Fifo,
        max_size: 16,
        max_times_sampled: 0,
        rate_limiter: RateLimiterConfig::new(1.0, 1, f64::NEG_INFINITY, f64::INFINITY).unwrap(),
        seed: Some(0),
        evict_when_store_full: true,
        external_selection: false,
    };
    let table = Table::new(config, &store).unwrap();
    let tables = [table.clone()];
    // The input is a sequence of length-prefixed messages, like a gRPC stream's.
    let mut rest = data;
    let mut session: Option<InsertSession> = None;
    while rest.len() >= 2 {
        let len = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        rest = &rest[2..];
        let (msg, tail) = rest.split_at(len.min(rest.len()));
        rest = tail;
        let Ok(mut req) = pb::InsertRequest::decode(msg) else { continue };
        if session.is_none() {
            req.table = "t".into();
            req.timeout_seconds = 0.0;
            match InsertSession::open(&tables[..], &req) {
                Ok(s) => session = Some(s),
                Err(_) => continue,
            }
        }
        let never = || false;
        if session.as_mut().unwrap().apply(&tables[..], std::mem::take(&mut req.ops), &never).is_err() {
            break; // the service ends the stream at the first error
        }
    }
    drop(session);
    for item in table.items() {
        assert!(item.length >= 1 && u64::from(item.length) <= store.capacity());
    }
    store.unlink();
});

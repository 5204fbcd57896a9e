//! Arbitrary datagrams into the aggregation daemon's engine. The body lives in the
//! aggregator's tests (`crates/aggregator/tests/support/packets.rs`), where a property test
//! runs it under `cargo test` on stable Rust; this target runs the same function under libFuzzer.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/aggregator/tests/support/packets.rs"]
mod packets;

fuzz_target!(|data: &[u8]| {
    packets::run(data);
});

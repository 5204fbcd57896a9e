//! Arbitrary bytes as `Insert` stream messages, applied by the service's own
//! `InsertSession` to a small store. The body lives in the server's tests
//! (`crates/server/tests/support/insert_messages.rs`), where a property test runs it
//! under `cargo test` on stable Rust; this target runs the same function under libFuzzer.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/server/tests/support/insert_messages.rs"]
mod insert_messages;

fuzz_target!(|data: &[u8]| {
    insert_messages::run(data);
});

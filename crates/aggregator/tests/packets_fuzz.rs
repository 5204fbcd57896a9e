//! The `aggregate_packets` fuzz target's body (`support/packets.rs`) as a property test, so
//! `cargo test` on stable Rust runs what `bash fuzz/run.sh 60 aggregate_packets` fuzzes.

#[path = "support/packets.rs"]
mod packets;

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_datagrams_leave_the_daemon_standing(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        packets::run(&data);
    }
}

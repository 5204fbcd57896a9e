//! The daemon's counters: atomics the event loop bumps and anyone may read while it runs
//! (`Daemon::stats`, the Prometheus endpoint).

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident: $help:literal),* $(,)?) => {
        /// Counters since the daemon started.
        #[derive(Default)]
        pub struct Stats {
            $(#[doc = $help] pub $name: AtomicU64,)*
        }

        impl Stats {
            /// (name, help, value) of every counter.
            pub fn snapshot(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![$((stringify!($name), $help, self.$name.load(Ordering::Relaxed)),)*]
            }
        }
    };
}

counters! {
    packets_received: "datagrams received",
    packets_sent: "datagrams sent",
    bytes_received: "bytes received (UDP payloads)",
    bytes_sent: "bytes sent (UDP payloads)",
    data_received: "Data packets received (contributions, duplicates included)",
    values_aggregated: "values added into accumulators (goodput: x4 bytes)",
    results_sent: "Result packets sent (broadcast and unicast)",
    segments_completed: "segments finished (threshold reached or forced)",
    partial_results: "segments finished with fewer contributions than their threshold",
    duplicates: "contributions already counted (retransmissions), never added twice",
    retransmits_received: "Data packets flagged RETRANSMIT",
    results_resent: "results sent again from the kept copy (Help, or a retransmission after the result)",
    late: "contributions that came after their segment was finished (async), answered with the result",
    stale: "contributions refused as stale (async staleness bound)",
    malformed: "datagrams that were not valid packets (dropped)",
    unauthorized: "packets refused: wrong token, an address not on the allow-list, or not a member",
    out_of_order: "contributions refused as out of order",
    over_budget: "Joins refused because the job would exceed the daemon's memory budget",
    naks_sent: "Nak packets sent",
    control_received: "control messages received (Join, Leave, Reset, SetH, FBcast, Help)",
    members_timed_out: "members dropped after the member timeout",
    dropped_seeded: "datagrams dropped by the seeded loss setting (drop_rate)",
    upstream_sent: "partial sums forwarded to the parent daemon (hierarchical mode)",
    upstream_retransmits: "partial sums forwarded again after no result came back",
    busy_ns: "nanoseconds the event loop spent handling packets (not waiting)",
}

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

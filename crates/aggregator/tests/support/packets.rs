//! The `aggregate_packets` fuzz target's body: arbitrary bytes become a run of datagrams from
//! four source addresses into one daemon engine (each datagram: a source byte, a length byte,
//! then that many bytes, or a valid Join/Data built from the next bytes, so the fuzzer reaches
//! the job rules and not only the parser). Nothing may panic, and every packet the engine sends
//! must parse.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reprise_aggregator::engine::{data_packet, join_packet, Engine, Options};
use reprise_aggregator::packet::{self, Dtype, JoinParams, Mode, MEMBER_WORKER};
use reprise_aggregator::stats::Stats;

pub fn run(data: &[u8]) {
    let mut e = Engine::new(Options { member_timeout: Duration::from_millis(1), max_jobs: 2, ..Options::default() }, Arc::new(Stats::default()));
    let t0 = Instant::now();
    let mut at = 0;
    let mut step = 0u64;
    while at + 2 <= data.len() {
        let (source, len) = (data[at], data[at + 1] as usize);
        at += 2;
        let from = SocketAddr::from(([10, 0, 0, 1 + (source & 3)], 7000 + (source & 3) as u16));
        let member = (source & 3) as u16;
        let now = t0 + Duration::from_micros(step * 500);
        step += 1;
        let body = &data[at..(at + len).min(data.len())];
        at += body.len();
        match source >> 6 {
            0 => e.handle(body, from, now),
            1 => {
                let b = |i: usize| body.get(i).copied().unwrap_or(0);
                let params = JoinParams {
                    mode: if b(0) & 1 == 0 { Mode::Sync } else { Mode::Async },
                    dtype: if b(0) & 2 == 0 { Dtype::Int32 } else { Dtype::Float32 },
                    size: 1 + (b(1) % 4) as u16,
                    segment_values: 1 + (b(2) % 8) as u16,
                    window: 1 + (b(3) % 4) as u16,
                    staleness: (b(4) % 3) as u16,
                };
                e.handle(&join_packet((b(5) % 3) as u32, member, MEMBER_WORKER, &params, b""), from, now);
            }
            2 => {
                let b = |i: usize| body.get(i).copied().unwrap_or(0);
                let values: Vec<u32> = body.iter().skip(4).map(|&x| x as u32).take(8).collect();
                let values = if values.is_empty() { vec![1] } else { values };
                e.handle(&data_packet((b(0) % 3) as u32, member, b(1) as u32 % 16, b(2) as u32 % 4, b(3) as u32 % 4, &values, b(3) & 0x3f), from, now);
            }
            _ => e.tick(now),
        }
        for (_, bytes) in e.out.iter() {
            assert!(packet::parse(bytes).is_ok(), "the engine sent a packet that does not parse");
        }
        e.out.clear();
    }
}

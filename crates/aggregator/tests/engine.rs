//! The daemon's rules, driven without sockets: packets in, packets out.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use reprise_aggregator::engine::{control, data_packet, join_packet, Engine, Options, UpstreamOptions};
use reprise_aggregator::packet::{self, flags, Dtype, Header, JoinParams, Kind, Mode, NakCode, MEMBER_WORKER};
use reprise_aggregator::stats::Stats;

fn addr(i: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1 + (i / 200) as u8], 5000 + i))
}

fn params(size: u16, window: u16) -> JoinParams {
    JoinParams { mode: Mode::Sync, dtype: Dtype::Int32, size, segment_values: 4, window, staleness: 0 }
}

/// Packets an engine sent: (to, header, values).
fn drain(e: &mut Engine) -> Vec<(SocketAddr, Header, Vec<u32>)> {
    let out: Vec<_> = e
        .out
        .iter()
        .map(|(to, b)| {
            let p = packet::parse(b).expect("the engine sends valid packets");
            let values = p.payload.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            (to, p.header, values)
        })
        .collect();
    e.out.clear();
    out
}

fn engine(options: Options) -> Engine {
    Engine::new(options, Arc::new(Stats::default()))
}

fn join_all(e: &mut Engine, job: u32, p: &JoinParams, n: u16, now: Instant) {
    for m in 0..n {
        e.handle(&join_packet(job, m, MEMBER_WORKER, p, b""), addr(m), now);
    }
    let acks = drain(e);
    assert_eq!(acks.len(), n as usize);
    assert!(acks.iter().all(|(_, h, _)| h.kind == Kind::Ack && h.code == Kind::Join as u16));
}

fn results(out: &[(SocketAddr, Header, Vec<u32>)]) -> Vec<&(SocketAddr, Header, Vec<u32>)> {
    out.iter().filter(|(_, h, _)| h.kind == Kind::Result).collect()
}

#[test]
fn sync_segment_is_broadcast_once_every_member_contributed() {
    let now = Instant::now();
    let mut e = engine(Options::default());
    let p = params(3, 8);
    join_all(&mut e, 7, &p, 3, now);
    for m in 0..3u16 {
        let v = [m as u32 + 1, 10, 100, u32::MAX];
        e.handle(&data_packet(7, m, 0, 0, 0, &v, 0), addr(m), now);
        let out = drain(&mut e);
        if m < 2 {
            assert!(out.is_empty(), "nothing is sent before the last contribution");
        } else {
            let r = results(&out);
            assert_eq!(r.len(), 3, "one result per member");
            for (to, h, values) in r {
                assert_eq!(h.count, 3);
                assert_eq!(h.flags & (flags::PARTIAL | flags::LATE), 0);
                assert_eq!(values, &vec![6, 30, 300, u32::MAX.wrapping_mul(3)]);
                assert_eq!(*to, addr(h.member));
            }
        }
    }
}

#[test]
fn duplicate_is_never_added_twice_and_gets_the_kept_result_after_finish() {
    let now = Instant::now();
    let mut e = engine(Options::default());
    let p = params(2, 4);
    join_all(&mut e, 1, &p, 2, now);
    let v = [1, 2, 3, 4];
    e.handle(&data_packet(1, 0, 0, 0, 0, &v, 0), addr(0), now);
    e.handle(&data_packet(1, 0, 0, 0, 0, &v, flags::RETRANSMIT), addr(0), now);
    assert!(drain(&mut e).is_empty(), "a duplicate of an open segment is dropped");
    e.handle(&data_packet(1, 1, 0, 0, 0, &v, 0), addr(1), now);
    let out = drain(&mut e);
    assert_eq!(results(&out)[0].2, vec![2, 4, 6, 8], "member 0 counted once");
    // Member 0 lost its result and sends again: it gets the kept copy, nothing is added.
    e.handle(&data_packet(1, 0, 0, 0, 0, &v, flags::RETRANSMIT), addr(0), now);
    let out = drain(&mut e);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].0, out[0].1.kind, out[0].2.clone()), (addr(0), Kind::Result, vec![2, 4, 6, 8]));
    assert_eq!(e.stats.duplicates.load(std::sync::atomic::Ordering::Relaxed), 2);
}

#[test]
fn help_answers_from_the_kept_result_until_the_slot_moves_on_then_gone() {
    let now = Instant::now();
    let mut e = engine(Options::default());
    let p = params(1, 2);
    join_all(&mut e, 1, &p, 1, now);
    e.handle(&data_packet(1, 0, 0, 0, 0, &[5; 4], 0), addr(0), now);
    drain(&mut e);
    e.handle(&control(Kind::Help, 1, 0, 0, 0), addr(0), now);
    let out = drain(&mut e);
    assert_eq!((out[0].1.kind, out[0].1.seq, out[0].2.clone()), (Kind::Result, 0, vec![5; 4]));
    // seq 2 reuses slot 0; seq 0's result is no longer kept (sync keeps one per slot).
    e.handle(&data_packet(1, 0, 2, 1, 1, &[6; 4], 0), addr(0), now);
    drain(&mut e);
    e.handle(&control(Kind::Help, 1, 0, 0, 0), addr(0), now);
    let out = drain(&mut e);
    assert_eq!((out[0].1.kind, out[0].1.code), (Kind::Nak, NakCode::Gone as u16));
}

#[test]
fn skipping_ahead_of_the_window_is_refused_and_changes_nothing() {
    let now = Instant::now();
    let mut e = engine(Options::default());
    let p = params(2, 2);
    join_all(&mut e, 1, &p, 2, now);
    e.handle(&data_packet(1, 0, 0, 0, 0, &[1; 4], 0), addr(0), now);
    // Segment 2 uses slot 0, which is still summing segment 0.
    e.handle(&data_packet(1, 1, 2, 1, 1, &[9; 4], 0), addr(1), now);
    let out = drain(&mut e);
    assert_eq!((out[0].1.kind, out[0].1.code, out[0].1.value), (Kind::Nak, NakCode::OutOfOrder as u16, 0));
    e.handle(&data_packet(1, 1, 0, 0, 0, &[1; 4], 0), addr(1), now);
    assert_eq!(results(&drain(&mut e))[0].2, vec![2; 4], "segment 0 unchanged by the refused packet");
}

#[test]
fn joins_are_checked_token_parameters_rank_and_job_count() {
    let now = Instant::now();
    let mut e = engine(Options { token: Some("s3cret".into()), max_jobs: 1, ..Options::default() });
    let p = params(2, 4);
    let nak = |e: &mut Engine| {
        let out = drain(e);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.kind, Kind::Nak);
        NakCode::from_u16(out[0].1.code).expect("a known code")
    };
    e.handle(&join_packet(1, 0, MEMBER_WORKER, &p, b"wrong"), addr(0), now);
    assert_eq!(nak(&mut e), NakCode::Unauthorized);
    e.handle(&join_packet(1, 0, MEMBER_WORKER, &p, b""), addr(0), now);
    assert_eq!(nak(&mut e), NakCode::Unauthorized);
    assert!(e.job(1).is_none(), "a refused Join creates nothing");
    e.handle(&join_packet(1, 2, MEMBER_WORKER, &p, b"s3cret"), addr(0), now);
    assert_eq!(nak(&mut e), NakCode::Mismatch, "rank 2 of size 2");
    e.handle(&join_packet(1, 0, MEMBER_WORKER, &p, b"s3cret"), addr(0), now);
    assert_eq!(drain(&mut e)[0].1.kind, Kind::Ack);
    e.handle(&join_packet(1, 1, MEMBER_WORKER, &params(3, 4), b"s3cret"), addr(1), now);
    assert_eq!(nak(&mut e), NakCode::Mismatch, "other parameters for the same job");
    assert_eq!(e.job(1).map(|j| j.member_count()), Some(1));
    e.handle(&join_packet(2, 0, MEMBER_WORKER, &p, b"s3cret"), addr(0), now);
    assert_eq!(nak(&mut e), NakCode::Full);
    // Data from a non-member, or from a member's id at another address, is refused.
    e.handle(&data_packet(1, 1, 0, 0, 0, &[1; 4], 0), addr(1), now);
    assert_eq!(nak(&mut e), NakCode::NotMember);
    e.handle(&data_packet(1, 0, 0, 0, 0, &[1; 4], 0), addr(9), now);
    assert_eq!(nak(&mut e), NakCode::NotMember);
    e.handle(&data_packet(3, 0, 0, 0, 0, &[1; 4], 0), addr(0), now);
    assert_eq!(nak(&mut e), NakCode::NoJob);
}

#[test]
fn leave_lets_open_segments_finish_partial() {
    let now = Instant::now();
    let mut e = engine(Options::default());
    let p = params(3, 4);
    join_all(&mut e, 1, &p, 3, now);
    e.handle(&data_packet(1, 0, 0, 0, 0, &[1; 4], 0), addr(0), now);
    e.handle(&data_packet(1, 1, 0, 0, 0, &[2; 4], 0), addr(1), now);
    e.handle(&data_packet(1, 0, 1, 0, 0, &[1; 4], 0), addr(0), now);
    assert!(drain(&mut e).is_empty());
    e.handle(&control(Kind::Leave, 1, 2, 0, 0), addr(2), now);
    let out = drain(&mut e);
    assert!(out.iter().any(|(_, h, _)| h.kind == Kind::Ack && h.code == Kind::Leave as u16));
    let r = results(&out);
    assert_eq!(r.len(), 2, "segment 0 (both remaining members in) goes to members 0 and 1; segment 1 still waits for 1");
    assert!(r.iter().all(|(_, h, v)| h.seq == 0 && h.count == 2 && h.flags & flags::PARTIAL != 0 && v == &vec![3; 4]));
    // New segments need only the two remaining members, and are not partial.
    e.handle(&data_packet(1, 1, 1, 0, 0, &[2; 4], 0), addr(1), now);
    let r = drain(&mut e);
    assert!(results(&r).iter().all(|(_, h, _)| h.seq == 1 && h.flags & flags::PARTIAL != 0), "seg 1 started with H=3");
    e.handle(&data_packet(1, 0, 4, 1, 1, &[1; 4], 0), addr(0), now);
    e.handle(&data_packet(1, 1, 4, 1, 1, &[1; 4], 0), addr(1), now);
    let r = drain(&mut e);
    assert!(results(&r).iter().all(|(_, h, _)| h.seq == 4 && h.count == 2 && h.flags & flags::PARTIAL == 0));
}

#[test]
fn fbcast_broadcasts_an_open_segment_partial_and_set_h_applies_to_new_segments() {
    let now = Instant::now();
    let mut e = engine(Options::default());
    let p = JoinParams { mode: Mode::Async, staleness: 2, ..params(4, 4) };
    join_all(&mut e, 1, &p, 4, now);
    e.handle(&data_packet(1, 0, 0, 0, 0, &[1; 4], 0), addr(0), now);
    e.handle(&control(Kind::FBcast, 1, 0, 0, 0), addr(0), now);
    let out = drain(&mut e);
    let r = results(&out);
    assert_eq!(r.len(), 4);
    assert!(r.iter().all(|(_, h, v)| h.count == 1 && h.flags & flags::PARTIAL != 0 && v == &vec![1; 4]));
    assert!(r.iter().all(|(_, h, _)| (h.member == 0) == (h.flags & flags::LATE == 0)), "LATE to those not in it");
    assert!(out.iter().any(|(_, h, _)| h.kind == Kind::Ack && h.code == Kind::FBcast as u16 && h.value == 1));
    e.handle(&control(Kind::SetH, 1, 0, 0, 2), addr(0), now);
    assert_eq!(drain(&mut e)[0].1.value, 2);
    e.handle(&data_packet(1, 0, 1, 0, 0, &[1; 4], 0), addr(0), now);
    e.handle(&data_packet(1, 3, 1, 0, 0, &[5; 4], 0), addr(3), now);
    let r = drain(&mut e);
    assert_eq!(results(&r).len(), 4, "two contributions finish a segment after SetH 2");
    // A late contribution is not added: it gets the kept result flagged LATE.
    e.handle(&data_packet(1, 1, 1, 0, 0, &[100; 4], 0), addr(1), now);
    let r = drain(&mut e);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].1.flags & flags::LATE != 0, r[0].2.clone()), (true, vec![6; 4]));
    e.handle(&control(Kind::SetH, 1, 0, 0, 9), addr(0), now);
    assert_eq!(drain(&mut e)[0].1.code, NakCode::Mismatch as u16, "H above the job's size");
}

#[test]
fn async_refuses_gradients_more_than_staleness_rounds_behind() {
    let now = Instant::now();
    let mut e = engine(Options::default());
    let p = JoinParams { mode: Mode::Async, staleness: 1, ..params(2, 8) };
    join_all(&mut e, 1, &p, 2, now);
    e.handle(&control(Kind::SetH, 1, 0, 0, 1), addr(0), now);
    drain(&mut e);
    for round in 0..3u32 {
        e.handle(&data_packet(1, 0, round, round, round, &[1; 4], 0), addr(0), now);
    }
    drain(&mut e);
    // Three rounds are done; a gradient on version 1 is 2 behind (> S = 1).
    e.handle(&data_packet(1, 1, 3, 3, 1, &[1; 4], 0), addr(1), now);
    let out = drain(&mut e);
    assert_eq!((out[0].1.kind, out[0].1.code, out[0].1.value), (Kind::Nak, NakCode::Stale as u16, 3));
    e.handle(&data_packet(1, 1, 3, 3, 2, &[1; 4], 0), addr(1), now);
    assert_eq!(results(&drain(&mut e)).len(), 2, "version 2 is within the bound");
}

#[test]
fn reset_clears_every_slot() {
    let now = Instant::now();
    let mut e = engine(Options::default());
    let p = params(2, 2);
    join_all(&mut e, 1, &p, 2, now);
    e.handle(&data_packet(1, 0, 0, 0, 0, &[1; 4], 0), addr(0), now);
    e.handle(&control(Kind::Reset, 1, 0, 0, 0), addr(0), now);
    assert_eq!(drain(&mut e)[0].1.code, Kind::Reset as u16);
    e.handle(&data_packet(1, 0, 0, 0, 0, &[3; 4], 0), addr(0), now);
    e.handle(&data_packet(1, 1, 0, 0, 0, &[3; 4], 0), addr(1), now);
    assert_eq!(results(&drain(&mut e))[0].2, vec![6; 4], "the summing before the reset is gone");
}

#[test]
fn a_silent_member_is_dropped_after_the_timeout_and_its_open_segments_broadcast() {
    let t0 = Instant::now();
    let mut e = engine(Options { member_timeout: Duration::from_millis(100), ..Options::default() });
    let p = params(3, 4);
    join_all(&mut e, 1, &p, 3, t0);
    e.handle(&data_packet(1, 0, 0, 0, 0, &[1; 4], 0), addr(0), t0);
    e.handle(&data_packet(1, 1, 0, 0, 0, &[1; 4], 0), addr(1), t0);
    e.tick(t0 + Duration::from_millis(50));
    assert!(drain(&mut e).is_empty(), "not yet");
    let t1 = t0 + Duration::from_millis(150);
    e.handle(&control(Kind::Help, 1, 1, 0, 0), addr(1), t1); // member 1 is alive
    e.tick(t1);
    let out = drain(&mut e);
    let r = results(&out);
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|(_, h, _)| h.count == 2 && h.flags & flags::PARTIAL != 0));
    assert_eq!(e.job(1).map(|j| j.member_count()), Some(2));
}

/// Routes packets between engines (daemons) and a set of worker addresses in memory.
struct Fabric {
    daemons: HashMap<SocketAddr, Engine>,
    to_workers: Vec<(SocketAddr, Header, Vec<u32>)>,
}

impl Fabric {
    fn run(&mut self, now: Instant) {
        loop {
            let mut moving = Vec::new();
            for (from, e) in self.daemons.iter_mut() {
                for (to, b) in e.out.iter() {
                    moving.push((*from, to, b.to_vec()));
                }
                e.out.clear();
            }
            if moving.is_empty() {
                return;
            }
            for (from, to, bytes) in moving {
                match self.daemons.get_mut(&to) {
                    Some(e) => e.handle(&bytes, from, now),
                    None => {
                        let p = packet::parse(&bytes).expect("valid");
                        let v = p.payload.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                        self.to_workers.push((to, p.header, v));
                    }
                }
            }
        }
    }
}

#[test]
fn hierarchical_racks_forward_partial_sums_and_the_root_total_comes_back_to_every_worker() {
    let now = Instant::now();
    let root: SocketAddr = "10.9.0.1:7100".parse().unwrap();
    let racks: [SocketAddr; 2] = ["10.9.1.1:7100".parse().unwrap(), "10.9.2.1:7100".parse().unwrap()];
    let mut daemons = HashMap::new();
    daemons.insert(root, engine(Options::default()));
    for (i, r) in racks.iter().enumerate() {
        let up = UpstreamOptions { address: root, member: i as u16, size: 2 };
        daemons.insert(*r, engine(Options { upstream: Some(up), ..Options::default() }));
    }
    let mut f = Fabric { daemons, to_workers: Vec::new() };
    let p = params(2, 4);
    // Worker w is in rack w / 2 with local rank w % 2.
    for w in 0..4u16 {
        let rack = racks[(w / 2) as usize];
        f.daemons.get_mut(&rack).unwrap().handle(&join_packet(1, w % 2, MEMBER_WORKER, &p, b""), addr(w), now);
    }
    f.run(now);
    f.to_workers.clear();
    for seq in 0..3u32 {
        for w in 0..4u16 {
            let rack = racks[(w / 2) as usize];
            let v = [w as u32 + 1, seq, 1, 1000];
            f.daemons.get_mut(&rack).unwrap().handle(&data_packet(1, w % 2, seq, 0, 0, &v, 0), addr(w), now);
        }
        f.run(now);
        let got: Vec<_> = f.to_workers.drain(..).filter(|(_, h, _)| h.kind == Kind::Result).collect();
        assert_eq!(got.len(), 4, "every worker gets segment {seq}");
        for (_, h, v) in got {
            assert_eq!((h.seq, h.count), (seq, 4));
            assert_eq!(v, vec![10, 4 * seq, 4, 4000]);
        }
    }
}

#[test]
fn hierarchical_rack_sends_its_partial_again_until_the_root_answers() {
    let t0 = Instant::now();
    let root: SocketAddr = "10.9.0.1:7100".parse().unwrap();
    let up = UpstreamOptions { address: root, member: 0, size: 1 };
    let mut rack = engine(Options { upstream: Some(up), ..Options::default() });
    let p = params(1, 4);
    rack.handle(&join_packet(1, 0, MEMBER_WORKER, &p, b""), addr(0), t0);
    rack.handle(&data_packet(1, 0, 0, 0, 0, &[1; 4], 0), addr(0), t0);
    let first = drain(&mut rack);
    assert!(first.iter().any(|(to, h, _)| *to == root && h.kind == Kind::Join));
    assert!(first.iter().any(|(to, h, _)| *to == root && h.kind == Kind::Data && h.flags & flags::FROM_SWITCH != 0));
    rack.tick(t0 + Duration::from_millis(30));
    let again = drain(&mut rack);
    assert!(again.iter().any(|(_, h, v)| h.kind == Kind::Data && h.flags & flags::RETRANSMIT != 0 && v == &vec![1; 4]));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any arrival order with any duplicates gives exactly the wrapping int32 sum, once per
    /// member, and every member gets every segment.
    #[test]
    fn int32_sums_are_exact_whatever_the_order_and_duplicates(
        members in 1u16..6,
        segments in 1u32..6,
        seed in any::<u64>(),
        dups in 0usize..20,
    ) {
        use rand::{seq::SliceRandom, Rng, SeedableRng};
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
        let now = Instant::now();
        let mut e = engine(Options::default());
        let p = params(members, segments as u16);
        join_all(&mut e, 1, &p, members, now);
        let values: Vec<Vec<[u32; 4]>> = (0..members)
            .map(|_| (0..segments).map(|_| [rng.random(), rng.random(), rng.random(), rng.random()]).collect())
            .collect();
        let mut packets: Vec<(u16, u32)> = (0..members).flat_map(|m| (0..segments).map(move |s| (m, s))).collect();
        for _ in 0..dups {
            let k = rng.random_range(0..packets.len());
            packets.push(packets[k]);
        }
        packets.shuffle(&mut rng);
        let mut got: HashMap<(u16, u32), Vec<u32>> = HashMap::new();
        for (m, s) in packets {
            e.handle(&data_packet(1, m, s, 0, 0, &values[m as usize][s as usize], 0), addr(m), now);
            for (_, h, v) in drain(&mut e) {
                if h.kind == Kind::Result {
                    got.insert((h.member, h.seq), v);
                }
            }
        }
        for m in 0..members {
            for s in 0..segments {
                let mut want = [0u32; 4];
                for vals in &values {
                    for (w, x) in want.iter_mut().zip(vals[s as usize]) {
                        *w = w.wrapping_add(x);
                    }
                }
                prop_assert_eq!(got.get(&(m, s)), Some(&want.to_vec()));
            }
        }
    }

    /// The parser never panics, and whatever it accepts re-encodes to the same bytes.
    #[test]
    fn parser_refuses_garbage_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(p) = packet::parse(&bytes) {
            let again = packet::encode(&p.header, p.payload);
            prop_assert_eq!(again, bytes.clone());
        }
        let mut e = engine(Options::default());
        e.handle(&bytes, addr(0), Instant::now());
    }

    /// Mutating one byte of a valid packet is either refused or parses to a valid packet.
    #[test]
    fn mutated_packets_are_parsed_or_refused(at in 0usize..48, byte in any::<u8>(), elements in 1usize..4) {
        let mut bytes = data_packet(1, 0, 3, 2, 1, &vec![7u32; elements], flags::LAST);
        if at < bytes.len() {
            bytes[at] = byte;
        }
        if let Ok(p) = packet::parse(&bytes) {
            let carries = matches!(p.header.kind, Kind::Data | Kind::Result);
            prop_assert_eq!(p.payload.len(), if carries { p.header.elements as usize * 4 } else { 0 });
        }
    }

    #[test]
    fn headers_round_trip(kind in 1u8..=10, fl in 0u8..0x40, job in any::<u32>(), member in any::<u16>(), count in any::<u16>(),
                          seq in any::<u32>(), round in any::<u32>(), version in any::<u32>(), code in any::<u16>(), value in any::<u32>(),
                          values in proptest::collection::vec(any::<u32>(), 1..50)) {
        let kind = Kind::from_u8(kind).unwrap();
        let carries = matches!(kind, Kind::Data | Kind::Result);
        let h = Header { kind, flags: fl, job, member, count, seq, round, version, elements: if carries { values.len() as u16 } else { 0 }, code, value };
        let payload: Vec<u8> = if carries { values.iter().flat_map(|v| v.to_le_bytes()).collect() } else if kind == Kind::Join {
            let mut p = Vec::new();
            packet::write_join(&params(2, 4), b"tok", &mut p);
            p
        } else { Vec::new() };
        let bytes = packet::encode(&h, &payload);
        let parsed = packet::parse(&bytes).expect("an encoded packet parses");
        prop_assert_eq!(parsed.header, h);
        prop_assert_eq!(parsed.payload, &payload[..]);
    }
}

#[test]
fn float32_sums_add_values() {
    let now = Instant::now();
    let mut e = engine(Options::default());
    let p = JoinParams { dtype: Dtype::Float32, ..params(2, 4) };
    join_all(&mut e, 1, &p, 2, now);
    let a: Vec<u32> = [1.5f32, -2.0, 0.25, 1e-3].iter().map(|x| x.to_bits()).collect();
    let b: Vec<u32> = [0.5f32, 2.0, 0.5, 1e-3].iter().map(|x| x.to_bits()).collect();
    e.handle(&data_packet(1, 0, 0, 0, 0, &a, 0), addr(0), now);
    e.handle(&data_packet(1, 1, 0, 0, 0, &b, 0), addr(1), now);
    let out = drain(&mut e);
    let v: Vec<f32> = results(&out)[0].2.iter().map(|x| f32::from_bits(*x)).collect();
    assert_eq!(v, vec![2.0, 0.0, 0.75, 2e-3]);
}

#[test]
fn replies_are_flagged_reply_and_broadcasts_are_not() {
    let now = Instant::now();
    let mut e = engine(Options::default());
    let p = JoinParams { mode: Mode::Async, staleness: 4, ..params(2, 8) };
    join_all(&mut e, 2, &p, 2, now);
    e.handle(&control(Kind::SetH, 2, 0, 0, 1), addr(0), now);
    drain(&mut e);
    e.handle(&data_packet(2, 0, 0, 0, 0, &[1; 4], 0), addr(0), now);
    let out = drain(&mut e);
    let broadcast = results(&out);
    assert_eq!(broadcast.len(), 2);
    for (to, h, _) in &broadcast {
        assert_eq!(h.flags & flags::REPLY, 0, "a broadcast is not a reply");
        assert_eq!(h.flags & flags::LATE != 0, *to == addr(1), "LATE only for the member that did not contribute");
    }
    // Member 1's contribution comes late: the answer is the kept result, LATE and a REPLY.
    e.handle(&data_packet(2, 1, 0, 0, 0, &[5; 4], 0), addr(1), now);
    let out = drain(&mut e);
    let [(to, h, values)] = results(&out)[..] else { panic!("one reply, got {out:?}") };
    assert_eq!((*to, h.flags & (flags::LATE | flags::REPLY), values.clone()), (addr(1), flags::LATE | flags::REPLY, vec![1; 4]));
    // Help is answered the same way.
    e.handle(&control(Kind::Help, 2, 1, 0, 0), addr(1), now);
    let out = drain(&mut e);
    assert_eq!(results(&out)[0].1.flags & flags::REPLY, flags::REPLY);
}

#[test]
fn a_job_beyond_the_memory_budget_is_refused_and_creates_nothing() {
    let now = Instant::now();
    // The largest parameters a Join may carry: about 8.3 GiB of slots for one member.
    let huge = JoinParams { mode: Mode::Async, staleness: 64, window: 4096, segment_values: packet::MAX_ELEMENTS as u16, ..params(1, 1) };
    assert!(huge.max_bytes() > 8 << 30, "{}", huge.max_bytes());
    let small = params(2, 4);
    let stats = Arc::new(Stats::default());
    let mut e = Engine::new(Options { max_job_bytes: 1 << 20, max_total_bytes: 3 * small.max_bytes() / 2, ..Options::default() }, stats.clone());
    e.handle(&join_packet(1, 0, MEMBER_WORKER, &huge, b""), addr(0), now);
    let out = drain(&mut e);
    assert_eq!((out[0].1.kind, NakCode::from_u16(out[0].1.code), out[0].1.value), (Kind::Nak, Some(NakCode::Budget), 1));
    assert!(e.job(1).is_none(), "a refused Join creates nothing");
    // Within the per-job budget, but not within what the first job leaves of the total.
    e.handle(&join_packet(2, 0, MEMBER_WORKER, &small, b""), addr(0), now);
    assert_eq!(drain(&mut e)[0].1.kind, Kind::Ack);
    e.handle(&join_packet(3, 0, MEMBER_WORKER, &small, b""), addr(1), now);
    assert_eq!(NakCode::from_u16(drain(&mut e)[0].1.code), Some(NakCode::Budget));
    assert!(e.job(3).is_none());
    assert_eq!(stats.over_budget.load(std::sync::atomic::Ordering::Relaxed), 2);
}

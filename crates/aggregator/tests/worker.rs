//! The worker against a scripted daemon on a loopback socket: what it makes of results and
//! Naks that arrive in a given order (the real daemon's timing cannot be forced).

use std::net::{SocketAddr, UdpSocket};
use std::thread;
use std::time::Duration;

use reprise_aggregator::packet::{self, flags, Dtype, Header, JoinParams, Kind, Mode, NakCode};
use reprise_aggregator::worker::{Worker, WorkerOptions};

const JOB: u32 = 9;
const VALUES: [u32; 4] = [7, 7, 7, 7];

fn params() -> JoinParams {
    JoinParams { mode: Mode::Async, dtype: Dtype::Int32, size: 2, segment_values: 4, window: 4, staleness: 0 }
}

fn send(s: &UdpSocket, to: SocketAddr, h: Header, values: &[u32]) {
    let payload: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    s.send_to(&packet::encode(&h, &payload), to).expect("loopback send");
}

/// The next packet from the worker.
fn next(s: &UdpSocket) -> (Header, Vec<u32>, SocketAddr) {
    let mut buf = [0u8; 2048];
    let (n, from) = s.recv_from(&mut buf).expect("the worker sends within the timeout");
    let p = packet::parse(&buf[..n]).expect("the worker sends valid packets");
    let values = p.payload.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    (p.header, values, from)
}

fn result(seq: u32, extra: u8) -> Header {
    let mut h = Header::new(Kind::Result, JOB, 1);
    (h.seq, h.round, h.elements, h.count, h.flags) = (seq, 0, 4, 1, flags::LATE | extra);
    h
}

/// Joins a worker (member 1) to the scripted daemon: the Join is acknowledged, then a
/// broadcast of segment 0 without this worker's contribution (LATE, not a reply) waits in
/// its socket before its first call, as a faster member's finished round would.
fn joined(daemon: &UdpSocket) -> (Worker, SocketAddr) {
    let address = daemon.local_addr().expect("bound");
    let script = daemon.try_clone().expect("clone");
    let joiner = thread::spawn(move || {
        let (h, _, from) = next(&script);
        assert_eq!(h.kind, Kind::Join);
        let mut ack = Header::new(Kind::Ack, JOB, 1);
        (ack.code, ack.value) = (Kind::Join as u16, 2);
        send(&script, from, ack, &[]);
        from
    });
    let options = WorkerOptions {
        address,
        job: JOB,
        member: 1,
        params: params(),
        token: String::new(),
        timeout: Duration::from_secs(10),
        rto: Duration::from_millis(20),
        drop_rate: 0.0,
        seed: 0,
        on_path: false,
        offload: true,
    };
    let worker = Worker::join(options).expect("the scripted daemon acknowledges the Join");
    let from = joiner.join().expect("script");
    send(daemon, from, result(0, 0), &VALUES); // the broadcast, waiting in the worker's socket
    thread::sleep(Duration::from_millis(20));
    (worker, from)
}

fn answer_leave(daemon: &UdpSocket) {
    daemon.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    let mut buf = [0u8; 2048];
    while let Ok((n, from)) = daemon.recv_from(&mut buf) {
        if let Ok(p) = packet::parse(&buf[..n]) {
            if p.header.kind == Kind::Leave {
                let mut ack = Header::new(Kind::Ack, JOB, 1);
                ack.code = Kind::Leave as u16;
                send(daemon, from, ack, &[]);
                return;
            }
        }
    }
}

#[test]
fn a_broadcast_before_the_verdict_does_not_decide_a_stale_contribution() {
    let daemon = UdpSocket::bind("127.0.0.1:0").expect("loopback");
    let (mut worker, from) = joined(&daemon);
    let script = daemon.try_clone().expect("clone");
    let daemon_side = thread::spawn(move || {
        let (h, values, _) = next(&script);
        assert_eq!((h.kind, h.seq, values), (Kind::Data, 0, vec![1, 2, 3, 4]));
        let mut nak = Header::new(Kind::Nak, JOB, 1);
        (nak.code, nak.seq, nak.value) = (NakCode::Stale as u16, 0, 3);
        send(&script, from, nak, &[]);
        let (h, _, _) = next(&script);
        assert_eq!((h.kind, h.seq), (Kind::Help, 0), "a stale segment asks for its result");
        send(&script, from, result(0, flags::REPLY), &VALUES);
        answer_leave(&script);
    });
    let mut out = [0u32; 4];
    let report = worker.allreduce(&[1, 2, 3, 4], &mut out).expect("the call completes");
    assert_eq!(out, VALUES);
    assert_eq!((report.stale, report.late), (1, 0), "refused as stale: dropped, not carried");
    drop(worker);
    daemon_side.join().expect("script");
}

#[test]
fn a_late_reply_carries_the_contribution_into_the_next_call() {
    let daemon = UdpSocket::bind("127.0.0.1:0").expect("loopback");
    let (mut worker, from) = joined(&daemon);
    let script = daemon.try_clone().expect("clone");
    let daemon_side = thread::spawn(move || {
        let (h, _, _) = next(&script);
        assert_eq!((h.kind, h.seq), (Kind::Data, 0));
        send(&script, from, result(0, flags::REPLY), &VALUES);   // late, within the bound
        let (h, values, _) = next(&script);
        assert_eq!((h.kind, h.seq), (Kind::Data, 1));
        assert_eq!(values, vec![11, 22, 33, 44], "the late contribution is added to the next one");
        let mut done = result(1, flags::REPLY);
        done.flags = flags::REPLY;   // included this time
        send(&script, from, done, &[8, 8, 8, 8]);
        answer_leave(&script);
    });
    let mut out = [0u32; 4];
    let report = worker.allreduce(&[1, 2, 3, 4], &mut out).expect("first call");
    assert_eq!((out, report.late, report.stale), (VALUES, 1, 0));
    let report = worker.allreduce(&[10, 20, 30, 40], &mut out).expect("second call");
    assert_eq!((out, report.late, report.stale), ([8; 4], 0, 0));
    drop(worker);
    daemon_side.join().expect("script");
}

//! A member of a job: joins, then sums tensors with the other members through the daemon.
//!
//! `allreduce` cuts its input into segments of `segment_values` and numbers them on from the
//! previous call (`seq`). It keeps at most `window` segments outstanding and sends segment
//! `seq` only once it holds the result of `seq - window` (self-clocking: the daemon's slot is
//! then free). A segment whose result has not come back after the retransmission timeout is
//! sent again, flagged RETRANSMIT (the daemon never adds it twice, and answers from its kept
//! result if the segment is finished); the timeout doubles per segment up to one second.
//!
//! Async mode: a result flagged LATE does not include this worker's contribution (the segment
//! finished with the faster members'); the contribution is carried into the next call of the
//! same length and added to it. A contribution refused as stale is dropped. Only the daemon's
//! reply to this worker's own Data or Help (flagged REPLY) settles which: a broadcast LATE
//! result can arrive before the daemon has seen the contribution, and is ignored.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use socket2::Socket;

use crate::engine::{control, join_packet};
use crate::outbox::Outbox;
use crate::packet::{self, flags, Dtype, Header, JoinParams, Kind, NakCode, MEMBER_WORKER};
use crate::socket::{self, RecvBatch};
use crate::Error;

#[derive(Clone, Debug)]
pub struct WorkerOptions {
    pub address: SocketAddr,
    pub job: u32,
    pub member: u16,
    pub params: JoinParams,
    pub token: String,
    /// How long a call may go without progress before it fails.
    pub timeout: Duration,
    /// First retransmission timeout.
    pub rto: Duration,
    /// Seeded loss: drop this fraction of received datagrams (tests and benchmarks).
    pub drop_rate: f64,
    pub seed: u64,
    /// On-path mode: the daemon intercepts packets sent towards `address`, so results come
    /// from the daemon's own address: accept the job's packets from any source.
    pub on_path: bool,
    /// UDP segmentation and receive offload where the kernel has them (see the daemon's).
    pub offload: bool,
}

/// What one `allreduce` saw.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Contributions summed into each segment's result.
    pub counts: Vec<u16>,
    /// Segments whose result was partial (force-broadcast, or members were dropped).
    pub partial: u32,
    /// Async: segments that finished without this worker's contribution (carried over).
    pub late: u32,
    /// Async: segments whose contribution the daemon refused as stale (dropped).
    pub stale: u32,
    pub retransmits: u32,
}

pub struct Worker {
    socket: Socket,
    options: WorkerOptions,
    next_seq: u32,
    round: u32,
    carry: Vec<u32>,
    rtt: RttEstimate,
    batch: RecvBatch,
    gso: socket::Segmentation,
    out: Outbox,
    rng: Pcg64Mcg,
    closed: bool,
}

struct Segment {
    sent: Option<Instant>,
    /// When it was first sent (for round-trip samples) and whether it was sent again (Karn:
    /// a retransmitted segment gives no sample).
    first: Option<Instant>,
    again: bool,
    /// Its place in the order segments were (re)sent, and how many segments sent after it
    /// have finished while it waits: at `FAST_AFTER` it is sent again without waiting for
    /// its timeout (a packet of it was probably lost).
    order: u64,
    overtaken: u32,
    done: bool,
    late: bool,
    stale: bool,
}

/// Segments sent later that may finish first before a waiting one is sent again.
const FAST_AFTER: u32 = 3;
/// The retransmission timeout never goes below this.
const MIN_RTO: Duration = Duration::from_millis(2);

/// Round-trip estimate per RFC 6298 (smoothed RTT and variation), in seconds.
#[derive(Clone, Copy, Debug)]
struct RttEstimate {
    srtt: f64,
    rttvar: f64,
    samples: u64,
}

impl RttEstimate {
    fn sample(&mut self, rtt: Duration) {
        let r = rtt.as_secs_f64();
        if self.samples == 0 {
            self.srtt = r;
            self.rttvar = r / 2.0;
        } else {
            self.rttvar = 0.75 * self.rttvar + 0.25 * (self.srtt - r).abs();
            self.srtt = 0.875 * self.srtt + 0.125 * r;
        }
        self.samples += 1;
    }

    fn rto(&self, initial: Duration) -> Duration {
        if self.samples == 0 {
            return initial;
        }
        Duration::from_secs_f64(self.srtt + 4.0 * self.rttvar).clamp(MIN_RTO, Duration::from_secs(1))
    }
}

impl Worker {
    /// Joins the job (creating it if new); retries until acknowledged or `timeout`.
    pub fn join(options: WorkerOptions) -> Result<Worker, Error> {
        options.params.check().map_err(Error::InvalidArgument)?;
        if options.member >= options.params.size {
            return Err(Error::InvalidArgument(format!(
                "rank {} is not below the job's size {}",
                options.member, options.params.size
            )));
        }
        if !(0.0..1.0).contains(&options.drop_rate) {
            return Err(Error::InvalidArgument(format!("drop_rate must be in [0, 1), got {}", options.drop_rate)));
        }
        let any: SocketAddr = if options.address.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("a literal address");
        let socket = socket::bind(any, false, None).map_err(|e| Error::Io(format!("cannot open a UDP socket: {e}")))?;
        if !options.on_path {
            socket
                .connect(&options.address.into())
                .map_err(|e| Error::Io(format!("cannot reach the aggregation daemon at {}: {e}", options.address)))?;
        }
        let gro = options.offload && socket::enable_gro(&socket);
        let offload = options.offload;
        let rng = Pcg64Mcg::seed_from_u64(options.seed ^ (options.member as u64) << 32);
        let mut w = Worker {
            socket,
            options,
            next_seq: 0,
            round: 0,
            carry: Vec::new(),
            rtt: RttEstimate { srtt: 0.0, rttvar: 0.0, samples: 0 },
            batch: RecvBatch::with_gro(socket::BATCH, gro),
            gso: if offload { socket::Segmentation::default() } else { socket::Segmentation::off() },
            out: Outbox::default(),
            rng,
            closed: true, // until the Join is acknowledged: nothing to leave
        };
        let o = &w.options;
        let join = join_packet(o.job, o.member, MEMBER_WORKER, &o.params, o.token.as_bytes());
        w.request(&join, Kind::Join)?;
        w.closed = false;
        Ok(w)
    }

    pub fn options(&self) -> &WorkerOptions {
        &self.options
    }

    /// The next segment number and round (they restart at 0 after `reset`).
    pub fn position(&self) -> (u32, u32) {
        (self.next_seq, self.round)
    }

    fn send_raw(&self, bytes: &[u8]) -> Result<(), Error> {
        match self.socket.send_to(bytes, &self.options.address.into()) {
            Ok(_) => Ok(()),
            // An earlier send's ICMP error (the daemon was not up yet) surfaces here.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
            Err(e) => Err(Error::Io(format!("cannot send to the aggregation daemon at {}: {e}", self.options.address))),
        }
    }

    /// Receives what is waiting; calls `f` with each packet of this job from the daemon.
    fn receive(&mut self, wait: Duration, mut f: impl FnMut(&Header, &[u8])) -> Result<(), Error> {
        if !socket::wait_readable(&self.socket, Some(wait)).map_err(|e| Error::Io(format!("poll failed: {e}")))? {
            return Ok(());
        }
        let n = self.batch.recv(&self.socket).map_err(|e| Error::Io(format!("cannot receive from the aggregation daemon: {e}")))?;
        for i in 0..n {
            let Some((bytes, from)) = self.batch.get(i) else { continue };
            if !self.options.on_path && from != self.options.address {
                continue;
            }
            if self.options.drop_rate > 0.0 && self.rng.random::<f64>() < self.options.drop_rate {
                continue;
            }
            let Ok(p) = packet::parse(bytes) else { continue };
            if p.header.job != self.options.job {
                continue;
            }
            f(&p.header, p.payload);
        }
        Ok(())
    }

    /// Sends a control message until the daemon acknowledges it; returns the Ack's value.
    fn request(&mut self, bytes: &[u8], kind: Kind) -> Result<u32, Error> {
        let start = Instant::now();
        let mut rto = self.options.rto.max(Duration::from_millis(5));
        loop {
            self.send_raw(bytes)?;
            let sent = Instant::now();
            while sent.elapsed() < rto {
                let mut answer: Option<Result<u32, Error>> = None;
                let addr = self.options.address;
                let job_mib = self.options.params.max_bytes().div_ceil(1 << 20);
                self.receive(rto.saturating_sub(sent.elapsed()), |h, _| {
                    if h.kind == Kind::Ack && h.code == kind as u16 {
                        answer = Some(Ok(h.value));
                    } else if h.kind == Kind::Nak && answer.is_none() {
                        let why = NakCode::from_u16(h.code).map_or("an unknown reason", NakCode::describe);
                        let detail = match NakCode::from_u16(h.code) {
                            Some(NakCode::Mismatch) if kind == Kind::Join => {
                                format!(" (the job's size is {}; every member must join with the same mode, dtype, size, segment_values, window and staleness)", h.value)
                            }
                            Some(NakCode::Budget) => format!(
                                " (the job may hold {} MiB, over the {} MiB it may have; lower window, segment_values or staleness, or raise the daemon's max_job_bytes / max_total_bytes)",
                                job_mib, h.value
                            ),
                            _ => String::new(),
                        };
                        answer = Some(Err(Error::Refused(format!("the aggregation daemon at {addr} refused {}: {why}{detail}", kind.name()))));
                    }
                })?;
                if let Some(a) = answer {
                    return a;
                }
            }
            if start.elapsed() >= self.options.timeout {
                return Err(Error::Timeout(format!(
                    "no answer to {} from the aggregation daemon at {} in {:.1} s",
                    kind.name(),
                    self.options.address,
                    self.options.timeout.as_secs_f64()
                )));
            }
            rto = (rto * 2).min(Duration::from_secs(1));
        }
    }

    /// Sums `input` (raw 4-byte words of the job's dtype) with every member's, into `output`.
    pub fn allreduce(&mut self, input: &[u32], output: &mut [u32]) -> Result<Report, Error> {
        if self.closed {
            return Err(Error::InvalidArgument("this worker has left its job".into()));
        }
        if input.is_empty() || input.len() != output.len() {
            return Err(Error::InvalidArgument(format!(
                "allreduce needs a non-empty input and an output of the same length, got {} and {}",
                input.len(),
                output.len()
            )));
        }
        let p = self.options.params;
        let e = p.segment_values as usize;
        let segs = input.len().div_ceil(e);
        if segs as u64 + self.next_seq as u64 > u32::MAX as u64 {
            return Err(Error::InvalidArgument("the job's segment numbers are exhausted: reset() it".into()));
        }
        // What this worker contributes: its input plus what came late last time.
        let mut contribution = input.to_vec();
        if self.carry.len() == input.len() {
            add_words(p.dtype, &mut contribution, &self.carry);
        }
        self.carry.clear();
        let base = self.next_seq;
        let round = self.round;
        let window = p.window as usize;
        let mut state: Vec<Segment> = (0..segs)
            .map(|_| Segment {
                sent: None,
                first: None,
                again: false,
                order: 0,
                overtaken: 0,
                done: false,
                late: false,
                stale: false,
            })
            .collect();
        let mut order = 0u64;
        // Retransmission-timer backoff (reset by any result) and when it last fired.
        let mut backoff = 0u32;
        let mut last_timeout: Option<Instant> = None;
        // Outstanding segments in the order they were (re)sent.
        let mut waiting: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
        let mut report = Report { counts: vec![0; segs], ..Report::default() };
        let (mut next, mut finished) = (0usize, 0usize);
        let mut progress = Instant::now();
        let mut rejoin = false;
        let range = |j: usize| j * e..((j + 1) * e).min(input.len());
        while finished < segs {
            // Send what the window allows.
            while next < segs && (next < window || state[next - window].done) {
                if !state[next].done {
                    let last = if next + 1 == segs { flags::LAST } else { 0 };
                    self.push_data(base + next as u32, round, &contribution[range(next)], last);
                    let now = Instant::now();
                    let s = &mut state[next];
                    (s.sent, s.first, s.order) = (Some(now), Some(now), order);
                    order += 1;
                    waiting.push_back(next);
                }
                next += 1;
            }
            if rejoin {
                let o = &self.options;
                let join = join_packet(o.job, o.member, MEMBER_WORKER, &o.params, o.token.as_bytes());
                self.send_raw(&join)?;
                rejoin = false;
            }
            self.flush();
            // Wait for results until the earliest retransmission is due.
            let now = Instant::now();
            let rto_now = (self.rtt.rto(self.options.rto) * (1 << backoff.min(9))).min(Duration::from_secs(1));
            let due = match (waiting.front().and_then(|&j| state[j].sent), last_timeout) {
                (Some(sent), last) => {
                    let at = sent.max(last.unwrap_or(sent)) + rto_now;
                    at.saturating_duration_since(now)
                }
                (None, _) => Duration::from_millis(50),
            }
            .min(Duration::from_millis(50));
            let mut error: Option<Error> = None;
            let addr = self.options.address;
            let mut got = Vec::new();
            let mut stale_now = Vec::new();
            let out = &mut *output;
            self.receive(due, |h, payload| match h.kind {
                Kind::Result => {
                    // A broadcast without this worker's contribution may come before the
                    // daemon's verdict on it; the reply to its Data (LATE, or a Nak if
                    // stale) follows and decides.
                    if h.flags & flags::LATE != 0 && h.flags & flags::REPLY == 0 {
                        return;
                    }
                    let j = h.seq.wrapping_sub(base) as usize;
                    if j < segs && !state[j].done {
                        let r = range(j);
                        if h.elements as usize != r.len() {
                            return;
                        }
                        for (o, c) in out[r].iter_mut().zip(payload.chunks_exact(4)) {
                            *o = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        }
                        got.push((j, h.count, h.flags));
                        state[j].done = true;
                    }
                }
                Kind::Nak => match NakCode::from_u16(h.code) {
                    Some(NakCode::NoJob) | Some(NakCode::NotMember) => rejoin = true,
                    // A Nak about a segment this call is not waiting for answers a delayed
                    // or duplicated packet (reordering, a retransmission that crossed its
                    // result): nothing to do.
                    _ if (h.seq.wrapping_sub(base) as usize) >= segs => {}
                    // Stale also after its (LATE) result came: the contribution is not carried.
                    // Still waiting: ask for the result at once (below) rather than at the timeout.
                    Some(NakCode::Stale) => {
                        let j = h.seq.wrapping_sub(base) as usize;
                        if !state[j].stale && !state[j].done {
                            stale_now.push(j);
                        }
                        state[j].stale = true;
                    }
                    _ if state[h.seq.wrapping_sub(base) as usize].done => {}
                    Some(code) => {
                        error.get_or_insert(Error::Refused(format!(
                            "the aggregation daemon at {addr} refused segment {} of round {round}: {}",
                            h.seq,
                            code.describe()
                        )));
                    }
                    None => {}
                },
                _ => {}
            })?;
            if let Some(e) = error {
                return Err(e);
            }
            let arrived = Instant::now();
            let mut fast = Vec::new();
            for (j, count, fl) in got {
                if let (Some(first), false) = (state[j].first, state[j].again) {
                    self.rtt.sample(arrived.duration_since(first));
                }
                // Every segment sent before this one and still waiting was overtaken.
                let o = state[j].order;
                for &k in &waiting {
                    let s = &mut state[k];
                    if !s.done && s.order < o && s.sent.is_some() {
                        s.overtaken += 1;
                        if s.overtaken == FAST_AFTER {
                            fast.push(k);
                        }
                    }
                }
                report.counts[j] = count;
                report.partial += (fl & flags::PARTIAL != 0) as u32;
                if fl & flags::LATE != 0 && !state[j].stale {
                    state[j].late = true;
                }
                finished += 1;
                progress = Instant::now();
                backoff = 0;
                last_timeout = None;
            }
            waiting.retain(|&k| !state[k].done);
            // Send again what is overdue or was overtaken: data, or Help when the daemon
            // refused the data as stale.
            // The retransmission timer covers the oldest waiting segment only, as TCP's does:
            // when it fires, that one segment is sent again and the timer backs off (a slow
            // member delays every segment alike; sending the whole window again would only
            // flood the daemon with duplicates). Other losses are found by overtaking.
            let now = Instant::now();
            let rto_now = (self.rtt.rto(self.options.rto) * (1 << backoff.min(9))).min(Duration::from_secs(1));
            let mut again: Vec<usize> = Vec::new();
            for &j in fast.iter().chain(&stale_now) {
                if !state[j].done && !again.contains(&j) {
                    again.push(j);
                }
            }
            if let Some(&j) = waiting.front() {
                let sent = state[j].sent.unwrap_or(now);
                let since = now.duration_since(sent.max(last_timeout.unwrap_or(sent)));
                if since >= rto_now && !again.contains(&j) {
                    again.push(j);
                    backoff += 1;
                    last_timeout = Some(now);
                }
            }
            for j in again {
                let seq = base + j as u32;
                if state[j].stale {
                    let mut h = Header::new(Kind::Help, self.options.job, self.options.member);
                    h.seq = seq;
                    self.out.push(self.options.address, &h, &[]);
                } else {
                    let last = if j + 1 == segs { flags::LAST } else { 0 };
                    self.push_data(seq, round, &contribution[range(j)], flags::RETRANSMIT | last);
                }
                let s = &mut state[j];
                s.sent = Some(now);
                s.again = true;
                s.overtaken = 0;
                s.order = order;
                order += 1;
                report.retransmits += 1;
            }
            // Keep `waiting` in send order: the segments just sent again go to the back.
            let mut w: Vec<usize> = waiting.drain(..).collect();
            w.sort_by_key(|&k| state[k].order);
            waiting.extend(w);
            if progress.elapsed() >= self.options.timeout {
                let missing: Vec<u32> = state.iter().enumerate().filter(|(_, s)| !s.done).map(|(j, _)| base + j as u32).take(8).collect();
                return Err(Error::Timeout(format!(
                    "round {round}: no result for segments {missing:?}{} from the aggregation daemon at {} in {:.1} s (is it running, and are the other members sending?)",
                    if segs - finished > 8 { " ..." } else { "" },
                    self.options.address,
                    self.options.timeout.as_secs_f64()
                )));
            }
        }
        // Async: carry the contributions that came late into the next call.
        if state.iter().any(|s| s.late && !s.stale) {
            self.carry = vec![0; input.len()];
            for (j, s) in state.iter().enumerate() {
                if s.late && !s.stale {
                    let r = range(j);
                    self.carry[r.clone()].copy_from_slice(&contribution[r]);
                    report.late += 1;
                }
            }
        }
        report.stale = state.iter().filter(|s| s.stale).count() as u32;
        self.next_seq = base + segs as u32;
        self.round += 1;
        Ok(report)
    }

    fn push_data(&mut self, seq: u32, round: u32, values: &[u32], extra: u8) {
        let mut h = Header::new(Kind::Data, self.options.job, self.options.member);
        h.flags = extra;
        h.count = 1;
        h.seq = seq;
        h.round = round;
        h.version = round;
        h.elements = values.len() as u16;
        self.out.push(self.options.address, &h, values);
    }

    fn flush(&mut self) {
        if !self.out.is_empty() {
            socket::send_all(&self.socket, &mut self.out, &self.gso);
        }
    }

    /// SetH: the threshold for segments that start from now on (0: every member).
    pub fn set_h(&mut self, h: u16) -> Result<u32, Error> {
        let o = &self.options;
        let bytes = control(Kind::SetH, o.job, o.member, 0, h as u32);
        self.request(&bytes, Kind::SetH)
    }

    /// Reset: clears the job's slots; every member's stream restarts at segment 0.
    pub fn reset(&mut self) -> Result<(), Error> {
        let o = &self.options;
        let bytes = control(Kind::Reset, o.job, o.member, 0, 0);
        self.request(&bytes, Kind::Reset)?;
        self.next_seq = 0;
        self.round = 0;
        self.carry.clear();
        Ok(())
    }

    /// FBcast: asks the daemon to broadcast segment `seq` with what it has. Returns whether
    /// it was open (and so broadcast).
    pub fn fbcast(&mut self, seq: u32) -> Result<bool, Error> {
        let o = &self.options;
        let bytes = control(Kind::FBcast, o.job, o.member, seq, 0);
        Ok(self.request(&bytes, Kind::FBcast)? == 1)
    }

    /// Leave: the job's open segments stop waiting for this worker.
    pub fn leave(&mut self) -> Result<(), Error> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let o = &self.options;
        let bytes = control(Kind::Leave, o.job, o.member, 0, 0);
        self.request(&bytes, Kind::Leave).map(|_| ())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if !self.closed {
            let o = &self.options;
            let _ = self.send_raw(&control(Kind::Leave, o.job, o.member, 0, 0));
        }
    }
}

/// `acc += words`, element-wise, in the job's dtype.
pub fn add_words(dtype: Dtype, acc: &mut [u32], words: &[u32]) {
    match dtype {
        Dtype::Int32 => acc.iter_mut().zip(words).for_each(|(a, w)| *a = a.wrapping_add(*w)),
        Dtype::Float32 => acc.iter_mut().zip(words).for_each(|(a, w)| *a = (f32::from_bits(*a) + f32::from_bits(*w)).to_bits()),
    }
}

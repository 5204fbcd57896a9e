//! The daemon's logic without sockets: datagrams in, packets out (`Outbox`). The event loop
//! (`daemon.rs`) feeds it; tests drive it directly with made-up addresses.
//!
//! Admission: a source outside the allow-list is dropped before parsing; a Join must carry
//! the token (compared in constant time); every other packet must come from the address its
//! member joined from. A malformed packet is counted and dropped, never answered.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use subtle::ConstantTimeEq;

use crate::job::{Job, Upstream};
use crate::outbox::Outbox;
use crate::packet::{self, encode, flags, write_join, Header, JoinParams, Kind, NakCode, MEMBER_SWITCH};
use crate::stats::Stats;

/// An address range of the allow-list: `10.0.0.0/8`, `192.168.1.7`, `::1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allow {
    pub net: IpAddr,
    pub prefix: u8,
}

impl std::str::FromStr for Allow {
    type Err = String;

    fn from_str(s: &str) -> Result<Allow, String> {
        let (ip, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let net: IpAddr = ip.trim().parse().map_err(|_| format!("{s:?}: expected an IP address or ADDRESS/PREFIX"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p.trim().parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(|| format!("{s:?}: prefix must be 0..={max}"))?,
        };
        Ok(Allow { net, prefix })
    }
}

impl Allow {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - self.prefix as u32) };
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - self.prefix as u32) };
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// The parent of a hierarchical daemon.
#[derive(Clone, Debug)]
pub struct UpstreamOptions {
    pub address: SocketAddr,
    /// This daemon's member id at the parent (its rack number).
    pub member: u16,
    /// How many daemons (racks) the parent aggregates.
    pub size: u16,
}

/// What the daemon is told at start.
#[derive(Clone, Debug)]
pub struct Options {
    pub token: Option<String>,
    /// Sources allowed to send anything; empty allows every source.
    pub allow: Vec<Allow>,
    /// Members an open segment has waited for this long, and not heard from for as long, are
    /// dropped.
    pub member_timeout: Duration,
    pub max_jobs: usize,
    /// Memory budget: the most a job may hold (`JoinParams::max_bytes`), and all jobs
    /// together. A Join that would create a job beyond either is refused (`Nak Budget`).
    pub max_job_bytes: u64,
    pub max_total_bytes: u64,
    /// Seeded loss: drop this fraction of received datagrams (tests and benchmarks).
    pub drop_rate: f64,
    pub seed: u64,
    pub upstream: Option<UpstreamOptions>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            token: None,
            allow: Vec::new(),
            member_timeout: Duration::from_secs(30),
            max_jobs: 64,
            max_job_bytes: DEFAULT_MAX_JOB_BYTES,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
            drop_rate: 0.0,
            seed: 0,
            upstream: None,
        }
    }
}

/// The default memory budget: 256 MiB a job, 1 GiB in all (a small machine's share).
pub const DEFAULT_MAX_JOB_BYTES: u64 = 256 << 20;
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 1 << 30;

/// How often the event loop calls `tick`.
pub const TICK: Duration = Duration::from_millis(5);
/// How often a child daemon sends its Join to the parent until it is acknowledged.
const UPSTREAM_JOIN_EVERY: Duration = Duration::from_millis(100);

pub struct Engine {
    options: Options,
    jobs: HashMap<u32, Job>,
    rng: Pcg64Mcg,
    pub stats: Arc<Stats>,
    pub out: Outbox,
}

impl Engine {
    pub fn new(options: Options, stats: Arc<Stats>) -> Engine {
        let rng = Pcg64Mcg::seed_from_u64(options.seed);
        Engine { options, jobs: HashMap::new(), rng, stats, out: Outbox::default() }
    }

    pub fn job(&self, id: u32) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// One received datagram.
    pub fn handle(&mut self, bytes: &[u8], from: SocketAddr, now: Instant) {
        let stats = self.stats.clone();
        Stats::add(&stats.packets_received, 1);
        Stats::add(&stats.bytes_received, bytes.len() as u64);
        if self.options.drop_rate > 0.0 && self.rng.random::<f64>() < self.options.drop_rate {
            Stats::add(&stats.dropped_seeded, 1);
            return;
        }
        if !self.options.allow.is_empty() && !self.options.allow.iter().any(|a| a.contains(from.ip())) {
            Stats::add(&stats.unauthorized, 1);
            return;
        }
        let p = match packet::parse(bytes) {
            Ok(p) => p,
            Err(e) => {
                Stats::add(&stats.malformed, 1);
                tracing::debug!("dropped a malformed packet from {from}: {e}");
                return;
            }
        };
        let h = p.header;
        match h.kind {
            Kind::Join => self.join(&h, p.payload, from, now),
            Kind::Result | Kind::Ack | Kind::Nak => self.handle_upstream(&h, p.payload, from),
            _ => {
                Stats::add(&stats.control_received, (h.kind != Kind::Data) as u64);
                let Some(job) = self.jobs.get_mut(&h.job) else {
                    let mut reply = Header::new(Kind::Nak, h.job, h.member);
                    reply.code = NakCode::NoJob as u16;
                    reply.seq = h.seq;
                    Stats::add(&stats.naks_sent, 1);
                    self.out.push(from, &reply, &[]);
                    return;
                };
                if !job.is_member(h.member, from, now) {
                    if h.kind == Kind::Leave {
                        // Already gone: its first Leave's Ack was lost. Leaving is idempotent.
                        job.ack(Kind::Leave, from, h.member, 0, &mut self.out);
                        return;
                    }
                    Stats::add(&stats.unauthorized, 1);
                    job.nak(NakCode::NotMember, (from, h.member), 0, h.seq, &mut self.out, &stats);
                    return;
                }
                match h.kind {
                    Kind::Data => job.data(&h, p.payload, from, now, &mut self.out, &stats),
                    Kind::Help => job.help(&h, from, &mut self.out, &stats),
                    Kind::FBcast => job.fbcast(&h, from, now, &mut self.out, &stats),
                    Kind::SetH => job.set_h(&h, from, &mut self.out, &stats),
                    Kind::Reset => job.reset(&h, from, &mut self.out),
                    Kind::Leave => {
                        job.ack(Kind::Leave, from, h.member, 0, &mut self.out);
                        job.leave(h.member, now, &mut self.out, &stats);
                    }
                    _ => {}
                }
            }
        }
    }

    fn join(&mut self, h: &Header, payload: &[u8], from: SocketAddr, now: Instant) {
        let stats = self.stats.clone();
        Stats::add(&stats.control_received, 1);
        let Ok((params, token)) = packet::join_params(payload) else {
            Stats::add(&stats.malformed, 1);
            return;
        };
        let nak = |out: &mut Outbox, code: NakCode, value: u32| {
            let mut reply = Header::new(Kind::Nak, h.job, h.member);
            reply.code = code as u16;
            reply.value = value;
            Stats::add(&stats.naks_sent, 1);
            out.push(from, &reply, &[]);
        };
        let expected = self.options.token.as_deref().unwrap_or("").as_bytes();
        if !bool::from(token.ct_eq(expected)) {
            Stats::add(&stats.unauthorized, 1);
            tracing::warn!("aggregate: refused a Join from {from} for job {}: wrong or missing token", h.job);
            nak(&mut self.out, NakCode::Unauthorized, 0);
            return;
        }
        if h.member >= params.size {
            nak(&mut self.out, NakCode::Mismatch, params.size as u32);
            return;
        }
        if !self.jobs.contains_key(&h.job) {
            if self.jobs.len() >= self.options.max_jobs {
                nak(&mut self.out, NakCode::Full, self.options.max_jobs as u32);
                return;
            }
            let need = params.max_bytes();
            let held: u64 = self.jobs.values().map(|j| j.params.max_bytes()).sum();
            let left = self.options.max_total_bytes.saturating_sub(held);
            if need > self.options.max_job_bytes || need > left {
                let limit = if need > self.options.max_job_bytes { self.options.max_job_bytes } else { left };
                Stats::add(&stats.over_budget, 1);
                tracing::warn!("aggregate: refused job {} from {from}: it may hold {need} bytes, over the budget of {limit}", h.job);
                nak(&mut self.out, NakCode::Budget, (limit >> 20).min(u32::MAX as u64) as u32);
                return;
            }
            let upstream = self.options.upstream.as_ref().map(|u| Upstream {
                addr: u.address,
                member: u.member,
                size: u.size,
                joined: false,
                last_join: None,
            });
            self.jobs.insert(h.job, Job::new(h.job, params, upstream));
            tracing::info!("aggregate: job {} created by member {} from {from}: {params:?}", h.job, h.member);
        }
        let job = self.jobs.get_mut(&h.job).expect("inserted above");
        if job.params != params {
            nak(&mut self.out, NakCode::Mismatch, job.params.size as u32);
            return;
        }
        job.join(h.member, h.value, from, now, &mut self.out);
        self.join_upstream(h.job, now);
    }

    /// Sends this daemon's Join to its parent for `job`, until acknowledged.
    fn join_upstream(&mut self, job: u32, now: Instant) {
        let Some(j) = self.jobs.get_mut(&job) else { return };
        let params = j.params;
        let Some(up) = j.upstream.as_mut() else { return };
        if up.joined || up.last_join.is_some_and(|t| now.duration_since(t) < UPSTREAM_JOIN_EVERY) {
            return;
        }
        up.last_join = Some(now);
        let parent = JoinParams { size: up.size, ..params };
        let mut h = Header::new(Kind::Join, job, up.member);
        h.value = MEMBER_SWITCH;
        let mut payload = Vec::new();
        write_join(&parent, self.options.token.as_deref().unwrap_or("").as_bytes(), &mut payload);
        self.out.push_bytes(up.addr, &h, &payload);
    }

    /// Results, Acks and Naks are only taken from a job's parent daemon.
    fn handle_upstream(&mut self, h: &Header, payload: &[u8], from: SocketAddr) {
        let stats = self.stats.clone();
        let Some(job) = self.jobs.get_mut(&h.job).filter(|j| j.upstream.as_ref().is_some_and(|u| u.addr == from)) else {
            Stats::add(&stats.unauthorized, 1);
            return;
        };
        match h.kind {
            Kind::Result => job.upstream_result(h, payload, &stats, &mut self.out),
            Kind::Ack if h.code == Kind::Join as u16 => {
                if let Some(up) = job.upstream.as_mut() {
                    up.joined = true;
                }
            }
            Kind::Nak => {
                let why = NakCode::from_u16(h.code).map_or("an unknown reason", NakCode::describe);
                tracing::warn!("aggregate: the parent daemon {from} refused job {} segment {}: {why}", h.job, h.seq);
                if h.code == NakCode::NotMember as u16 || h.code == NakCode::NoJob as u16 {
                    if let Some(up) = job.upstream.as_mut() {
                        up.joined = false; // the parent restarted: join again
                    }
                }
            }
            _ => {}
        }
    }

    /// Timers: members that stopped answering, partial sums the parent has not answered,
    /// Joins to the parent.
    pub fn tick(&mut self, now: Instant) {
        let stats = self.stats.clone();
        let ids: Vec<u32> = self.jobs.keys().copied().collect();
        for id in ids {
            if let Some(job) = self.jobs.get_mut(&id) {
                let dead = job.expire(now, self.options.member_timeout, &mut self.out, &stats);
                for member in dead {
                    tracing::warn!(
                        "aggregate: job {id}: member {member} dropped: not heard from for {:?} while a segment waited for it",
                        self.options.member_timeout
                    );
                }
                job.upstream_retransmit(now, &mut self.out, &stats);
            }
            self.join_upstream(id, now);
        }
    }
}

/// A control packet as bytes (for workers and tests).
pub fn control(kind: Kind, job: u32, member: u16, seq: u32, value: u32) -> Vec<u8> {
    let mut h = Header::new(kind, job, member);
    h.seq = seq;
    h.value = value;
    encode(&h, &[])
}

/// A Join as bytes.
pub fn join_packet(job: u32, member: u16, member_type: u32, params: &JoinParams, token: &[u8]) -> Vec<u8> {
    let mut h = Header::new(Kind::Join, job, member);
    h.value = member_type;
    let mut payload = Vec::new();
    write_join(params, token, &mut payload);
    encode(&h, &payload)
}

/// A Data packet as bytes.
#[allow(clippy::too_many_arguments)]
pub fn data_packet(job: u32, member: u16, seq: u32, round: u32, version: u32, values: &[u32], extra_flags: u8) -> Vec<u8> {
    let mut h = Header::new(Kind::Data, job, member);
    h.flags = extra_flags & flags::ALL;
    h.count = 1;
    h.seq = seq;
    h.round = round;
    h.version = version;
    h.elements = values.len() as u16;
    let mut payload = Vec::with_capacity(values.len() * 4);
    for v in values {
        payload.extend_from_slice(&v.to_le_bytes());
    }
    encode(&h, &payload)
}

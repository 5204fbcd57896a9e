//! A job: its members, its threshold, its slots, and the rules for every packet it receives.
//!
//! The rules (`docs/aggregation.md` states them for users):
//! - **Threshold.** An aggregation finishes after H contributors. H is the job's `size`
//!   minus the members that left or timed out, unless SetH set it (SetH applies to segments
//!   that start after it). Sync mode: H is every member. Async mode: SetH H < size lets the
//!   fastest H finish a segment; the others' contributions come late.
//! - **Duplicates** (a retransmission, a second copy) are never added: a member's bit in the
//!   slot's `seen` set admits one contribution per segment. If the segment is finished, the
//!   kept result is sent back to that member (its result was lost); otherwise it is dropped.
//! - **Late** contributions (async: the segment finished without them) are not added; the
//!   sender gets the kept result flagged LATE, and the worker carries its gradient into its
//!   next round (so nothing is lost unless it grows stale).
//! - **Staleness** (async): a contribution computed on weights version v is refused with a
//!   Nak(Stale) when the job has finished more than v + S rounds.
//! - **Members that stop answering**: when a segment has waited `member_timeout` for members
//!   not heard from for as long, they are dropped (as if they sent Leave); every open segment
//!   the remaining members have all contributed to is then force-broadcast (flagged PARTIAL).
//! - **Hierarchy**: with an upstream, a finished segment is not broadcast; its partial sum goes
//!   to the parent daemon as one contribution (FROM_SWITCH, `count` = the rack's contributions)
//!   and is sent again until the parent's result comes back, which is then broadcast to the
//!   rack.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::outbox::Outbox;
use crate::packet::{flags, Header, JoinParams, Kind, Mode, NakCode, MEMBER_SWITCH};
use crate::slot::{add_values, Members, Slot};
use crate::stats::Stats;

/// A member: where it joined from and when it was last heard.
#[derive(Clone, Debug)]
pub struct Member {
    pub addr: SocketAddr,
    pub switch: bool,
    pub last_heard: Instant,
}

/// The parent daemon of a hierarchical job (this daemon is one of its members).
#[derive(Clone, Debug)]
pub struct Upstream {
    pub addr: SocketAddr,
    /// This daemon's member id at the parent.
    pub member: u16,
    /// How many member daemons the parent's job has.
    pub size: u16,
    pub joined: bool,
    pub last_join: Option<Instant>,
}

/// First wait before a partial sum is sent to the parent again (doubles, up to 1 s).
const UPSTREAM_RTO: Duration = Duration::from_millis(20);

pub struct Job {
    pub id: u32,
    pub params: JoinParams,
    pub members: Vec<Option<Member>>,
    /// Members that left or timed out (they lower the default threshold).
    gone: usize,
    /// SetH's threshold; 0 means every member.
    h_override: u16,
    slots: Vec<Slot>,
    /// Rounds finished: one past the highest round of any finished segment.
    round_done: u32,
    pub upstream: Option<Upstream>,
}

impl Job {
    pub fn new(id: u32, params: JoinParams, upstream: Option<Upstream>) -> Job {
        Job {
            id,
            params,
            members: vec![None; params.size as usize],
            gone: 0,
            h_override: 0,
            slots: (0..params.window).map(|_| Slot::default()).collect(),
            round_done: 0,
            upstream,
        }
    }

    pub fn member_count(&self) -> usize {
        self.members.iter().filter(|m| m.is_some()).count()
    }

    /// Contributors an aggregation starting now needs.
    fn threshold(&self) -> u16 {
        let all = (self.params.size as usize).saturating_sub(self.gone).max(1) as u16;
        if self.h_override == 0 { all } else { self.h_override.min(all) }
    }

    fn keep(&self) -> usize {
        match self.params.mode {
            Mode::Sync => 1,
            Mode::Async => self.params.staleness as usize + 1,
        }
    }

    /// A control answer to `(address, member id)`.
    fn reply(&self, kind: Kind, (to, member): (SocketAddr, u16), code: u16, value: u32, seq: u32, out: &mut Outbox) {
        let mut h = Header::new(kind, self.id, member);
        h.code = code;
        h.value = value;
        h.seq = seq;
        out.push(to, &h, &[]);
    }

    pub fn ack(&self, of: Kind, to: SocketAddr, member: u16, value: u32, out: &mut Outbox) {
        self.reply(Kind::Ack, (to, member), of as u16, value, 0, out);
    }

    pub fn nak(&self, why: NakCode, to: (SocketAddr, u16), value: u32, seq: u32, out: &mut Outbox, stats: &Stats) {
        Stats::add(&stats.naks_sent, 1);
        self.reply(Kind::Nak, to, why as u16, value, seq, out);
    }

    /// Admits a member (a Join whose token and parameters were checked). A member that joins
    /// again (restarted, or its Ack was lost) takes its id back from its new address.
    pub fn join(&mut self, member: u16, member_type: u32, from: SocketAddr, now: Instant, out: &mut Outbox) {
        let was = self.members[member as usize].is_some();
        self.members[member as usize] = Some(Member { addr: from, switch: member_type == MEMBER_SWITCH, last_heard: now });
        if !was && self.gone > 0 {
            self.gone -= 1;
        }
        self.ack(Kind::Join, from, member, self.member_count() as u32, out);
    }

    /// Whether `from` is member `id` of this job; refreshes its last-heard time.
    pub fn is_member(&mut self, id: u16, from: SocketAddr, now: Instant) -> bool {
        match self.members.get_mut(id as usize) {
            Some(Some(m)) if m.addr == from => {
                m.last_heard = now;
                true
            }
            _ => false,
        }
    }

    /// A member's contribution to segment `h.seq`.
    pub fn data(&mut self, h: &Header, values: &[u8], from: SocketAddr, now: Instant, out: &mut Outbox, stats: &Stats) {
        Stats::add(&stats.data_received, 1);
        if h.flags & flags::RETRANSMIT != 0 {
            Stats::add(&stats.retransmits_received, 1);
        }
        if self.params.mode == Mode::Async && self.round_done > h.version.saturating_add(self.params.staleness as u32) {
            Stats::add(&stats.stale, 1);
            self.nak(NakCode::Stale, (from, h.member), self.round_done, h.seq, out, stats);
            return;
        }
        let window = self.params.window as u32;
        let i = (h.seq % window) as usize;
        let size = self.params.size as usize;
        let count = if h.flags & flags::FROM_SWITCH != 0 { h.count.max(1) } else { 1 };
        let slot = &mut self.slots[i];
        if let Some(open) = slot.open.as_mut().filter(|o| o.seq == h.seq) {
            if open.seen.contains(h.member) {
                Stats::add(&stats.duplicates, 1);
                return;
            }
            if open.elements != h.elements {
                Stats::add(&stats.malformed, 1);
                return;
            }
            add_values(self.params.dtype, &mut open.acc, values);
            Stats::add(&stats.values_aggregated, h.elements as u64);
            open.seen.insert(h.member);
            open.contributors += 1;
            open.count = open.count.saturating_add(count);
            open.last |= h.flags & flags::LAST != 0;
            if open.contributors >= open.h && open.forwarded.is_none() {
                self.finished(i, now, out, stats);
            }
            return;
        }
        let newer = match slot.last_seq {
            None => true,
            Some(last) => h.seq > last,
        };
        if newer {
            let in_order = slot.open.is_none() && slot.last_seq.is_none_or(|last| h.seq - last == window);
            if !in_order {
                Stats::add(&stats.out_of_order, 1);
                let expected = slot.open.as_ref().map_or(slot.last_seq.map_or(h.seq, |l| l + window), |o| o.seq);
                self.nak(NakCode::OutOfOrder, (from, h.member), expected, h.seq, out, stats);
                return;
            }
            let threshold = self.threshold();
            let slot = &mut self.slots[i];
            slot.start(h.seq, h.round, values, count, h.member, size, threshold, h.flags & flags::LAST != 0, now);
            Stats::add(&stats.values_aggregated, h.elements as u64);
            if threshold <= 1 {
                self.finished(i, now, out, stats);
            }
            return;
        }
        // An older segment: answer from the kept result, or say it is gone.
        match slot.kept(h.seq) {
            Some(k) => {
                let late = !k.seen.contains(h.member);
                if late {
                    Stats::add(&stats.late, 1);
                } else {
                    Stats::add(&stats.duplicates, 1);
                }
                Stats::add(&stats.results_resent, 1);
                let to = from;
                result_to(self.id, k, h.member, to, flags::REPLY, out, stats);
            }
            None => {
                let oldest = slot.kept.back().map_or(0, |k| k.seq);
                self.nak(NakCode::Gone, (from, h.member), oldest, h.seq, out, stats);
            }
        }
    }

    /// A member asks again for the result of `seq`.
    pub fn help(&mut self, h: &Header, from: SocketAddr, out: &mut Outbox, stats: &Stats) {
        let slot = &self.slots[(h.seq % self.params.window as u32) as usize];
        if slot.open.as_ref().is_some_and(|o| o.seq == h.seq) {
            return; // not finished: the result is broadcast when it is
        }
        match slot.kept(h.seq) {
            Some(k) => {
                Stats::add(&stats.results_resent, 1);
                result_to(self.id, k, h.member, from, flags::REPLY, out, stats);
            }
            None => {
                let oldest = slot.kept.back().map_or(0, |k| k.seq);
                self.nak(NakCode::Gone, (from, h.member), oldest, h.seq, out, stats);
            }
        }
    }

    /// Broadcasts segment `seq` now with what it has (Ack value 1), or does nothing when it
    /// is not open (value 0).
    pub fn fbcast(&mut self, h: &Header, from: SocketAddr, now: Instant, out: &mut Outbox, stats: &Stats) {
        let i = (h.seq % self.params.window as u32) as usize;
        let open = self.slots[i].open.as_mut().filter(|o| o.seq == h.seq && o.forwarded.is_none());
        let forced = match open {
            Some(o) => {
                o.h = o.contributors;
                true
            }
            None => false,
        };
        if forced {
            self.finished(i, now, out, stats);
        }
        self.ack(Kind::FBcast, from, h.member, forced as u32, out);
    }

    pub fn set_h(&mut self, h: &Header, from: SocketAddr, out: &mut Outbox, stats: &Stats) {
        if h.value > self.params.size as u32 {
            self.nak(NakCode::Mismatch, (from, h.member), self.params.size as u32, 0, out, stats);
            return;
        }
        self.h_override = h.value as u16;
        self.ack(Kind::SetH, from, h.member, self.threshold() as u32, out);
    }

    pub fn reset(&mut self, h: &Header, from: SocketAddr, out: &mut Outbox) {
        self.slots.iter_mut().for_each(Slot::clear);
        self.round_done = 0;
        self.ack(Kind::Reset, from, h.member, 0, out);
    }

    /// Removes a member; open segments stop waiting for it (those it was the last one missing
    /// from are broadcast, flagged PARTIAL).
    pub fn leave(&mut self, member: u16, now: Instant, out: &mut Outbox, stats: &Stats) {
        if self.members.get_mut(member as usize).and_then(Option::take).is_none() {
            return;
        }
        self.gone += 1;
        let threshold = self.threshold();
        for i in 0..self.slots.len() {
            let finish = match self.slots[i].open.as_mut() {
                Some(o) if o.forwarded.is_none() => {
                    o.h = o.h.min(threshold);
                    o.contributors >= o.h
                }
                _ => false,
            };
            if finish {
                self.finished(i, now, out, stats);
            }
        }
    }

    /// Drops members that an open segment has waited `timeout` for and that have not been
    /// heard from for as long. Returns the ids dropped.
    pub fn expire(&mut self, now: Instant, timeout: Duration, out: &mut Outbox, stats: &Stats) -> Vec<u16> {
        let mut waited_on = Members::with_size(self.params.size as usize);
        let mut any = false;
        for slot in &self.slots {
            if let Some(o) = slot.open.as_ref().filter(|o| o.forwarded.is_none() && now.duration_since(o.started) >= timeout) {
                for (id, m) in self.members.iter().enumerate() {
                    if m.is_some() && !o.seen.contains(id as u16) {
                        waited_on.insert(id as u16);
                        any = true;
                    }
                }
            }
        }
        if !any {
            return Vec::new();
        }
        let dead: Vec<u16> = self
            .members
            .iter()
            .enumerate()
            .filter(|(id, m)| {
                waited_on.contains(*id as u16) && m.as_ref().is_some_and(|m| now.duration_since(m.last_heard) >= timeout)
            })
            .map(|(id, _)| id as u16)
            .collect();
        for &id in &dead {
            Stats::add(&stats.members_timed_out, 1);
            self.leave(id, now, out, stats);
        }
        dead
    }

    /// Slot `i` reached its threshold: forward it to the parent, or keep and broadcast it.
    fn finished(&mut self, i: usize, now: Instant, out: &mut Outbox, stats: &Stats) {
        if let Some(up) = self.upstream.as_ref() {
            let (addr, member) = (up.addr, up.member);
            if let Some(open) = self.slots[i].open.as_mut() {
                open.forwarded = Some((now, UPSTREAM_RTO));
                forward(self.id, member, open, addr, 0, out);
                Stats::add(&stats.upstream_sent, 1);
            }
            return;
        }
        self.broadcast(i, stats, out);
    }

    fn broadcast(&mut self, i: usize, stats: &Stats, out: &mut Outbox) {
        let keep = self.keep();
        let Some(k) = self.slots[i].finish(keep) else { return };
        Stats::add(&stats.segments_completed, 1);
        if k.flags & flags::PARTIAL != 0 {
            Stats::add(&stats.partial_results, 1);
        }
        self.round_done = self.round_done.max(k.round.saturating_add(1));
        for (id, m) in self.members.iter().enumerate() {
            if let Some(m) = m {
                result_to(self.id, k, id as u16, m.addr, 0, out, stats);
            }
        }
    }

    /// The parent's result for a segment this daemon forwarded: broadcast it to the rack.
    pub fn upstream_result(&mut self, h: &Header, values: &[u8], stats: &Stats, out: &mut Outbox) {
        let i = (h.seq % self.params.window as u32) as usize;
        let Some(open) = self.slots[i].open.as_mut().filter(|o| o.seq == h.seq && o.forwarded.is_some()) else {
            return; // a duplicate, or a result for a segment this rack never forwarded
        };
        if open.elements != h.elements {
            Stats::add(&stats.malformed, 1);
            return;
        }
        open.acc.clear();
        open.acc.extend(values.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        open.count = h.count;
        open.last |= h.flags & flags::LAST != 0;
        if h.flags & flags::PARTIAL != 0 {
            open.h_at_start = open.contributors.saturating_add(1); // marks the result partial
        }
        self.broadcast(i, stats, out);
    }

    /// Hierarchical mode: forwards again the partial sums whose result has not come back.
    pub fn upstream_retransmit(&mut self, now: Instant, out: &mut Outbox, stats: &Stats) {
        let Some(up) = self.upstream.as_ref() else { return };
        let (addr, member) = (up.addr, up.member);
        for slot in &mut self.slots {
            if let Some(open) = slot.open.as_mut() {
                if let Some((at, rto)) = open.forwarded {
                    if now.duration_since(at) >= rto {
                        open.forwarded = Some((now, (rto * 2).min(Duration::from_secs(1))));
                        forward(self.id, member, open, addr, flags::RETRANSMIT, out);
                        Stats::add(&stats.upstream_retransmits, 1);
                    }
                }
            }
        }
    }
}

fn forward(job: u32, member: u16, open: &crate::slot::Open, to: SocketAddr, extra: u8, out: &mut Outbox) {
    let mut h = Header::new(Kind::Data, job, member);
    h.flags = flags::FROM_SWITCH | extra | if open.last { flags::LAST } else { 0 };
    h.count = open.count;
    h.seq = open.seq;
    h.round = open.round;
    h.version = open.round;
    h.elements = open.elements;
    out.push(to, &h, &open.acc);
}

/// Kept result `k` to `member`; `extra`: REPLY when it answers the member's own Data or Help.
fn result_to(job: u32, k: &crate::slot::Kept, member: u16, to: SocketAddr, extra: u8, out: &mut Outbox, stats: &Stats) {
    let mut h = Header::new(Kind::Result, job, member);
    h.flags = k.flags | extra | if k.seen.contains(member) { 0 } else { flags::LATE };
    h.count = k.count;
    h.seq = k.seq;
    h.round = k.round;
    h.elements = k.values.len() as u16;
    out.push(to, &h, &k.values);
    Stats::add(&stats.results_sent, 1);
}

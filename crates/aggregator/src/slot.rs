//! One aggregation slot: the segment being summed and the results kept for members that ask
//! again.
//!
//! A job has `window` slots; segment `seq` uses slot `seq % window`. A member sends segment
//! `seq` only after it holds the result of `seq - window` (self-clocking, as in SwitchML), so
//! a slot holds at most one open aggregation. Finished results are kept, newest first, up to
//! `keep` of them (`staleness + 1`): a member whose result was lost, or that arrives late in
//! async mode, is answered from the kept copy. A member's contribution is added at most once:
//! the `seen` bit of its id is set when it is added, and a repeated packet is never added again.

use std::collections::VecDeque;
use std::time::Instant;

use crate::packet::{Dtype, flags};

/// A set of member ids.
#[derive(Clone, Default, Debug)]
pub struct Members(Vec<u64>);

impl Members {
    pub fn with_size(size: usize) -> Members {
        Members(vec![0; size.div_ceil(64)])
    }

    pub fn contains(&self, id: u16) -> bool {
        self.0.get(id as usize / 64).is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    pub fn insert(&mut self, id: u16) {
        if let Some(w) = self.0.get_mut(id as usize / 64) {
            *w |= 1 << (id % 64);
        }
    }

    pub fn clear(&mut self) {
        self.0.iter_mut().for_each(|w| *w = 0);
    }
}

/// The aggregation in progress.
pub struct Open {
    pub seq: u32,
    pub round: u32,
    pub elements: u16,
    pub acc: Vec<u32>,
    /// Contributions summed (a child daemon's packet carries its rack's count).
    pub count: u16,
    /// Members (packets) that contributed; the threshold counts these.
    pub contributors: u16,
    pub seen: Members,
    /// Contributors needed to finish (set when the aggregation starts).
    pub h: u16,
    /// The threshold the job had when this aggregation started (a lower `h` later means
    /// members were dropped and the result is partial).
    pub h_at_start: u16,
    pub last: bool,
    pub started: Instant,
    /// Hierarchical mode: when the partial sum went to the parent, and how long to wait
    /// before sending it again.
    pub forwarded: Option<(Instant, std::time::Duration)>,
}

/// A finished result.
pub struct Kept {
    pub seq: u32,
    pub round: u32,
    pub values: Vec<u32>,
    pub count: u16,
    pub seen: Members,
    /// PARTIAL and LAST, as broadcast.
    pub flags: u8,
}

#[derive(Default)]
pub struct Slot {
    pub open: Option<Open>,
    pub kept: VecDeque<Kept>,
    /// The newest seq this slot aggregated, open or finished.
    pub last_seq: Option<u32>,
    /// Buffers of evicted results, reused for the next accumulator.
    spare: Vec<Vec<u32>>,
}

/// Adds a packet's little-endian values into `acc` (`acc.len()` values).
pub fn add_values(dtype: Dtype, acc: &mut [u32], bytes: &[u8]) {
    match dtype {
        // Wrapping int32 addition is the same bits as wrapping u32 addition: exact, and the
        // same whatever order contributions arrive in.
        Dtype::Int32 => {
            for (a, c) in acc.iter_mut().zip(bytes.chunks_exact(4)) {
                *a = a.wrapping_add(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        Dtype::Float32 => {
            for (a, c) in acc.iter_mut().zip(bytes.chunks_exact(4)) {
                let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                *a = (f32::from_bits(*a) + v).to_bits();
            }
        }
    }
}

impl Slot {
    /// Starts aggregating `seq` with its first contribution.
    #[allow(clippy::too_many_arguments)]
    pub fn start(&mut self, seq: u32, round: u32, bytes: &[u8], count: u16, member: u16, size: usize, h: u16, last: bool, now: Instant) {
        let elements = bytes.len() / 4;
        let mut acc = self.spare.pop().unwrap_or_default();
        acc.clear();
        acc.extend(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        let mut seen = Members::with_size(size);
        seen.insert(member);
        self.open = Some(Open {
            seq,
            round,
            elements: elements as u16,
            acc,
            count,
            contributors: 1,
            seen,
            h,
            h_at_start: h,
            last,
            started: now,
            forwarded: None,
        });
        self.last_seq = Some(seq);
    }

    /// Moves the open aggregation into the kept results (dropping the oldest past `keep`) and
    /// returns the new result.
    pub fn finish(&mut self, keep: usize) -> Option<&Kept> {
        let open = self.open.take()?;
        let mut flags = if open.last { flags::LAST } else { 0 };
        if open.contributors < open.h_at_start {
            flags |= flags::PARTIAL;
        }
        self.kept.push_front(Kept { seq: open.seq, round: open.round, values: open.acc, count: open.count, seen: open.seen, flags });
        while self.kept.len() > keep.max(1) {
            if let Some(old) = self.kept.pop_back() {
                self.spare.push(old.values);
            }
        }
        self.kept.front()
    }

    pub fn kept(&self, seq: u32) -> Option<&Kept> {
        self.kept.iter().find(|k| k.seq == seq)
    }

    pub fn clear(&mut self) {
        if let Some(open) = self.open.take() {
            self.spare.push(open.acc);
        }
        for k in self.kept.drain(..) {
            self.spare.push(k.values);
        }
        self.last_seq = None;
    }
}

//! The packet format: a 32-byte header, then values (data and results) or a control payload.
//!
//! Every packet is one UDP datagram. All integers and values are little-endian (the values are
//! sent as x86 and ARM hosts hold them, so neither side swaps bytes). The layout, which
//! `docs/aggregation.md` documents for other implementations:
//!
//! ```text
//! offset size field     meaning
//!  0     1    magic     0x52 ('R')
//!  1     1    version   1
//!  2     1    kind      Kind (Data, Result, Join, Leave, Reset, SetH, FBcast, Help, Ack, Nak)
//!  3     1    flags     Flags (RETRANSMIT, PARTIAL, LATE, FROM_SWITCH, LAST)
//!  4     4    job       the job (a group of members aggregating together)
//!  8     2    member    the sender's member id (a worker's rank); results: the receiver's
//! 10     2    count     Data: contributions summed in the values (1 from a worker, a rack's
//!                       count from a child daemon); Result: contributions in the sum
//! 12     4    seq       the segment's position in the job's stream (slot = seq mod window)
//! 16     4    round     the allreduce call the segment belongs to
//! 20     4    version   Data: the weights version the gradient was computed on (async mode)
//! 24     2    elements  values that follow (Data, Result); 0 for control messages
//! 26     2    code      Ack: the kind acknowledged; Nak: the reason (NakCode)
//! 28     4    value     control value (Join: member type; SetH: H; Ack/Nak: see each kind)
//! 32     ...  payload   Data/Result: elements x 4 bytes (float32 or int32, the job's dtype);
//!                       Join: JoinParams (12 bytes) then the token's bytes
//! ```
//!
//! `parse` checks everything a peer controls (magic, version, kind, lengths, enum values) and
//! never panics: a malformed packet is an `Err` the daemon counts and drops.

use thiserror::Error;

pub const MAGIC: u8 = 0x52;
pub const VERSION: u8 = 1;
pub const HEADER: usize = 32;
pub const JOIN_PARAMS: usize = 12;
/// The most values one packet may carry: 32 KiB of payload, which fits loopback's and jumbo
/// frames' MTU. Over a 1500-byte Ethernet MTU use at most 363 (the default is 256, 1 KiB).
pub const MAX_ELEMENTS: usize = 8192;
pub const MAX_PACKET: usize = HEADER + MAX_ELEMENTS * 4;
/// The longest token a Join may carry.
pub const MAX_TOKEN: usize = 256;
/// The IPv4 ToS byte that marks aggregation traffic (DSCP 0x0F, from the pool for experimental
/// and local use), as iSwitch marks its packets so that a switch aggregates only them and
/// forwards everything else untouched.
pub const TOS: u8 = 0x3C;

/// What a packet is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A worker's (or a child daemon's) contribution to one segment.
    Data = 1,
    /// A finished (or force-broadcast) segment.
    Result = 2,
    /// Become a member of a job (creating it with the packet's parameters if new).
    Join = 3,
    /// Stop being a member; open segments no longer wait for this member.
    Leave = 4,
    /// Clear every slot of the job (its stream starts again at seq 0).
    Reset = 5,
    /// Set the threshold H: a segment is finished after H contributions (0: all members).
    SetH = 6,
    /// Broadcast segment `seq` now with what it has summed (a partial result).
    FBcast = 7,
    /// Send me the result of segment `seq` again (mine was lost).
    Help = 8,
    /// Confirms a control message; `code` names the kind confirmed.
    Ack = 9,
    /// Refuses a packet; `code` says why (NakCode).
    Nak = 10,
}

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Data,
            2 => Kind::Result,
            3 => Kind::Join,
            4 => Kind::Leave,
            5 => Kind::Reset,
            6 => Kind::SetH,
            7 => Kind::FBcast,
            8 => Kind::Help,
            9 => Kind::Ack,
            10 => Kind::Nak,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Data => "Data",
            Kind::Result => "Result",
            Kind::Join => "Join",
            Kind::Leave => "Leave",
            Kind::Reset => "Reset",
            Kind::SetH => "SetH",
            Kind::FBcast => "FBcast",
            Kind::Help => "Help",
            Kind::Ack => "Ack",
            Kind::Nak => "Nak",
        }
    }
}

/// Header flags.
pub mod flags {
    /// Data sent again after a timeout (counted; handled like the first copy).
    pub const RETRANSMIT: u8 = 0x01;
    /// A result with fewer contributions than its threshold (FBcast, or members dropped).
    pub const PARTIAL: u8 = 0x02;
    /// A result that does not include the receiver's contribution (async: it came late).
    pub const LATE: u8 = 0x04;
    /// Data from a child daemon (hierarchical aggregation): `count` contributions in one.
    pub const FROM_SWITCH: u8 = 0x08;
    /// The last segment of its round.
    pub const LAST: u8 = 0x10;
    /// A result sent to one member in answer to its own Data or Help, not a broadcast. A
    /// LATE result decides what became of the receiver's contribution (carried: it came
    /// late; dropped: the daemon refused it as stale) only as a reply: a broadcast can reach
    /// a member before its contribution reaches the daemon, and so before the verdict.
    pub const REPLY: u8 = 0x20;
    pub const ALL: u8 = RETRANSMIT | PARTIAL | LATE | FROM_SWITCH | LAST | REPLY;
}

/// Why a packet was refused (a Nak's `code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum NakCode {
    /// A Join without the daemon's token, or from an address not on the allow-list.
    Unauthorized = 1,
    /// No such job (join it first).
    NoJob = 2,
    /// The sender is not a member of the job, or sent from another address than it joined from.
    NotMember = 3,
    /// Async mode: the gradient's weights version is more than S behind (`value`: the job's round).
    Stale = 4,
    /// The result asked for is no longer kept (the sender fell more than the window behind).
    Gone = 5,
    /// The Join's parameters differ from the job's, or its member id is out of range.
    Mismatch = 6,
    /// A segment that cannot be next in its slot (the sender skipped ahead of the window).
    OutOfOrder = 7,
    /// The daemon holds as many jobs as it may.
    Full = 8,
    /// The job would take more memory than the daemon's budget allows (`value`: the
    /// budget it would exceed, in MiB: per job, or what is left of the daemon's total).
    Budget = 9,
}

impl NakCode {
    pub fn from_u16(v: u16) -> Option<NakCode> {
        Some(match v {
            1 => NakCode::Unauthorized,
            2 => NakCode::NoJob,
            3 => NakCode::NotMember,
            4 => NakCode::Stale,
            5 => NakCode::Gone,
            6 => NakCode::Mismatch,
            7 => NakCode::OutOfOrder,
            8 => NakCode::Full,
            9 => NakCode::Budget,
            _ => return None,
        })
    }

    pub fn describe(self) -> &'static str {
        match self {
            NakCode::Unauthorized => "unauthorized (wrong or missing token, or an address not on the allow-list)",
            NakCode::NoJob => "no such job (join it first)",
            NakCode::NotMember => "not a member of the job (or sending from another address than it joined from)",
            NakCode::Stale => "stale: the gradient's weights version is more than the staleness bound behind",
            NakCode::Gone => "the result is no longer kept (fell more than the window behind)",
            NakCode::Mismatch => "the job's parameters differ from the Join's, or the member id is out of range",
            NakCode::OutOfOrder => "segment out of order (skipped ahead of the window)",
            NakCode::Full => "the daemon holds as many jobs as it may",
            NakCode::Budget => "the job would take more memory than the daemon's budget allows",
        }
    }
}

/// How a job aggregates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A segment is finished when every member contributed (H = members).
    Sync = 0,
    /// A segment is finished after H contributions; gradients more than S versions behind
    /// the job's round are refused.
    Async = 1,
}

/// What the values are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    Float32 = 0,
    /// Fixed point: sums are exact (wrapping int32 addition) and independent of arrival order.
    Int32 = 1,
}

/// Member types (a Join's `value`).
pub const MEMBER_WORKER: u32 = 0;
pub const MEMBER_SWITCH: u32 = 1;

/// A job's parameters, carried by every Join; every member must agree on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JoinParams {
    pub mode: Mode,
    pub dtype: Dtype,
    /// Members the job has (member ids are 0..size).
    pub size: u16,
    /// Values per segment (the last segment of a round may carry fewer).
    pub segment_values: u16,
    /// Slots: segments a member may have outstanding.
    pub window: u16,
    /// Async: the staleness bound S (versions); results kept per slot = S + 1.
    pub staleness: u16,
}

impl JoinParams {
    /// Refuses parameters no job can have, naming the field.
    /// The most memory a job with these parameters can hold: per slot an open
    /// accumulator and `keep` finished results of `segment_values` 4-byte values (keep
    /// is 1 in sync mode, staleness + 1 in async mode), each with a member bit set.
    pub fn max_bytes(&self) -> u64 {
        let keep = match self.mode {
            Mode::Sync => 1,
            Mode::Async => self.staleness as u64 + 1,
        };
        let per_result = self.segment_values as u64 * 4 + (self.size as u64).div_ceil(64) * 8 + 64;
        self.window as u64 * (keep + 1) * per_result + self.size as u64 * 64
    }

    pub fn check(&self) -> Result<(), String> {
        if self.size == 0 || self.size > 4096 {
            return Err(format!("size must be 1..=4096 members, got {}", self.size));
        }
        if self.segment_values == 0 || self.segment_values as usize > MAX_ELEMENTS {
            return Err(format!("segment_values must be 1..={MAX_ELEMENTS}, got {}", self.segment_values));
        }
        if self.window == 0 || self.window > 4096 {
            return Err(format!("window must be 1..=4096 slots, got {}", self.window));
        }
        if self.staleness > 64 {
            return Err(format!("staleness must be 0..=64, got {}", self.staleness));
        }
        Ok(())
    }
}

/// The 32-byte header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub flags: u8,
    pub job: u32,
    pub member: u16,
    pub count: u16,
    pub seq: u32,
    pub round: u32,
    pub version: u32,
    pub elements: u16,
    pub code: u16,
    pub value: u32,
}

impl Header {
    pub fn new(kind: Kind, job: u32, member: u16) -> Header {
        Header { kind, flags: 0, job, member, count: 0, seq: 0, round: 0, version: 0, elements: 0, code: 0, value: 0 }
    }

    /// Writes the header into the first 32 bytes of `out`.
    pub fn write(&self, out: &mut [u8]) {
        out[0] = MAGIC;
        out[1] = VERSION;
        out[2] = self.kind as u8;
        out[3] = self.flags;
        out[4..8].copy_from_slice(&self.job.to_le_bytes());
        out[8..10].copy_from_slice(&self.member.to_le_bytes());
        out[10..12].copy_from_slice(&self.count.to_le_bytes());
        out[12..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..20].copy_from_slice(&self.round.to_le_bytes());
        out[20..24].copy_from_slice(&self.version.to_le_bytes());
        out[24..26].copy_from_slice(&self.elements.to_le_bytes());
        out[26..28].copy_from_slice(&self.code.to_le_bytes());
        out[28..32].copy_from_slice(&self.value.to_le_bytes());
    }
}

/// Why a datagram is not a packet.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Malformed {
    #[error("{0} bytes: shorter than the 32-byte header")]
    Short(usize),
    #[error("magic 0x{0:02x}, expected 0x52")]
    Magic(u8),
    #[error("version {0}, expected 1")]
    Version(u8),
    #[error("unknown kind {0}")]
    Kind(u8),
    #[error("unknown flags 0x{0:02x}")]
    Flags(u8),
    #[error("{kind} with {elements} elements in a {len}-byte packet (expected {expected} bytes)")]
    Length { kind: &'static str, elements: u16, len: usize, expected: usize },
    #[error("{0} carries no values but elements = {1}")]
    Elements(&'static str, u16),
    #[error("a Join's parameters are invalid: {0}")]
    Join(String),
}

/// A parsed packet: the header and the bytes after it (values, or the Join payload).
#[derive(Debug)]
pub struct Packet<'a> {
    pub header: Header,
    pub payload: &'a [u8],
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Parses one datagram. Never panics; every field a peer controls is checked.
pub fn parse(bytes: &[u8]) -> Result<Packet<'_>, Malformed> {
    if bytes.len() < HEADER {
        return Err(Malformed::Short(bytes.len()));
    }
    if bytes[0] != MAGIC {
        return Err(Malformed::Magic(bytes[0]));
    }
    if bytes[1] != VERSION {
        return Err(Malformed::Version(bytes[1]));
    }
    let kind = Kind::from_u8(bytes[2]).ok_or(Malformed::Kind(bytes[2]))?;
    let flags = bytes[3];
    if flags & !flags::ALL != 0 {
        return Err(Malformed::Flags(flags));
    }
    let header = Header {
        kind,
        flags,
        job: u32_at(bytes, 4),
        member: u16_at(bytes, 8),
        count: u16_at(bytes, 10),
        seq: u32_at(bytes, 12),
        round: u32_at(bytes, 16),
        version: u32_at(bytes, 20),
        elements: u16_at(bytes, 24),
        code: u16_at(bytes, 26),
        value: u32_at(bytes, 28),
    };
    let payload = &bytes[HEADER..];
    match kind {
        Kind::Data | Kind::Result => {
            let expected = HEADER + header.elements as usize * 4;
            if header.elements == 0 || header.elements as usize > MAX_ELEMENTS || bytes.len() != expected {
                return Err(Malformed::Length { kind: kind.name(), elements: header.elements, len: bytes.len(), expected });
            }
        }
        Kind::Join => {
            if header.elements != 0 {
                return Err(Malformed::Elements(kind.name(), header.elements));
            }
            join_params(payload).map_err(Malformed::Join)?;
        }
        _ => {
            if header.elements != 0 {
                return Err(Malformed::Elements(kind.name(), header.elements));
            }
            if !payload.is_empty() {
                return Err(Malformed::Length { kind: kind.name(), elements: 0, len: bytes.len(), expected: HEADER });
            }
        }
    }
    Ok(Packet { header, payload })
}

/// A Join's parameters and token, checked.
pub fn join_params(payload: &[u8]) -> Result<(JoinParams, &[u8]), String> {
    if payload.len() < JOIN_PARAMS {
        return Err(format!("{} bytes of parameters, expected at least {JOIN_PARAMS}", payload.len()));
    }
    let mode = match payload[0] {
        0 => Mode::Sync,
        1 => Mode::Async,
        m => return Err(format!("mode {m}, expected 0 (sync) or 1 (async)")),
    };
    let dtype = match payload[1] {
        0 => Dtype::Float32,
        1 => Dtype::Int32,
        d => return Err(format!("dtype {d}, expected 0 (float32) or 1 (int32)")),
    };
    let params = JoinParams {
        mode,
        dtype,
        size: u16_at(payload, 2),
        segment_values: u16_at(payload, 4),
        window: u16_at(payload, 6),
        staleness: u16_at(payload, 8),
    };
    params.check()?;
    let token_len = u16_at(payload, 10) as usize;
    if token_len > MAX_TOKEN || payload.len() != JOIN_PARAMS + token_len {
        return Err(format!(
            "token of {token_len} bytes in {} bytes after the parameters (at most {MAX_TOKEN})",
            payload.len() - JOIN_PARAMS
        ));
    }
    Ok((params, &payload[JOIN_PARAMS..]))
}

/// Encodes a Join's payload.
pub fn write_join(params: &JoinParams, token: &[u8], out: &mut Vec<u8>) {
    out.push(params.mode as u8);
    out.push(params.dtype as u8);
    out.extend_from_slice(&params.size.to_le_bytes());
    out.extend_from_slice(&params.segment_values.to_le_bytes());
    out.extend_from_slice(&params.window.to_le_bytes());
    out.extend_from_slice(&params.staleness.to_le_bytes());
    out.extend_from_slice(&(token.len() as u16).to_le_bytes());
    out.extend_from_slice(token);
}

/// Encodes a whole packet: header then payload.
pub fn encode(header: &Header, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; HEADER];
    header.write(&mut out);
    out.extend_from_slice(payload);
    out
}

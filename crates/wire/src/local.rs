//! The local protocol between a store's owner (the server) and local clients (same
//! host). Only small records cross the socket — block leases and releases, item
//! commits, sample selections, priority updates — never step data, which clients
//! write and read in place in the store's shared memory.
//!
//! A frame is `u32 length (little endian) | u8 kind | payload`, length counting
//! the kind byte, at most [`MAX_FRAME`]. Requests are answered in order; the
//! kinds marked "no reply" are fire-and-forget. Every field read from a peer is
//! bounds-checked: a malformed frame is an `Error::Corrupt`, never a panic.

use std::io::{Read, Write};

use reprise_core::error::{Error, Result};
use reprise_core::RowRange;

/// Version 2: `CREATED` carries the committed items' keys. Version 4: item
/// attribute records in `CREATE` and `SAMPLED`, token budgets in `SAMPLE`, the
/// attribute schema, version and group figures in `INFO_OK`, `SET_VERSION` and
/// `UPDATE_ATTRIBUTE`. Version 5: `LEASE` asks for spare blocks too, `LEASED` lists
/// the blocks handed out. Version 6: `HELLO_OK` gives each field's zstd level (0:
/// stored raw), which the client's layout of the shared columns depends on.
/// Version 7: `HELLO_OK` gives each field's stack and padding (0 reset, 1 zero),
/// which the client's writers and reads depend on, and per store whether it is a
/// file store (its reads may wait for the disk); `INFO_OK` ends with the store's
/// raw and stored bytes. Version 8: `HELLO_OK`'s per-store word is flags ([`FILE_STORE`],
/// [`DURABLE`]), and `COMMIT` asks a durable store for a commit.
pub const VERSION: u32 = 8;
/// `HELLO_OK` store flag: a file store (its reads may wait for the disk).
pub const FILE_STORE: u32 = 1;
/// `HELLO_OK` store flag: a durable file store (a writer's flush ends with a `COMMIT`).
pub const DURABLE: u32 = 2;
/// Most spare blocks one `LEASE` may ask for.
pub const MAX_SPARES: u32 = 64;
/// Largest attribute record of one item.
pub const MAX_RECORD: u32 = 1 << 16;
/// Largest frame either side accepts.
pub const MAX_FRAME: usize = 64 << 20;
/// Largest item count in one create or sample request.
pub const MAX_ITEMS: u32 = 1 << 20;
/// Largest number of row ranges in one item window.
pub const MAX_RANGES: u32 = 1 << 16;

// Requests.
pub const HELLO: u8 = 1;
/// `u32 store | u32 spares`: one block (waiting, or evicting, as a lease does) and up
/// to `spares` more that are free right now; `LEASED`.
pub const LEASE: u8 = 2;
/// No reply.
pub const RELEASE: u8 = 3;
pub const CREATE: u8 = 4;
pub const SAMPLE: u8 = 5;
/// No reply.
pub const SAMPLE_DONE: u8 = 6;
pub const UPDATE: u8 = 7;
pub const DELETE: u8 = 8;
pub const INFO: u8 = 9;
pub const RESET: u8 = 10;
/// Write a checkpoint of the served tables (the server's checkpoint directory).
pub const CHECKPOINT: u8 = 11;
/// What the server is doing (tables, statistics, clients): its monitor's snapshot.
pub const SNAPSHOT: u8 = 12;
/// `u32 table | i64 version`: sets a table's policy version; `COUNT` of items removed as stale.
pub const SET_VERSION: u8 = 13;
/// `u32 table | str name | u32 n | n x u64 key | bytes values`: `COUNT` of items updated.
pub const UPDATE_ATTRIBUTE: u8 = 14;
/// `u32 store`: `OK` once every item in the store's tables when the server read
/// this is on disk (a durable store's group commit; at once for any other store).
pub const COMMIT: u8 = 15;

// Replies.
pub const HELLO_OK: u8 = 129;
/// `u32 n | n x u32 block`: the leased block first, then the spares.
pub const LEASED: u8 = 130;
/// `u32 n | n x u64 key` of the items committed, in order.
pub const CREATED: u8 = 131;
pub const SAMPLED: u8 = 132;
pub const COUNT: u8 = 133;
pub const INFO_OK: u8 = 134;
pub const OK: u8 = 135;
pub const ERROR: u8 = 136;
/// The path of a checkpoint just written (a string).
pub const CHECKPOINTED: u8 = 137;
/// The snapshot as JSON text (a string; see `docs/observability.md`).
pub const SNAPSHOT_OK: u8 = 138;

/// Encodes one frame.
pub struct Frame(Vec<u8>);

impl Frame {
    pub fn new(kind: u8) -> Frame {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&[0, 0, 0, 0, kind]);
        Frame(v)
    }
    pub fn u8(&mut self, x: u8) -> &mut Self {
        self.0.push(x);
        self
    }
    pub fn u32(&mut self, x: u32) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    pub fn u64(&mut self, x: u64) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    pub fn i64(&mut self, x: i64) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    pub fn f64(&mut self, x: f64) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// `u32 length | bytes`.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    pub fn ranges(&mut self, ranges: &[RowRange]) -> &mut Self {
        self.u32(ranges.len() as u32);
        for r in ranges {
            self.u64(r.start).u32(r.len);
        }
        self
    }
    /// Overwrites a u32 written earlier at payload offset `at` (a count known only
    /// when the frame is complete).
    pub fn patch_u32(&mut self, at: usize, x: u32) {
        self.0[5 + at..5 + at + 4].copy_from_slice(&x.to_le_bytes());
    }
    /// Bytes of payload written so far.
    pub fn payload_len(&self) -> usize {
        self.0.len() - 5
    }
    /// The frame, length filled in.
    pub fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        self.0
    }
    pub fn send(self, w: &mut impl Write) -> Result<()> {
        w.write_all(&self.finish()).map_err(io)
    }
}

pub fn io(e: std::io::Error) -> Error {
    Error::Io(format!("connection to the replay server lost: {e}"))
}

/// Reads one frame: its kind and payload.
pub fn read_frame(r: &mut impl Read) -> Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 4];
    r.read_exact(&mut head).map_err(io)?;
    let len = u32::from_le_bytes(head) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(Error::Corrupt(format!("frame of {len} bytes; expected 1 to {MAX_FRAME}")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(io)?;
    let kind = body[0];
    body.remove(0);
    Ok((kind, body))
}

/// Decodes a payload, failing with `Corrupt` on anything short or out of range.
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, at: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| Error::Corrupt(format!("truncated message: needed {n} more bytes at {}", self.at)))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// `u32 length | bytes`, at most `max` bytes.
    pub fn bytes(&mut self, max: usize, what: &str) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(Error::Corrupt(format!("{what} of {n} bytes; at most {max}")));
        }
        self.take(n)
    }
    pub fn str(&mut self) -> Result<String> {
        let n = self.u32()? as usize;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| Error::Corrupt("string is not UTF-8".into()))
    }
    /// A count, checked against `max`.
    pub fn count(&mut self, max: u32, what: &str) -> Result<u32> {
        let n = self.u32()?;
        if n > max {
            return Err(Error::Corrupt(format!("{n} {what} in one message; at most {max}")));
        }
        Ok(n)
    }
    pub fn ranges(&mut self) -> Result<Vec<RowRange>> {
        let n = self.count(MAX_RANGES, "row ranges")?;
        (0..n).map(|_| Ok(RowRange { start: self.u64()?, len: self.u32()? })).collect()
    }
    pub fn done(&self) -> Result<()> {
        if self.at != self.buf.len() {
            return Err(Error::Corrupt(format!("{} unexpected bytes at the end of a message", self.buf.len() - self.at)));
        }
        Ok(())
    }
}

/// Timeouts on the wire: milliseconds, -1 for none.
pub fn timeout_to_wire(t: Option<std::time::Duration>) -> i64 {
    t.map_or(-1, |d| d.as_millis().min(i64::MAX as u128) as i64)
}

pub fn timeout_from_wire(ms: i64) -> Option<std::time::Duration> {
    (ms >= 0).then(|| std::time::Duration::from_millis(ms as u64))
}


/// Table counters on the wire, in a fixed order shared by both sides.
pub fn put_info(f: &mut Frame, i: &reprise_core::TableInfo) {
    f.str(&i.name).str(&i.sampler).str(&i.remover);
    for x in [i.size, i.max_size, i.max_times_sampled as u64, i.num_inserts, i.num_samples, i.num_evictions, i.num_deletes, i.num_store_evictions, i.rate_limiter.min_size_to_sample, i.limiter_inserts, i.limiter_samples] {
        f.u64(x);
    }
    for x in [i.rate_limiter.samples_per_insert, i.rate_limiter.min_diff, i.rate_limiter.max_diff, i.blocked_insert_seconds, i.blocked_sample_seconds] {
        f.f64(x);
    }
    f.u64(i.version.is_some() as u64).u64(i.version.unwrap_or(0) as u64).u64(i.stale_removed).u64(i.stale_dropped);
    f.str(&i.groups.as_ref().map(|g| g.to_string()).unwrap_or_default());
    f.u32(i.attributes.len() as u32);
    for (name, dtype) in &i.attributes {
        f.str(name).str(dtype);
    }
    f.u64(i.store_raw_bytes).u64(i.store_stored_bytes);
}

pub fn get_info(r: &mut Reader<'_>) -> Result<reprise_core::TableInfo> {
    let (name, sampler, remover) = (r.str()?, r.str()?, r.str()?);
    let mut u = [0u64; 11];
    for x in u.iter_mut() {
        *x = r.u64()?;
    }
    let mut f = [0f64; 5];
    for x in f.iter_mut() {
        *x = r.f64()?;
    }
    Ok(reprise_core::TableInfo {
        name,
        sampler,
        remover,
        size: u[0],
        max_size: u[1],
        max_times_sampled: u[2] as u32,
        num_inserts: u[3],
        num_samples: u[4],
        num_evictions: u[5],
        num_deletes: u[6],
        num_store_evictions: u[7],
        rate_limiter: reprise_core::RateLimiterConfig { samples_per_insert: f[0], min_size_to_sample: u[8], min_diff: f[1], max_diff: f[2] },
        limiter_inserts: u[9],
        limiter_samples: u[10],
        blocked_insert_seconds: f[3],
        blocked_sample_seconds: f[4],
        version: (r.u64()? != 0).then_some(r.u64()? as i64),
        stale_removed: r.u64()?,
        stale_dropped: r.u64()?,
        groups: serde_json::from_str(&r.str()?).ok(),
        attributes: {
            let n = r.count(1 << 10, "attributes")?;
            (0..n).map(|_| Ok((r.str()?, r.str()?))).collect::<Result<Vec<_>>>()?
        },
        store_raw_bytes: r.u64()?,
        store_stored_bytes: r.u64()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut f = Frame::new(CREATE);
        f.u32(7).f64(1.5).str("replay").ranges(&[RowRange { start: 3, len: 2 }]);
        let bytes = f.finish();
        let (kind, body) = read_frame(&mut &bytes[..]).unwrap();
        assert_eq!(kind, CREATE);
        let mut r = Reader::new(&body);
        assert_eq!((r.u32().unwrap(), r.f64().unwrap(), r.str().unwrap()), (7, 1.5, "replay".into()));
        assert_eq!(r.ranges().unwrap(), vec![RowRange { start: 3, len: 2 }]);
        r.done().unwrap();
    }

    #[test]
    fn truncated_and_oversized_frames_are_corrupt() {
        let mut f = Frame::new(HELLO);
        f.u64(1);
        let bytes = f.finish();
        let (_, body) = read_frame(&mut &bytes[..]).unwrap();
        assert!(Reader::new(&body[..3]).u64().unwrap_err().to_string().contains("truncated"));
        let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
        assert!(matches!(read_frame(&mut &huge[..]), Err(Error::Corrupt(_))));
        let mut r = Reader::new(&[255, 255, 255, 255]);
        assert!(r.count(10, "items").unwrap_err().to_string().contains("at most 10"));
    }
}

//! Packets waiting to be sent: one contiguous buffer and (address, range) pairs, so a batch
//! goes out in one `sendmmsg` without an allocation per packet.

use std::net::SocketAddr;
use std::ops::Range;

use crate::packet::{Header, HEADER};

#[derive(Default)]
pub struct Outbox {
    buf: Vec<u8>,
    msgs: Vec<(SocketAddr, Range<usize>)>,
}

impl Outbox {
    /// Queues `header` then `values` (each as 4 little-endian bytes) for `to`.
    pub fn push(&mut self, to: SocketAddr, header: &Header, values: &[u32]) {
        let start = self.buf.len();
        self.buf.resize(start + HEADER, 0);
        header.write(&mut self.buf[start..]);
        let body = start + HEADER;
        self.buf.resize(body + values.len() * 4, 0);
        for (dst, v) in self.buf[body..].chunks_exact_mut(4).zip(values) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
        self.msgs.push((to, start..self.buf.len()));
    }

    /// Queues `header` then raw payload bytes for `to`.
    pub fn push_bytes(&mut self, to: SocketAddr, header: &Header, payload: &[u8]) {
        let start = self.buf.len();
        self.buf.resize(start + HEADER, 0);
        header.write(&mut self.buf[start..]);
        self.buf.extend_from_slice(payload);
        self.msgs.push((to, start..self.buf.len()));
    }

    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// The queued packets in order.
    pub fn iter(&self) -> impl Iterator<Item = (SocketAddr, &[u8])> + '_ {
        self.msgs.iter().map(|(a, r)| (*a, &self.buf[r.clone()]))
    }

    pub fn clear(&mut self) {
        self.buf.clear();
        self.msgs.clear();
    }
}

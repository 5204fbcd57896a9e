//! UDP in batches: `recvmmsg` and `sendmmsg`, so one system call moves up to `BATCH`
//! messages each way, and with segmentation offload each message carries many datagrams:
//! a run of same-sized packets to one address goes as one message with `UDP_SEGMENT`
//! (the kernel, or the NIC, cuts it into the same MTU-sized datagrams on the wire), and
//! a socket with `UDP_GRO` receives runs the kernel coalesced as one buffer, cut here at
//! the segment size it reports. The wire format is unchanged; where the kernel lacks
//! either option the path falls back to one datagram a message. The only module with
//! `unsafe`: it hands the kernel pointers into buffers this module owns for the duration
//! of each call.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::outbox::Outbox;
use crate::packet::{MAX_PACKET, TOS};

/// Messages per system call.
pub const BATCH: usize = 64;

/// `UDP_SEGMENT` and `UDP_GRO` (linux/udp.h; the libc crate lists them for uclibc only).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// Most segments in one offloaded send (the kernel's UDP_MAX_SEGMENTS), and most bytes
/// (a UDP datagram's payload limit, which the whole run must fit).
const MAX_SEGMENTS: usize = 64;
const MAX_RUN_BYTES: usize = 65_000;
/// A receive buffer with `UDP_GRO`: the largest coalesced run.
const GRO_BUFFER: usize = 65_536;

/// Asks the kernel to coalesce received runs (`UDP_GRO`); false where it cannot.
pub fn enable_gro(socket: &Socket) -> bool {
    let one: libc::c_int = 1;
    // SAFETY: a valid fd and a pointer to one c_int that lives across the call.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_UDP,
            UDP_GRO,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    r == 0
}

/// A UDP socket bound to `addr`, marked with the aggregation ToS, with large buffers.
/// `transparent` (on-path mode) lets it take packets addressed to other hosts that an
/// nftables TPROXY rule diverts to it (needs CAP_NET_ADMIN).
pub fn bind(addr: SocketAddr, transparent: bool, tos: Option<u8>) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv4() {
        socket.set_tos_v4(tos.unwrap_or(TOS) as u32)?;
    }
    // Best effort: the kernel caps these at net.core.{r,w}mem_max.
    let _ = socket.set_recv_buffer_size(8 << 20);
    let _ = socket.set_send_buffer_size(8 << 20);
    if transparent {
        socket.set_ip_transparent_v4(true)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Waits up to `timeout` for the socket to be readable (None: do not wait). Returns whether
/// it is. An interrupted wait counts as not readable.
pub fn wait_readable(socket: &Socket, timeout: Option<Duration>) -> io::Result<bool> {
    // Rounded up: rounding down would make a wait of under a millisecond a busy loop.
    let ms = timeout.map_or(0, |t| t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32);
    let mut fd = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: `fd` is one valid pollfd that lives across the call.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(n > 0)
}

/// Buffers for one `recvmmsg`, and the datagrams the last one brought (a coalesced
/// message is several, cut at its segment size).
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    names: Vec<libc::sockaddr_storage>,
    controls: Vec<[u64; 8]>,
    /// Datagrams of the last `recv`: (message, start, length).
    segments: Vec<(usize, usize, usize)>,
    name_lens: Vec<libc::socklen_t>,
    gro: bool,
}

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch::new(BATCH)
    }
}

impl RecvBatch {
    pub fn new(n: usize) -> RecvBatch {
        RecvBatch::with_gro(n, false)
    }

    /// Buffers for a socket with `UDP_GRO` on (`gro`): each large enough for a coalesced run.
    pub fn with_gro(n: usize, gro: bool) -> RecvBatch {
        let size = if gro { GRO_BUFFER } else { MAX_PACKET + 1 };
        RecvBatch {
            bufs: (0..n).map(|_| vec![0u8; size]).collect(),
            // SAFETY: sockaddr_storage is plain old data; all zeros is a valid (empty) value.
            names: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            controls: vec![[0u64; 8]; n],
            segments: Vec::with_capacity(n),
            name_lens: vec![0; n],
            gro,
        }
    }

    /// Receives what is waiting, without blocking: up to the batch's size in messages.
    /// Returns how many datagrams they held.
    pub fn recv(&mut self, socket: &Socket) -> io::Result<usize> {
        let n = self.bufs.len();
        self.segments.clear();
        let mut iovs: Vec<libc::iovec> = self
            .bufs
            .iter_mut()
            .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() })
            .collect();
        // SAFETY: mmsghdr is plain old data; it is filled in below before use.
        let mut msgs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (i, m) in msgs.iter_mut().enumerate() {
            m.msg_hdr.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_hdr.msg_iov = &mut iovs[i];
            m.msg_hdr.msg_iovlen = 1;
            if self.gro {
                m.msg_hdr.msg_control = self.controls[i].as_mut_ptr().cast();
                m.msg_hdr.msg_controllen = std::mem::size_of::<[u64; 8]>() as _;
            }
        }
        // SAFETY: every pointer in `msgs` points into `self.bufs`, `self.names`,
        // `self.controls` or `iovs`, which outlive the call and are not otherwise borrowed
        // during it.
        let r = unsafe {
            libc::recvmmsg(socket.as_raw_fd(), msgs.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT, std::ptr::null_mut())
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                // An ICMP error from an earlier send (a member went away) surfaces here.
                io::ErrorKind::ConnectionRefused => Ok(0),
                _ => Err(e),
            };
        }
        for (i, m) in msgs.iter().take(r as usize).enumerate() {
            self.name_lens[i] = m.msg_hdr.msg_namelen;
            let len = (m.msg_len as usize).min(self.bufs[i].len());
            // SAFETY: the kernel wrote `msg_controllen` bytes of control messages into
            // `self.controls[i]`, which `msg_control` points to.
            let segment = unsafe { gro_segment(&m.msg_hdr) };
            match segment {
                Some(seg) if seg > 0 && len > seg => {
                    let mut at = 0;
                    while at < len {
                        let take = seg.min(len - at);
                        self.segments.push((i, at, take));
                        at += take;
                    }
                }
                _ => self.segments.push((i, 0, len)),
            }
        }
        Ok(self.segments.len())
    }

    /// The `i`th datagram of the last `recv`: its bytes and sender. A datagram longer than
    /// any packet is returned whole-but-one-byte-longer than `MAX_PACKET`, so parsing refuses it.
    pub fn get(&self, i: usize) -> Option<(&[u8], SocketAddr)> {
        let &(m, start, len) = self.segments.get(i)?;
        let bytes = &self.bufs[m][start..start + len.min(MAX_PACKET + 1)];
        Some((bytes, to_socket_addr(&self.names[m], self.name_lens[m])?))
    }
}

/// The segment size of a coalesced message (its `UDP_GRO` control message), if any.
///
/// # Safety
/// `hdr.msg_control` must point to `hdr.msg_controllen` readable bytes (or be null).
unsafe fn gro_segment(hdr: &libc::msghdr) -> Option<usize> {
    if hdr.msg_control.is_null() || hdr.msg_controllen == 0 {
        return None;
    }
    // SAFETY: the caller's contract; CMSG_* walk within msg_controllen.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(hdr) };
    // SAFETY: CMSG_LEN only computes a length.
    let int_len = unsafe { libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    while !c.is_null() {
        // SAFETY: `c` is a header CMSG_FIRSTHDR/CMSG_NXTHDR found inside the buffer.
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_UDP && h.cmsg_type == UDP_GRO && h.cmsg_len as usize >= int_len {
            // SAFETY: the data holds one c_int (length checked above); it may be unaligned.
            let v = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>()) };
            return usize::try_from(v).ok();
        }
        // SAFETY: as above.
        c = unsafe { libc::CMSG_NXTHDR(hdr, c) };
    }
    None
}

/// The address the kernel wrote into `name` (IPv4 or IPv6; anything else is None).
fn to_socket_addr(name: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    match name.ss_family as libc::c_int {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and it is large enough.
            let a = unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6, and it is large enough.
            let a = unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(ip, u16::from_be(a.sin6_port), a.sin6_flowinfo, a.sin6_scope_id)))
        }
        _ => None,
    }
}

/// Whether a socket's sends use segmentation offload: on until the kernel refuses it once.
pub struct Segmentation(std::sync::atomic::AtomicBool);

impl Default for Segmentation {
    fn default() -> Self {
        Segmentation(std::sync::atomic::AtomicBool::new(true))
    }
}

impl Segmentation {
    pub fn off() -> Segmentation {
        Segmentation(std::sync::atomic::AtomicBool::new(false))
    }

    pub fn on(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn refused(&self) {
        self.0.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One message: a run of packets to one address, all of the first one's size but the
/// last (which may be shorter), gathered from wherever they lie in the outbox.
struct Run<'a> {
    to: SockAddr,
    packets: Vec<&'a [u8]>,
}

impl Run<'_> {
    fn bytes(&self) -> usize {
        self.packets.iter().map(|p| p.len()).sum()
    }
}

/// The outbox's packets as runs, each address's packets in their queued order (one
/// packet a run without `gso`).
fn runs<'a>(out: &'a Outbox, gso: bool) -> Vec<Run<'a>> {
    let mut by_address: Vec<(SocketAddr, Vec<&'a [u8]>)> = Vec::new();
    for (a, b) in out.iter() {
        match by_address.iter_mut().find(|(x, _)| *x == a) {
            Some((_, v)) => v.push(b),
            None => by_address.push((a, vec![b])),
        }
    }
    let mut runs: Vec<Run<'a>> = Vec::new();
    for (a, packets) in by_address {
        let to = SockAddr::from(a);
        let mut i = 0;
        while i < packets.len() {
            let size = packets[i].len();
            let (mut end, mut bytes) = (i + 1, size);
            if gso {
                // Same-sized packets; a shorter one may end the run, a longer one may not join it.
                while end < packets.len()
                    && end - i < MAX_SEGMENTS
                    && bytes + packets[end].len() <= MAX_RUN_BYTES
                    && packets[end - 1].len() == size
                    && packets[end].len() <= size
                {
                    bytes += packets[end].len();
                    end += 1;
                }
            }
            runs.push(Run { to: to.clone(), packets: packets[i..end].to_vec() });
            i = end;
        }
    }
    runs
}

/// Sends every packet of `out` (in batches of messages, runs of same-sized packets to one
/// address as one offloaded message while `gso` is on), then clears it. A message the
/// kernel refuses (an unreachable member, a firewall rule) is skipped and its packets
/// counted in the result's second number; a refusal of offloading turns `gso` off and
/// sends the rest one packet a message. Returns (packets sent, packets refused, bytes sent).
pub fn send_all(socket: &Socket, out: &mut Outbox, gso: &Segmentation) -> (u64, u64, u64) {
    let (mut sent, mut refused, mut bytes) = (0u64, 0u64, 0u64);
    let mut runs = runs(out, gso.on());
    let mut at = 0;
    while at < runs.len() {
        let chunk = &runs[at..(at + BATCH).min(runs.len())];
        // Each run's packets as consecutive iovecs: the kernel gathers them into one payload.
        let mut iovs: Vec<libc::iovec> = chunk
            .iter()
            .flat_map(|r| r.packets.iter().map(|b| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }))
            .collect();
        // One control buffer a message: a UDP_SEGMENT header and its u16 segment size.
        let mut controls: Vec<[u64; 4]> = vec![[0u64; 4]; chunk.len()];
        // SAFETY: mmsghdr is plain old data; it is filled in below before use.
        let mut msgs: Vec<libc::mmsghdr> = (0..chunk.len()).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut first = 0;
        for (i, m) in msgs.iter_mut().enumerate() {
            let run = &chunk[i];
            m.msg_hdr.msg_name = run.to.as_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_namelen = run.to.len();
            m.msg_hdr.msg_iov = iovs[first..].as_mut_ptr();
            m.msg_hdr.msg_iovlen = run.packets.len() as _;
            first += run.packets.len();
            if run.packets.len() > 1 {
                // SAFETY: `controls[i]` (32 bytes, 8-aligned) holds one cmsghdr and a
                // u16; CMSG_SPACE(2) fits in it.
                unsafe {
                    m.msg_hdr.msg_control = controls[i].as_mut_ptr().cast();
                    m.msg_hdr.msg_controllen = libc::CMSG_SPACE(2) as _;
                    let c = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), run.packets[0].len() as u16);
                }
            }
        }
        // SAFETY: the pointers in `msgs` point into `runs` (addresses and the outbox's
        // bytes, which the kernel only reads), `iovs` and `controls`, all alive for the call.
        let r = unsafe { libc::sendmmsg(socket.as_raw_fd(), msgs.as_mut_ptr(), chunk.len() as libc::c_uint, 0) };
        if r <= 0 {
            let e = io::Error::last_os_error();
            if r < 0 && matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) {
                if e.kind() == io::ErrorKind::WouldBlock {
                    let _ = wait_writable(socket);
                }
                continue;
            }
            let offload = e.raw_os_error().is_some_and(|c| matches!(c, libc::EIO | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOPROTOOPT));
            if chunk[0].packets.len() > 1 && offload {
                // This kernel or device cannot segment: the rest goes one packet a message.
                gso.refused();
                let rest: Vec<Run<'_>> = runs
                    .drain(at..)
                    .flat_map(|r| {
                        let to = r.to;
                        r.packets.into_iter().map(move |p| Run { to: to.clone(), packets: vec![p] })
                    })
                    .collect();
                runs.extend(rest);
                continue;
            }
            // The first message of the chunk was refused: skip it and go on.
            refused += chunk[0].packets.len() as u64;
            at += 1;
            continue;
        }
        for c in &chunk[..r as usize] {
            bytes += c.bytes() as u64;
            sent += c.packets.len() as u64;
        }
        at += r as usize;
    }
    drop(runs);
    out.clear();
    (sent, refused, bytes)
}

fn wait_writable(socket: &Socket) -> io::Result<()> {
    let mut fd = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: `fd` is one valid pollfd that lives across the call.
    unsafe { libc::poll(&mut fd, 1, 100) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{Header, Kind, HEADER};

    /// `n` packets for `to` with payloads of `len` bytes, each starting with its number.
    fn queue(out: &mut Outbox, to: SocketAddr, first: u32, n: u32, len: usize) {
        for k in first..first + n {
            let mut h = Header::new(Kind::Data, 1, 0);
            h.seq = k;
            let mut payload = vec![(k % 251) as u8; len];
            payload[..4].copy_from_slice(&k.to_le_bytes());
            out.push_bytes(to, &h, &payload);
        }
    }

    fn receive_all(socket: &Socket, gro: bool, want: usize) -> Vec<Vec<u8>> {
        let mut batch = RecvBatch::with_gro(BATCH, gro);
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while got.len() < want && std::time::Instant::now() < deadline {
            if !wait_readable(socket, Some(Duration::from_millis(50))).unwrap() {
                continue;
            }
            let n = batch.recv(socket).unwrap();
            got.extend((0..n).map(|i| batch.get(i).unwrap().0.to_vec()));
        }
        got
    }

    #[test]
    fn runs_group_same_sized_packets_per_address_in_order() {
        let (a, b): (SocketAddr, SocketAddr) = ("127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap());
        let mut out = Outbox::default();
        queue(&mut out, a, 0, 3, 1000);
        queue(&mut out, b, 0, 2, 1000);
        queue(&mut out, a, 3, 2, 1000);
        queue(&mut out, a, 5, 1, 10); // shorter: ends a run
        queue(&mut out, a, 6, 1, 1000);
        let shape = |gso| runs(&out, gso).iter().map(|r| (r.to.as_socket().unwrap(), r.packets.len(), r.packets[0].len())).collect::<Vec<_>>();
        let p = HEADER + 1000;
        // a's packets need not lie back to back in the outbox (b's lie between): a run
        // gathers them; the shorter packet 5 ends one.
        assert_eq!(shape(true), vec![(a, 6, p), (a, 1, p), (b, 2, p)]);
        assert_eq!(shape(false).len(), 9);
        let all = runs(&out, true);
        assert!(all.iter().all(|r| r.packets.len() <= MAX_SEGMENTS && r.bytes() <= MAX_RUN_BYTES));
        let order: Vec<u32> = all[..2].iter().flat_map(|r| r.packets.iter().map(|b| u32::from_le_bytes(b[HEADER..HEADER + 4].try_into().unwrap()))).collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4, 5, 6], "a's packets keep their order");
    }

    #[test]
    fn offloaded_sends_arrive_as_the_same_datagrams_with_and_without_gro() {
        for gro in [true, false] {
            let rx = bind("127.0.0.1:0".parse().unwrap(), false, None).unwrap();
            let to = rx.local_addr().unwrap().as_socket().unwrap();
            let gro_on = gro && enable_gro(&rx);
            let tx = bind("127.0.0.1:0".parse().unwrap(), false, None).unwrap();
            let mut out = Outbox::default();
            let other = bind("127.0.0.1:0".parse().unwrap(), false, None).unwrap();
            let elsewhere = other.local_addr().unwrap().as_socket().unwrap();
            for k in 0..150 {
                queue(&mut out, to, k, 1, 1024); // more than one run of MAX_SEGMENTS
                queue(&mut out, elsewhere, k, 1, 1024); // interleaved: runs gather, not slice
            }
            queue(&mut out, to, 150, 1, 100);
            let want: Vec<Vec<u8>> = out.iter().filter(|(a, _)| *a == to).map(|(_, b)| b.to_vec()).collect();
            let all_bytes: usize = out.iter().map(|(_, b)| b.len()).sum();
            let gso = Segmentation::default();
            let (sent, refused, bytes) = send_all(&tx, &mut out, &gso);
            assert_eq!((sent, refused), (301, 0));
            assert_eq!(bytes as usize, all_bytes);
            assert!(out.is_empty());
            assert_eq!(receive_all(&other, false, 150).len(), 150);
            let got = receive_all(&rx, gro_on, want.len());
            assert_eq!(got.len(), want.len(), "gro {gro_on}: datagrams lost on loopback");
            assert_eq!(got, want, "gro {gro_on}: datagrams differ or came out of order");
        }
    }

    #[test]
    fn without_offload_every_packet_is_its_own_message() {
        let rx = bind("127.0.0.1:0".parse().unwrap(), false, None).unwrap();
        let to = rx.local_addr().unwrap().as_socket().unwrap();
        let tx = bind("127.0.0.1:0".parse().unwrap(), false, None).unwrap();
        let mut out = Outbox::default();
        queue(&mut out, to, 0, 20, 512);
        let want: Vec<Vec<u8>> = out.iter().map(|(_, b)| b.to_vec()).collect();
        assert_eq!(send_all(&tx, &mut out, &Segmentation::off()).0, 20);
        assert_eq!(receive_all(&rx, false, 20), want);
    }
}

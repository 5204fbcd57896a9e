//! UDP in batches: `recvmmsg` and `sendmmsg`, so one system call moves up to `BATCH`
//! datagrams each way. The only module with `unsafe`: it hands the kernel pointers into
//! buffers this module owns for the duration of each call.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::outbox::Outbox;
use crate::packet::{MAX_PACKET, TOS};

/// Datagrams per system call.
pub const BATCH: usize = 64;

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

/// Buffers for one `recvmmsg`.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    names: Vec<libc::sockaddr_storage>,
    lens: Vec<usize>,
    name_lens: Vec<libc::socklen_t>,
    got: usize,
}

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch::new(BATCH)
    }
}

impl RecvBatch {
    pub fn new(n: usize) -> RecvBatch {
        RecvBatch {
            bufs: (0..n).map(|_| vec![0u8; MAX_PACKET + 1]).collect(),
            // SAFETY: sockaddr_storage is plain old data; all zeros is a valid (empty) value.
            names: (0..n).map(|_| unsafe { std::mem::zeroed() }).collect(),
            lens: vec![0; n],
            name_lens: vec![0; n],
            got: 0,
        }
    }

    /// Receives what is waiting, without blocking: up to the batch's size. Returns how many.
    pub fn recv(&mut self, socket: &Socket) -> io::Result<usize> {
        let n = self.bufs.len();
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
        }
        // SAFETY: every pointer in `msgs` points into `self.bufs`, `self.names` or `iovs`,
        // which outlive the call and are not otherwise borrowed during it.
        let r = unsafe {
            libc::recvmmsg(socket.as_raw_fd(), msgs.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT, std::ptr::null_mut())
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            self.got = 0;
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                // An ICMP error from an earlier send (a member went away) surfaces here.
                io::ErrorKind::ConnectionRefused => Ok(0),
                _ => Err(e),
            };
        }
        self.got = r as usize;
        for (i, m) in msgs.iter().take(self.got).enumerate() {
            self.lens[i] = m.msg_len as usize;
            self.name_lens[i] = m.msg_hdr.msg_namelen;
        }
        Ok(self.got)
    }

    /// The `i`th datagram of the last `recv`: its bytes and sender. A datagram longer than
    /// any packet is returned whole-but-one-byte-longer than `MAX_PACKET`, so parsing refuses it.
    pub fn get(&self, i: usize) -> Option<(&[u8], SocketAddr)> {
        if i >= self.got {
            return None;
        }
        let len = self.lens[i].min(self.bufs[i].len());
        Some((&self.bufs[i][..len], to_socket_addr(&self.names[i], self.name_lens[i])?))
    }
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

/// Sends every packet of `out` (in batches), then clears it. A packet the kernel refuses
/// (an unreachable member, a firewall rule) is skipped and counted in the result's second
/// number. Returns (packets sent, packets refused, bytes sent).
pub fn send_all(socket: &Socket, out: &mut Outbox) -> (u64, u64, u64) {
    let packets: Vec<(SockAddr, &[u8])> = out.iter().map(|(a, b)| (SockAddr::from(a), b)).collect();
    let (mut sent, mut refused, mut bytes) = (0u64, 0u64, 0u64);
    let mut at = 0;
    while at < packets.len() {
        let chunk = &packets[at..(at + BATCH).min(packets.len())];
        let mut iovs: Vec<libc::iovec> =
            chunk.iter().map(|(_, b)| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }).collect();
        // SAFETY: mmsghdr is plain old data; it is filled in below before use.
        let mut msgs: Vec<libc::mmsghdr> = (0..chunk.len()).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (i, m) in msgs.iter_mut().enumerate() {
            m.msg_hdr.msg_name = chunk[i].0.as_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_namelen = chunk[i].0.len();
            m.msg_hdr.msg_iov = &mut iovs[i];
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: the pointers in `msgs` point into `packets` (addresses and the outbox's
        // bytes, which the kernel only reads) and `iovs`, all alive for the call.
        let r = unsafe { libc::sendmmsg(socket.as_raw_fd(), msgs.as_mut_ptr(), chunk.len() as libc::c_uint, 0) };
        if r <= 0 {
            let e = io::Error::last_os_error();
            if r < 0 && matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) {
                if e.kind() == io::ErrorKind::WouldBlock {
                    let _ = wait_writable(socket);
                }
                continue;
            }
            // The first packet of the chunk was refused: skip it and go on.
            refused += 1;
            at += 1;
            continue;
        }
        for c in &chunk[..r as usize] {
            bytes += c.1.len() as u64;
        }
        sent += r as u64;
        at += r as usize;
    }
    out.clear();
    (sent, refused, bytes)
}

fn wait_writable(socket: &Socket) -> io::Result<()> {
    let mut fd = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: `fd` is one valid pollfd that lives across the call.
    unsafe { libc::poll(&mut fd, 1, 100) };
    Ok(())
}

//! The daemon: one UDP socket and one event loop on one thread.
//!
//! Each turn waits (poll) up to `TICK` for datagrams, or spins without waiting when
//! `busy_poll` is set (that thread then takes a whole core); takes up to `BATCH` of them with
//! one `recvmmsg`; hands each to the `Engine`; sends what it produced with `sendmmsg`; and runs
//! the engine's timers every `TICK`. `stop` ends the loop at its next turn.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use socket2::Socket;

use crate::engine::{Engine, Options, TICK};
use crate::socket::{self, RecvBatch};
use crate::stats::Stats;
use crate::Error;

/// Where and how the daemon listens, on top of the engine's options.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    pub address: SocketAddr,
    pub engine: Options,
    pub busy_poll: bool,
    /// On-path mode: take packets addressed to other hosts that nftables TPROXY diverts here.
    pub transparent: bool,
    /// The ToS byte of the daemon's packets (default `packet::TOS`).
    pub tos: Option<u8>,
    /// UDP segmentation and receive offload (`UDP_SEGMENT`, `UDP_GRO`) where the kernel
    /// has them; off: one datagram a message each way.
    pub offload: bool,
}

pub struct Daemon {
    address: SocketAddr,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Daemon {
    /// Binds the socket and starts the event loop.
    pub fn start(options: DaemonOptions) -> Result<Daemon, Error> {
        if options.address.ip().is_unspecified() && options.engine.token.is_none() && options.engine.allow.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "address {} accepts members from any network: give a token or an allow-list of member addresses",
                options.address
            )));
        }
        if !options.address.ip().is_loopback() && options.engine.token.is_none() && options.engine.allow.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "address {} is beyond loopback: give a token (members send it in their Join) or an allow-list of member addresses",
                options.address
            )));
        }
        if !(0.0..1.0).contains(&options.engine.drop_rate) {
            return Err(Error::InvalidArgument(format!("drop_rate must be in [0, 1), got {}", options.engine.drop_rate)));
        }
        let socket = socket::bind(options.address, options.transparent, options.tos)
            .map_err(|e| Error::Io(format!("cannot bind the aggregation socket to {}: {e}", options.address)))?;
        let address = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| Error::Io("the aggregation socket has no address".into()))?;
        let stats = Arc::new(Stats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let engine = Engine::new(options.engine, stats.clone());
        let busy = options.busy_poll;
        let gro = options.offload && socket::enable_gro(&socket);
        let gso = if options.offload { socket::Segmentation::default() } else { socket::Segmentation::off() };
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("reprise-aggregate".into())
                .spawn(move || run(socket, engine, busy, gro, gso, &stop))
                .map_err(|e| Error::Io(format!("cannot start the aggregation thread: {e}")))?
        };
        tracing::info!("aggregate: listening on {address}");
        Ok(Daemon { address, stats, stop, thread: Some(thread) })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Ends the event loop and waits for it.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(socket: Socket, mut engine: Engine, busy: bool, gro: bool, gso: socket::Segmentation, stop: &AtomicBool) {
    let mut batch = RecvBatch::with_gro(socket::BATCH, gro);
    let stats = engine.stats.clone();
    let mut next_tick = Instant::now() + TICK;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let wait = if busy { None } else { Some(next_tick.saturating_duration_since(now)) };
        let readable = match socket::wait_readable(&socket, wait) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("aggregate: poll failed: {e}");
                std::thread::sleep(TICK);
                false
            }
        };
        if readable || busy {
            let n = match batch.recv(&socket) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!("aggregate: recvmmsg failed: {e}");
                    0
                }
            };
            if n > 0 {
                let started = Instant::now();
                for i in 0..n {
                    if let Some((bytes, from)) = batch.get(i) {
                        engine.handle(bytes, from, started);
                    } else {
                        Stats::add(&stats.malformed, 1);
                    }
                }
                flush(&socket, &mut engine, &stats, &gso);
                Stats::add(&stats.busy_ns, started.elapsed().as_nanos() as u64);
            }
        }
        let now = Instant::now();
        if now >= next_tick {
            engine.tick(now);
            flush(&socket, &mut engine, &stats, &gso);
            next_tick = now + TICK;
        }
    }
}

fn flush(socket: &Socket, engine: &mut Engine, stats: &Stats, gso: &socket::Segmentation) {
    if engine.out.is_empty() {
        return;
    }
    let (sent, _refused, bytes) = socket::send_all(socket, &mut engine.out, gso);
    Stats::add(&stats.packets_sent, sent);
    Stats::add(&stats.bytes_sent, bytes);
}

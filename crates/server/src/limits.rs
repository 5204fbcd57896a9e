//! What keeps one client from exhausting a remote server: bounded connections (per
//! server and per peer address), an idle timeout (a connection with no call in
//! progress), a stall timeout (a connection whose peer stopped reading what the
//! server sends, e.g. a sample stream it never consumes), and a rate limit on failed
//! token attempts per peer address. Half-open connections are found by HTTP/2
//! keepalive pings (the tonic builder's settings, in `remote`).
//!
//! Every accepted TCP connection is wrapped in a [`Connection`]; a reaper task looks
//! at each one's [`Activity`] once a second and ends those past a timeout: their next
//! read fails, so hyper closes them and every call on them ends (a sample's rows are
//! released, a writer is dropped as when its client dies).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::metrics::Metrics;
use crate::monitor::{ClientGuard, Monitor};

/// The limits of a remote server (`RemoteServerOptions`; `reprise serve` keys of the same names).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most open connections; more are closed as they arrive.
    pub max_connections: usize,
    /// Most open connections from one IP address.
    pub max_connections_per_peer: usize,
    /// A connection with no call in progress for this long is closed (clients reconnect).
    pub idle_timeout: Option<Duration>,
    /// A connection whose peer has not taken any of the bytes the server has to send
    /// for this long is closed (a client that stopped reading its sample stream).
    pub stall_timeout: Option<Duration>,
    /// Failed token attempts logged per peer address per minute; beyond, that
    /// address's failed attempts are refused with a message saying so and counted,
    /// not logged one by one (the right token is still accepted).
    pub auth_failures_per_minute: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_connections_per_peer: 128,
            idle_timeout: Some(Duration::from_secs(600)),
            stall_timeout: Some(Duration::from_secs(120)),
            auth_failures_per_minute: 20,
        }
    }
}

/// Milliseconds since `epoch`, never 0 (0 means "not set").
/// How long a write has been blocked at `now`, from when it blocked (`blocked`, 0:
/// not blocked). `now` is read once per reap, so a write that blocked after that read
/// is later than `now`: it has been blocked for 0 ms, not for ever.
fn blocked_for(now: u64, blocked: u64) -> u64 {
    if blocked == 0 {
        0
    } else {
        now.saturating_sub(blocked)
    }
}

fn millis(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64 + 1
}

/// What one connection is doing, for the reaper.
pub struct Activity {
    peer: SocketAddr,
    /// Calls in progress (streams count until they end).
    calls: AtomicUsize,
    /// When the last call ended or began.
    last_call: AtomicU64,
    /// Since when a write has been waiting for the peer to read (0: none waits).
    write_blocked: AtomicU64,
    /// Set by the reaper: the connection's next read fails.
    expired: AtomicBool,
    why: Mutex<&'static str>,
    waker: Mutex<Option<Waker>>,
}

/// A call in progress on a connection; dropping it ends the call.
pub struct Call(Arc<Activity>, Instant);

impl Activity {
    /// Ends the connection: its next read or write fails (`why` says which limit),
    /// so hyper closes it and every call on it ends.
    fn end(&self, why: &'static str) {
        *self.why.lock() = why;
        self.expired.store(true, Ordering::Release);
        if let Some(w) = self.waker.lock().take() {
            w.wake();
        }
    }
}

impl Call {
    /// Ends the call's whole connection (its peer stopped reading a stream): every
    /// call on it ends and what they hold is released.
    pub fn end_connection(&self, why: &'static str) {
        self.0.end(why);
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.0.last_call.store(millis(self.1), Ordering::Relaxed);
        self.0.calls.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The open connections of one server and the limits they are held to.
pub struct Connections {
    limits: Limits,
    epoch: Instant,
    open: Mutex<HashMap<SocketAddr, Weak<Activity>>>,
    per_peer: Mutex<HashMap<IpAddr, usize>>,
    total: AtomicUsize,
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    metrics: Arc<Metrics>,
}

impl Connections {
    pub fn new(limits: Limits, metrics: Arc<Metrics>) -> Arc<Connections> {
        Arc::new(Connections {
            limits,
            epoch: Instant::now(),
            open: Mutex::new(HashMap::new()),
            per_peer: Mutex::new(HashMap::new()),
            total: AtomicUsize::new(0),
            failures: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Counts one refusal for `reason` (`reprise_refused_total{reason}`).
    pub fn refused(&self, reason: &str) {
        self.metrics.refused.with_label_values(&[reason]).inc();
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// Takes an accepted connection in, or says why it is refused (the caller closes it).
    pub fn admit(self: &Arc<Self>, stream: tokio::net::TcpStream, monitor: &Arc<Monitor>) -> Result<Connection, String> {
        let peer = stream.peer_addr().map_err(|e| format!("a connection without a peer address ({e})"))?;
        {
            let mut per_peer = self.per_peer.lock();
            let from_peer = per_peer.get(&peer.ip()).copied().unwrap_or(0);
            let total = self.total.load(Ordering::Relaxed);
            if total >= self.limits.max_connections || from_peer >= self.limits.max_connections_per_peer {
                self.refused(if total >= self.limits.max_connections { "max_connections" } else { "max_connections_per_peer" });
                return Err(if total >= self.limits.max_connections {
                    format!("refused a connection from {peer}: {total} connections are open, the server's max_connections")
                } else {
                    format!("refused a connection from {peer}: {from_peer} connections from {} are open, the server's max_connections_per_peer", peer.ip())
                });
            }
            *per_peer.entry(peer.ip()).or_insert(0) += 1;
            self.total.fetch_add(1, Ordering::Relaxed);
        }
        let activity = Arc::new(Activity {
            peer,
            calls: AtomicUsize::new(0),
            last_call: AtomicU64::new(millis(self.epoch)),
            write_blocked: AtomicU64::new(0),
            expired: AtomicBool::new(false),
            why: Mutex::new(""),
            waker: Mutex::new(None),
        });
        self.open.lock().insert(peer, Arc::downgrade(&activity));
        let client = monitor.connect("remote", peer.to_string(), Some(peer));
        Ok(Connection { stream, activity, connections: self.clone(), _client: client })
    }

    /// Marks a call in progress on the connection at `peer` (None: not a tracked connection).
    pub fn call(&self, peer: Option<SocketAddr>) -> Option<Call> {
        let activity = self.open.lock().get(&peer?)?.upgrade()?;
        activity.calls.fetch_add(1, Ordering::Relaxed);
        activity.last_call.store(millis(self.epoch), Ordering::Relaxed);
        Some(Call(activity, self.epoch))
    }

    /// Notes a call beginning on the connection at `peer` (unary calls, which end at once).
    pub fn touch(&self, peer: Option<SocketAddr>) {
        if let Some(a) = peer.and_then(|p| self.open.lock().get(&p).and_then(Weak::upgrade)) {
            a.last_call.store(millis(self.epoch), Ordering::Relaxed);
        }
    }

    fn close(&self, peer: SocketAddr) {
        self.open.lock().remove(&peer);
        let mut per_peer = self.per_peer.lock();
        if let Some(n) = per_peer.get_mut(&peer.ip()) {
            *n -= 1;
            if *n == 0 {
                per_peer.remove(&peer.ip());
            }
        }
        self.total.fetch_sub(1, Ordering::Relaxed);
    }

    /// Ends the connections past a timeout; returns how many.
    pub fn reap(&self) -> usize {
        let now = millis(self.epoch);
        let open: Vec<Arc<Activity>> = self.open.lock().values().filter_map(Weak::upgrade).collect();
        let mut ended = 0;
        for a in open {
            let blocked = a.write_blocked.load(Ordering::Relaxed);
            let stalled = self.limits.stall_timeout.filter(|t| blocked_for(now, blocked) >= t.as_millis() as u64);
            let idle = self
                .limits
                .idle_timeout
                .filter(|t| a.calls.load(Ordering::Relaxed) == 0 && now.saturating_sub(a.last_call.load(Ordering::Relaxed)) >= t.as_millis() as u64);
            let why = match (stalled, idle) {
                (Some(t), _) => {
                    self.refused("stall_timeout");
                    tracing::warn!(target: "reprise", "closing the connection from {}: it has not read what the server sends for {:.0} s (stall_timeout)", a.peer, t.as_secs_f64());
                    "stall_timeout"
                }
                (None, Some(_)) => {
                    self.refused("idle_timeout");
                    "idle_timeout"
                }
                (None, None) => continue,
            };
            a.end(why);
            ended += 1;
        }
        ended
    }

    /// Runs [`Connections::reap`] every second until the runtime stops.
    pub async fn reaper(self: Arc<Self>) {
        if self.limits.idle_timeout.is_none() && self.limits.stall_timeout.is_none() {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            self.reap();
        }
    }

    /// Whether a failed token attempt from `peer` is past its address's limit for the
    /// current minute (it is then refused with [`Connections::throttled`]'s message).
    fn over_limit(&self, peer: SocketAddr) -> Option<(u32, u64)> {
        let failures = self.failures.lock();
        match failures.get(&peer.ip()) {
            Some((since, n)) if *n >= self.limits.auth_failures_per_minute && since.elapsed() < Duration::from_secs(60) => {
                Some((*n, 60 - since.elapsed().as_secs()))
            }
            _ => None,
        }
    }

    /// Counts a failed token attempt from `peer` and says how to answer it: the
    /// attempts past `auth_failures_per_minute` in a minute are refused with a message
    /// that says so and logged once a minute, not one line each. The right token is
    /// never refused: clients behind one address (a NAT, a shared host) keep working
    /// while one of them is misconfigured.
    pub fn failed_authentication(&self, peer: Option<SocketAddr>, why: &str) -> String {
        self.refused("auth_failure");
        let Some(peer) = peer else { return why.to_string() };
        if let Some((n, wait)) = self.over_limit(peer) {
            self.refused("auth_throttled");
            let mut failures = self.failures.lock();
            if let Some(entry) = failures.get_mut(&peer.ip()) {
                entry.1 += 1;
            }
            return format!(
                "{why}; too many failed token attempts from {}: {n} in the last minute (the server's auth_failures_per_minute), \
                 later ones are not logged for {wait} s",
                peer.ip()
            );
        }
        let mut failures = self.failures.lock();
        if failures.len() > 4096 {
            failures.retain(|_, (since, _)| since.elapsed() < Duration::from_secs(60));
        }
        let entry = failures.entry(peer.ip()).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= Duration::from_secs(60) {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
        let n = entry.1;
        drop(failures);
        if n == self.limits.auth_failures_per_minute {
            tracing::warn!(target: "reprise", "refused a call from {peer}: {why} ({n} failed attempts from {} this minute: the server's auth_failures_per_minute; later ones this minute are refused without a log line each)", peer.ip());
        } else {
            tracing::warn!(target: "reprise", "refused a call from {peer}: {why} ({n} failed attempts from {} this minute)", peer.ip());
        }
        why.to_string()
    }
}

/// An accepted TCP connection: registered with the monitor and the limits while open.
pub struct Connection {
    stream: tokio::net::TcpStream,
    activity: Arc<Activity>,
    connections: Arc<Connections>,
    _client: ClientGuard,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.connections.close(self.activity.peer);
    }
}

impl Connection {
    /// Fails once the connection has been ended ([`Activity::end`]).
    fn check(&self) -> std::io::Result<()> {
        if self.activity.expired.load(Ordering::Acquire) {
            let why = *self.activity.why.lock();
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("connection closed by the server's {why}")));
        }
        Ok(())
    }

    /// Keeps the waker of the task waiting to read, for [`Activity::end`] to wake it
    /// (the connection's one task: it reads and writes).
    fn register(&self, cx: &Context<'_>) {
        let mut waker = self.activity.waker.lock();
        if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *waker = Some(cx.waker().clone());
        }
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Connection {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        if r.is_pending() {
            // Registered only when the task waits; checked again so an end that came
            // before the registration is not missed.
            this.register(cx);
            this.check()?;
        }
        r
    }
}

impl Connection {
    /// Notes whether a write is waiting for the peer to read.
    fn wrote<T>(&self, r: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        match &r {
            Poll::Pending => {
                // Never 0 (which means "not blocked"), even in the first millisecond.
                let at = millis(self.connections.epoch).max(1);
                let _ = self.activity.write_blocked.compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
            }
            Poll::Ready(_) => self.activity.write_blocked.store(0, Ordering::Relaxed),
        }
        r
    }
}

impl AsyncWrite for Connection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.check()?;
        let r = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.wrote(r)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.check()?;
        let r = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.wrote(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_flush(cx);
        this.wrote(r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::blocked_for;

    #[test]
    fn a_write_that_blocks_after_the_reap_read_its_clock_is_not_stalled() {
        assert_eq!(blocked_for(1000, 1001), 0, "blocked 1 ms after `now` was read: no wrap to u64::MAX");
        assert_eq!(blocked_for(1000, 0), 0, "0 means not blocked");
        assert_eq!(blocked_for(5000, 1000), 4000);
    }
}

"""A user-space delay relay: UDP and TCP traffic held D +- J microseconds per hop (this kernel
has no netem, so a per-hop delay is added in user space).

UDP (``udp(listen, target, hops)``): a datagram from a client to ``listen`` is sent to ``target``
``hops`` x (D + uniform(-J, J)) later from an upstream socket of that client's own (one per
client address), so the target's replies can be told apart; a reply to that socket goes back to
the client after the same delay. Jitter is drawn per datagram from a seeded generator, so
datagrams can be reordered, as on a real path with jitter.

TCP (``tcp(listen, target, hops)``): each accepted connection gets an upstream connection to
``target``; every chunk read from either side is written to the other side ``hops`` x (D +
jitter) after it was read, never before an earlier chunk (a byte stream keeps its order). With
``target=None`` the relay is *transparent*: the target is the connection's original destination
(``SO_ORIGINAL_DST``), for connections an nftables ``redirect`` rule sent here
(:func:`redirect_rules`); the relay's own upstream connections carry the firewall mark
:data:`MARK` so that rule lets them pass. ``hops_by_ip`` then gives the hop count per
destination (e.g. 1 to the hub, 2 to another leaf through the hub).

One thread serves every socket (``select`` with a microsecond timeout; the schedule is a heap),
so one relay costs one core at most. Timers are not exact: ``stats()["late_us"]`` is how much
later than scheduled each datagram or chunk left (median, p99), so a run can say what delay it
really added. Use it as a module::

    relay = Relay(delay_us=100, jitter_us=10, seed=1)
    addr = relay.udp("127.0.0.1:0", "10.201.1.1:7100")   # (host, port) it listens on
    relay.start()            # a daemon thread; relay.stop() ends it and closes every socket

or as a command (one line ``READY {json of the bound addresses}`` on stdout, serves until SIGTERM,
SIGINT or, with ``--stdin``, the end of stdin; then one JSON line of statistics)::

    python -m benchmarks.innetwork.relay --delay-us 100 --jitter-us 10 --seed 1 \\
        --udp 127.0.0.1:0=10.201.1.1:7100 --tcp 127.0.0.1:7001=transparent --hops 10.201.1.1=1
"""

from __future__ import annotations

import argparse
import collections
import heapq
import itertools
import json
import random
import select
import signal
import socket
import struct
import sys
import threading
import time

__all__ = ["Relay", "MARK", "redirect_rules", "parse_addr"]

clock = time.monotonic
SO_ORIGINAL_DST = 80          # <linux/netfilter_ipv4.h>
MARK = 0x5A17                 # SO_MARK of the relay's upstream TCP connections
SOCKET_BUFFER = 4 << 20       # SO_RCVBUF / SO_SNDBUF asked for on every socket
TCP_CHUNK = 256 << 10         # largest read from a TCP socket
TCP_BACKLOG = 8 << 20         # stop reading a side while this much of it waits to be sent
UDP_BATCH = 256               # datagrams read from one socket per wake-up
LATE_SAMPLES = 200_000        # lateness samples kept for stats()


def parse_addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {text!r}: expected IP:PORT")
    return host, int(port)


def redirect_rules(port: int, table: str = "aggrelay", exclude: str = "127.0.0.0/8") -> str:
    """An ``nft -f -`` script for one namespace: every TCP connection this namespace opens to an
    address outside ``exclude`` goes to ``127.0.0.1:port`` (a transparent :class:`Relay`), except
    the relay's own (firewall mark :data:`MARK`)."""
    return "\n".join([
        f"add table ip {table}",
        f"add chain ip {table} out {{ type nat hook output priority -100; policy accept; }}",
        f"add rule ip {table} out meta mark {MARK:#x} return",
        f"add rule ip {table} out ip daddr != {exclude} meta l4proto tcp redirect to :{port}",
    ]) + "\n"


def _bind(kind: int, listen: tuple[str, int]) -> socket.socket:
    s = socket.socket(socket.AF_INET, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _buffers(s)
    s.bind(listen)
    s.setblocking(False)
    return s


def _buffers(s: socket.socket) -> None:
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            s.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass


class _Watch(dict):
    """fileno -> (socket, callback), with the socket list ``select`` wants, rebuilt only after a
    change."""

    def __init__(self):
        super().__init__()
        self._list: list | None = None

    def __setitem__(self, k, v):
        self._list = None
        super().__setitem__(k, v)

    def pop(self, k, *default):
        self._list = None
        return super().pop(k, *default)

    def sockets(self) -> list:
        if self._list is None:
            self._list = [s for s, _ in self.values()]
        return self._list

    def prune(self) -> None:
        for k in [k for k, (s, _) in self.items() if s.fileno() < 0]:
            self.pop(k)


class _Pipe:
    """One direction of a relayed TCP connection: chunks read from ``src`` wait in ``queue``
    (due time, bytes) until due, then go to ``dst``."""

    def __init__(self, conn: "_Conn", src: socket.socket, dst: socket.socket, delay_s: float):
        self.conn, self.src, self.dst, self.delay_s = conn, src, dst, delay_s
        self.queue: collections.deque = collections.deque()
        self.backlog = 0
        self.last_due = 0.0
        self.scheduled = False     # a heap entry for the head exists
        self.blocked = False       # dst's buffer was full: waiting for it to be writable
        self.reading = True        # src is in the read set
        self.eof = False           # src ended: shut dst's write side once the queue is sent
        self.bytes = 0


class _Conn:
    def __init__(self, client: socket.socket, upstream: socket.socket, delay_s: float, hops: int):
        self.client, self.upstream = client, upstream
        self.up = _Pipe(self, client, upstream, delay_s)      # client -> target
        self.down = _Pipe(self, upstream, client, delay_s)    # target -> client
        self.hops = hops
        self.closed = False


class Relay:
    """Delay relays for UDP and TCP sharing one thread (see the module docstring).
    ``delay_us`` and ``jitter_us`` are per hop; every rule says its hop count."""

    def __init__(self, delay_us: float = 0.0, jitter_us: float = 0.0, seed: int = 0):
        if delay_us < 0 or jitter_us < 0:
            raise ValueError("delay_us and jitter_us must be >= 0")
        self.delay_s = delay_us * 1e-6
        self.jitter_s = jitter_us * 1e-6
        self._rng = random.Random(seed)
        self._heap: list = []
        self._seq = itertools.count()
        self._readers: _Watch = _Watch()
        self._writers: _Watch = _Watch()
        self._sockets: list[socket.socket] = []
        self._conns: set[_Conn] = set()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._readers[self._wake_r.fileno()] = (self._wake_r, self._drain_wake)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._late: list[float] = []
        self.counts = collections.Counter()
        self.error: str | None = None

    # --- rules ---------------------------------------------------------------------------
    def _sample_delay(self, hops: int) -> float:
        j = self.jitter_s
        if not j:
            return hops * self.delay_s
        u = self._rng.random
        d = hops * self.delay_s + j * (2.0 * u() - 1.0)
        for _ in range(hops - 1):
            d += j * (2.0 * u() - 1.0)
        return d if d > 0.0 else 0.0

    def udp(self, listen: str | tuple, target: str | tuple, hops: int = 1) -> tuple[str, int]:
        """Relay datagrams sent to ``listen`` to ``target`` and the replies back, each delayed
        ``hops`` hops. Returns the bound (host, port). Call before :meth:`start`."""
        listen = parse_addr(listen) if isinstance(listen, str) else tuple(listen)
        target = parse_addr(target) if isinstance(target, str) else tuple(target)
        lsock = _bind(socket.SOCK_DGRAM, listen)
        self._sockets.append(lsock)
        upstream: dict[tuple, socket.socket] = {}

        heap, seq, push, delay = self._heap, self._seq, heapq.heappush, self._sample_delay

        def from_target(sock: socket.socket, client: tuple) -> None:
            n = 0
            recv = sock.recv
            for n in range(UDP_BATCH):
                try:
                    data = recv(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:          # ICMP unreachable from an earlier send
                    self.counts["udp_errors"] += 1
                    break
                push(heap, (clock() + delay(hops), next(seq), ("udp", lsock, data, client)))
            else:
                n = UDP_BATCH
            self.counts["udp_down"] += n

        def from_client(_sock=None) -> None:
            for _ in range(UDP_BATCH):
                try:
                    data, client = lsock.recvfrom(65536)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    self.counts["udp_errors"] += 1
                    return
                up = upstream.get(client)
                if up is None:
                    up = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    _buffers(up)
                    up.connect(target)
                    up.setblocking(False)
                    upstream[client] = up
                    self._sockets.append(up)
                    self._readers[up.fileno()] = (up, lambda s=up, c=client: from_target(s, c))
                self.counts["udp_up"] += 1
                push(heap, (clock() + delay(hops), next(seq), ("udp", up, data, None)))

        self._readers[lsock.fileno()] = (lsock, from_client)
        return lsock.getsockname()

    def tcp(self, listen: str | tuple, target: str | tuple | None = None, hops: int = 1,
            hops_by_ip: dict[str, int] | None = None) -> tuple[str, int]:
        """Relay TCP connections accepted on ``listen`` to ``target`` (``None``: transparent,
        the original destination), both directions delayed ``hops`` hops (or
        ``hops_by_ip[destination IP]``). Returns the bound (host, port)."""
        listen = parse_addr(listen) if isinstance(listen, str) else tuple(listen)
        if isinstance(target, str):
            target = parse_addr(target)
        lsock = _bind(socket.SOCK_STREAM, listen)
        lsock.listen(128)
        self._sockets.append(lsock)
        by_ip = dict(hops_by_ip or {})

        def accept(_sock=None) -> None:
            while True:
                try:
                    client, _ = lsock.accept()
                except (BlockingIOError, InterruptedError):
                    return
                try:
                    dest = target or _original_dst(client)
                    up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    try:
                        up.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
                    except OSError:
                        pass
                    _buffers(up)
                    up.settimeout(5.0)
                    up.connect(dest)
                except OSError:
                    self.counts["tcp_connect_errors"] += 1
                    client.close()
                    continue
                for s in (client, up):
                    s.setblocking(False)
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = _Conn(client, up, by_ip.get(dest[0], hops) * self.delay_s,
                             by_ip.get(dest[0], hops))
                self._conns.add(conn)
                self.counts["tcp_connections"] += 1
                for pipe in (conn.up, conn.down):
                    self._readers[pipe.src.fileno()] = (pipe.src, lambda p=pipe: self._tcp_read(p))

        self._readers[lsock.fileno()] = (lsock, accept)
        return lsock.getsockname()

    # --- TCP ----------------------------------------------------------------------------
    def _tcp_read(self, p: _Pipe) -> None:
        try:
            data = p.src.recv(TCP_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(p.conn)
            return
        now = clock()
        delay = self._sample_delay(p.conn.hops) if self.jitter_s else p.delay_s
        due = max(p.last_due, now + delay)
        p.last_due = due
        if not data:
            p.eof = True
            p.queue.append((due, None))
            self._stop_reading(p)
        else:
            p.queue.append((due, memoryview(data)))
            p.backlog += len(data)
            if p.backlog > TCP_BACKLOG:
                self._stop_reading(p)
        if not p.scheduled and not p.blocked:
            p.scheduled = True
            self._push(p.queue[0][0], ("tcp", p))

    def _stop_reading(self, p: _Pipe) -> None:
        if p.reading:
            p.reading = False
            self._readers.pop(p.src.fileno(), None)

    def _tcp_flush(self, p: _Pipe) -> None:
        """Send every due chunk at the head of ``p``'s queue that ``dst`` takes now."""
        if p.conn.closed:
            return
        now = clock()
        while p.queue and p.queue[0][0] <= now:
            due, data = p.queue[0]
            if data is None:                   # the source ended: pass it on
                p.queue.popleft()
                try:
                    p.dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                if p.conn.up.eof and p.conn.down.eof and not p.conn.up.queue and not p.conn.down.queue:
                    self._close(p.conn)
                return
            try:
                n = p.dst.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self._close(p.conn)
                return
            if n == len(data):
                p.queue.popleft()
                self._late_sample(now - due)
            else:
                p.queue[0] = (due, data[n:])
            p.backlog -= n
            p.bytes += n
            if n < len(data):                  # dst full: wait until it is writable
                p.blocked = True
                self._writers[p.dst.fileno()] = (p.dst, lambda q=p: self._tcp_writable(q))
                return
        if not p.reading and not p.eof and p.backlog <= TCP_BACKLOG // 2:
            p.reading = True
            self._readers[p.src.fileno()] = (p.src, lambda q=p: self._tcp_read(q))
        if p.queue and not p.scheduled:
            p.scheduled = True
            self._push(p.queue[0][0], ("tcp", p))

    def _tcp_writable(self, p: _Pipe) -> None:
        self._writers.pop(p.dst.fileno(), None)
        p.blocked = False
        self._tcp_flush(p)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        for s in (conn.client, conn.upstream):
            self._readers.pop(s.fileno(), None)
            self._writers.pop(s.fileno(), None)
        for s in (conn.client, conn.upstream):
            try:
                s.close()
            except OSError:
                pass
        self.counts["tcp_bytes_up"] += conn.up.bytes
        self.counts["tcp_bytes_down"] += conn.down.bytes
        self._conns.discard(conn)

    # --- the loop -----------------------------------------------------------------------
    def _push(self, due: float, item: tuple) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), item))

    def _late_sample(self, late_s: float) -> None:
        if len(self._late) < LATE_SAMPLES:
            self._late.append(late_s)

    def _fire_due(self) -> None:
        now = clock()
        heap, pop, late = self._heap, heapq.heappop, self._late
        while heap and heap[0][0] <= now:
            due, _, item = pop(heap)
            if item[0] == "udp":
                _, sock, data, addr = item
                try:
                    sock.send(data) if addr is None else sock.sendto(data, addr)
                    if len(late) < LATE_SAMPLES:
                        late.append(now - due)
                except OSError:   # a full buffer or an ICMP error: lost, as on a real link
                    self.counts["udp_send_errors"] += 1
            else:
                p = item[1]
                p.scheduled = False
                if not p.blocked:
                    self._tcp_flush(p)
            now = clock()

    def _drain_wake(self, _sock=None) -> None:
        try:
            self._wake_r.recv(4096)
        except OSError:
            pass

    def serve_forever(self) -> None:
        """Run the loop in this thread until :meth:`stop`."""
        _tight_timers()
        try:
            while not self._stop.is_set():
                timeout = 0.2
                if self._heap:
                    timeout = min(timeout, max(0.0, self._heap[0][0] - clock()))
                try:
                    r, w, _ = select.select(self._readers.sockets(), self._writers.sockets(), [], timeout)
                except (OSError, ValueError):     # a socket closed under us: drop it
                    self._readers.prune()
                    self._writers.prune()
                    continue
                for s in r:
                    entry = self._readers.get(s.fileno())
                    if entry is not None:
                        entry[1]()
                for s in w:
                    entry = self._writers.get(s.fileno())
                    if entry is not None:
                        entry[1]()
                self._fire_due()
        except Exception as e:  # noqa: BLE001 - reported by stats() and the CLI
            self.error = f"{type(e).__name__}: {e}"
            raise
        finally:
            self._close_all()

    def start(self) -> "Relay":
        self._thread = threading.Thread(target=self.serve_forever, name="delay-relay", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout)

    def _close_all(self) -> None:
        for conn in list(self._conns):
            self._close(conn)
        for s in self._sockets + [self._wake_r, self._wake_w]:
            try:
                s.close()
            except OSError:
                pass

    def stats(self) -> dict:
        late = sorted(self._late)
        out = dict(self.counts)
        out.update(delay_us=self.delay_s * 1e6, jitter_us=self.jitter_s * 1e6, samples=len(late))
        if late:
            out["late_us"] = {"p50": late[len(late) // 2] * 1e6,
                              "p99": late[min(len(late) - 1, int(0.99 * len(late)))] * 1e6,
                              "max": late[-1] * 1e6}
        if self.error:
            out["error"] = self.error
        return out


def _tight_timers() -> None:
    """Timer slack 1 ns for this thread (Linux's default, 50 us, would add up to 50 us to every
    hold)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)   # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


def _original_dst(conn: socket.socket) -> tuple[str, int]:
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack_from("!H", raw, 2)[0]
    return socket.inet_ntoa(raw[4:8]), port


# --- the command ---------------------------------------------------------------------------
def _rule(text: str) -> tuple[str, str, int]:
    """``LISTEN=TARGET[@HOPS]`` -> (listen, target, hops)."""
    hops = 1
    if "@" in text:
        text, h = text.rsplit("@", 1)
        hops = int(h)
    listen, sep, target = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LISTEN=TARGET[@HOPS]")
    return listen, target, hops


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--udp", action="append", default=[], type=_rule, metavar="LISTEN=TARGET[@HOPS]")
    ap.add_argument("--tcp", action="append", default=[], type=_rule,
                    metavar="LISTEN=TARGET[@HOPS]", help="TARGET 'transparent': SO_ORIGINAL_DST")
    ap.add_argument("--hops", action="append", default=[], metavar="IP=N",
                    help="transparent TCP: hops to this destination (default: the rule's)")
    ap.add_argument("--delay-us", type=float, default=0.0, help="delay per hop (us)")
    ap.add_argument("--jitter-us", type=float, default=0.0, help="+- uniform jitter per hop (us)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stdin", action="store_true", help="also stop when stdin ends")
    args = ap.parse_args(argv)
    if not args.udp and not args.tcp:
        ap.error("nothing to relay: give --udp and/or --tcp")
    relay = Relay(args.delay_us, args.jitter_us, args.seed)
    by_ip = {ip: int(n) for ip, n in (h.split("=", 1) for h in args.hops)}
    bound = {"udp": [], "tcp": []}
    for listen, target, hops in args.udp:
        bound["udp"].append("%s:%d" % relay.udp(listen, target, hops))
    for listen, target, hops in args.tcp:
        tgt = None if target == "transparent" else target
        bound["tcp"].append("%s:%d" % relay.tcp(listen, tgt, hops, by_ip))
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    if args.stdin:
        threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    relay.start()
    print("READY " + json.dumps(bound), flush=True)
    while not done.wait(0.5):
        if relay._thread is not None and not relay._thread.is_alive():
            break
    relay.stop()
    print(json.dumps(relay.stats()), flush=True)
    return 1 if relay.error else 0


if __name__ == "__main__":
    sys.exit(main())

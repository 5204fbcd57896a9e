"""Several replay servers behind one client (Reverb paper, section 3.6).

    pool = rp.ClientPool(["10.0.0.1:7070", "10.0.0.2:7070"], token="...")
    with pool.writer("replay") as w:      # episodes go to the servers in turn
        ...
    s = pool.sample("replay", 256)        # drawn from every live server, merged
    pool.update_priorities("replay", s.keys, new, servers=s.servers)

A server that cannot be reached is skipped with a logged warning (logger ``reprise``)
and tried again after ``retry_after`` seconds.

The pool, not the writer, holds the round-robin turn: an episode takes the next live
server when its first step is appended, whichever writer or thread writes it, so one
short-lived writer per episode spreads episodes as evenly as one long-lived writer.
The pool is thread-safe; each ``PoolWriter`` is used by one thread at a time.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from ._convert import as_int
from .client import Client
from .errors import InvalidArgument, NotFound, RepriseError, Timeout
from .sample import Sample

log = logging.getLogger("reprise")

# Errors that mean "this server is gone", not "this call was wrong".
_UNREACHABLE = ("connection to the replay server lost", "cannot connect", "unavailable")


def _unreachable(e: BaseException) -> bool:
    return type(e) is RepriseError and any(s in str(e) for s in _UNREACHABLE)


class ClientPool:
    """Clients of several servers with the same tables.

    - ``writer(table)``: a writer whose episodes go to the live servers round-robin
      (an item's steps are on one server). The turn is the pool's: each episode, of
      any writer in any thread, takes the next live server at its first step.
    - ``sample(table, n)``: each live server draws a share of n proportional to its
      table's size; the batches are merged. ``table_size`` is the total size and each
      ``probabilities[i]`` is the item's probability in the merged draw, so
      ``importance_weights`` stay right. ``sample.servers[i]`` says which server item i
      came from (keys are per server).
    - ``update_priorities`` / ``delete`` route keys with ``servers``; ``info()`` is per server.
    """

    def __init__(self, addresses, token: str | None = None, retry_after: float = 5.0, **client_options):
        addresses = list(addresses)
        if not addresses or not all(isinstance(a, str) for a in addresses):
            raise InvalidArgument(f"addresses must be a non-empty list of 'host:port' strings, got {addresses!r}")
        self.addresses = addresses
        self._options = dict(client_options, token=token)
        self._clients: list[Client | None] = [None] * len(addresses)
        self._down_until = [0.0] * len(addresses)
        self._retry_after = float(retry_after)
        self._next = 0
        # Guards _clients, _down_until and _next; never held while connecting.
        self._lock = threading.Lock()
        for i in range(len(addresses)):
            self._client(i)
        if not any(self._clients):
            raise RepriseError(f"none of the servers {addresses} can be reached")

    def _client(self, i: int) -> Client | None:
        with self._lock:
            c = self._clients[i]
            if c is not None or time.monotonic() < self._down_until[i]:
                return c
        try:
            c = Client(self.addresses[i], **self._options)
        except RepriseError as e:
            if not _unreachable(e):
                raise
            self._mark_down(i, e)
            return None
        with self._lock:
            other = self._clients[i]
            if other is None:
                self._clients[i] = c
                return c
        c.close()  # another thread connected first
        return other

    def _mark_down(self, i: int, e: BaseException):
        log.warning("replay server %s is unreachable, skipping it for %.0f s: %s", self.addresses[i], self._retry_after, e)
        with self._lock:
            self._clients[i] = None
            self._down_until[i] = time.monotonic() + self._retry_after

    def _live_clients(self) -> list[tuple[int, Client]]:
        found = ((i, self._client(i)) for i in range(len(self.addresses)))
        return [(i, c) for i, c in found if c is not None]

    def live(self) -> list[int]:
        """Indexes of the servers reachable now."""
        return [i for i, _ in self._live_clients()]

    def _next_live(self) -> tuple[int, Client]:
        """Takes the next turn of the rotation: the server of a new episode."""
        for _ in range(len(self.addresses)):
            with self._lock:
                i = self._next
                self._next = (i + 1) % len(self.addresses)
            c = self._client(i)
            if c is not None:
                return i, c
        raise RepriseError(f"none of the servers {self.addresses} can be reached")

    def writer(self, table: str | None = None, max_sequence_length: int | None = None) -> "PoolWriter":
        return PoolWriter(self, table, max_sequence_length)

    def sample(self, table: str, n: int, timeout: float | None = None, fields: list[str] | None = None) -> Sample:
        n = as_int("n", n, 1)
        sizes, clients = {}, {}
        for i, c in self._live_clients():
            try:
                sizes[i] = c.info()[table]["size"]
                clients[i] = c
            except KeyError:
                raise NotFound(f"server {self.addresses[i]} has no table named '{table}'") from None
            except RepriseError as e:
                if not _unreachable(e):
                    raise
                self._mark_down(i, e)
        total = sum(sizes.values())
        if not sizes:
            raise RepriseError(f"none of the servers {self.addresses} can be reached")
        shares = _shares(n, sizes)
        parts, servers = [], []
        for i, k in shares.items():
            if k == 0:
                continue
            try:
                s = clients[i].sample(table, k, timeout=timeout, fields=fields)
            except RepriseError as e:
                if not _unreachable(e):
                    raise
                self._mark_down(i, e)
                continue
            # P(item in the merged draw) = P(server i's share) * P(item | server i).
            s.probabilities = s.probabilities * (sizes[i] / total if total else 1.0 / len(sizes))
            parts.append(s)
            servers.append(np.full(len(s), i, np.int64))
        if not parts:
            raise Timeout(f"no server returned items from '{table}'")
        merged = _merge(parts, total)
        merged.servers = np.concatenate(servers)
        return merged

    def _route(self, keys, servers):
        keys = np.asarray(keys, np.uint64)
        servers = np.asarray(servers, np.int64)
        if keys.shape != servers.shape:
            raise InvalidArgument(f"{len(keys)} keys but {len(servers)} servers; pass servers=sample.servers")
        if len(servers) and (servers.min() < 0 or servers.max() >= len(self.addresses)):
            raise InvalidArgument(f"servers must be indexes below {len(self.addresses)}")
        return keys, servers

    def update_priorities(self, table: str, keys, priorities, servers) -> int:
        keys, servers = self._route(keys, servers)
        priorities = np.broadcast_to(np.asarray(priorities, np.float64), keys.shape)
        done = 0
        for i in np.unique(servers):
            c = self._client(int(i))
            if c is None:
                continue
            m = servers == i
            try:
                done += c.update_priorities(table, keys[m], priorities[m])
            except RepriseError as e:
                if not _unreachable(e):
                    raise
                self._mark_down(int(i), e)
        return done

    def delete(self, table: str, keys, servers) -> int:
        keys, servers = self._route(keys, servers)
        done = 0
        for i in np.unique(servers):
            c = self._client(int(i))
            if c is not None:
                done += c.delete(table, keys[servers == i])
        return done

    def info(self) -> dict:
        """``{address: client.info()}`` for the live servers."""
        return {self.addresses[i]: c.info() for i, c in self._live_clients()}

    def close(self):
        with self._lock:
            clients = list(self._clients)
        for c in clients:
            if c is not None:
                c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _shares(n: int, sizes: dict) -> dict:
    """n split in proportion to sizes (largest remainders; equal when all are empty)."""
    total = sum(sizes.values())
    weights = {i: (s / total if total else 1.0 / len(sizes)) for i, s in sizes.items()}
    base = {i: int(n * w) for i, w in weights.items()}
    rest = n - sum(base.values())
    for i in sorted(weights, key=lambda i: n * weights[i] - base[i], reverse=True)[:rest]:
        base[i] += 1
    return base


def _merge(parts: list[Sample], total: int) -> Sample:
    t = max(p.data[f].shape[1] for p in parts for f in p.data) if parts[0].data else 0
    data = {}
    for f in parts[0].data:
        arrays = []
        for p in parts:
            a = p.data[f]
            if a.shape[1] < t:
                pad = np.zeros((a.shape[0], t - a.shape[1], *a.shape[2:]), a.dtype)
                a = np.concatenate([a, pad], axis=1)
            arrays.append(a)
        data[f] = np.concatenate(arrays)
    cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
    return Sample(keys=cat("keys"), probabilities=cat("probabilities"), priorities=cat("priorities"),
                  times_sampled=cat("times_sampled"), table_size=total, lengths=cat("lengths"), data=data)


class PoolWriter:
    """A writer whose episodes go to the servers of a pool in turn. An episode takes
    the pool's next live server at its first step (``append``, ``extend``, or asking
    ``server``), so a writer that is closed after ``end_episode`` takes no turn for an
    episode it never starts."""

    def __init__(self, pool: ClientPool, table: str | None, max_sequence_length: int | None):
        # Checked now, as a client's writer() would, though no server is taken yet.
        if max_sequence_length is not None:
            max_sequence_length = as_int("max_sequence_length", max_sequence_length, 1)
        if table is not None:
            for i in range(len(pool.addresses)):  # the first live server answers for all
                c = pool._client(i)
                if c is None:
                    continue
                if table not in c.tables:
                    raise NotFound(f"no table named '{table}'; server {pool.addresses[i]} has {c.tables}")
                break
        self._pool, self._table, self._msl = pool, table, max_sequence_length
        self._writers: dict[int, object] = {}
        # Servers written to since their last successful flush: losing one of them loses data.
        self._unflushed: set[int] = set()
        # The episode in progress: its server's index and writer; None between episodes.
        self._server: int | None = None
        self._w = None

    def _current(self):
        if self._w is None:
            self._server, self._w = self._open()
        return self._w

    def _open(self):
        for _ in range(len(self._pool.addresses)):
            i, c = self._pool._next_live()
            w = self._writers.get(i)
            if w is not None:
                return i, w
            try:
                w = c.writer(self._table, self._msl)
            except RepriseError as e:
                if not _unreachable(e):
                    raise
                self._pool._mark_down(i, e)
                continue
            self._writers[i] = w
            return i, w
        raise RepriseError(f"none of the servers {self._pool.addresses} can be reached")

    @property
    def server(self) -> str:
        """The address the current episode goes to (taking the pool's next turn if
        no episode is in progress)."""
        self._current()
        return self._pool.addresses[self._server]

    @property
    def episode_steps(self) -> int:
        return 0 if self._w is None else self._w.episode_steps

    def _writing(self):
        w = self._current()
        self._unflushed.add(self._server)
        return w

    def append(self, step, timeout=None):
        self._writing().append(step, timeout)

    def extend(self, steps, timeout=None):
        self._writing().extend(steps, timeout)

    def create_item(self, table, num_steps, priority, timeout=None):
        return self._writing().create_item(table, num_steps, priority, timeout)

    def create_items(self, table, num_steps, priorities, timeout=None):
        return self._writing().create_items(table, num_steps, priorities, timeout)

    def _lost(self, i: int, e: RepriseError) -> RepriseError | None:
        """Marks server ``i`` down after its writer failed with ``e``; the error to raise
        when it held writes not yet flushed (they may be lost with it), else None."""
        self._writers.pop(i, None)
        self._pool._mark_down(i, e)
        if i == self._server:
            self._server, self._w = None, None
        if i in self._unflushed:
            self._unflushed.discard(i)
            return RepriseError(
                f"lost the replay server {self._pool.addresses[i]} ({e}): what this writer wrote to it since its "
                "last successful flush may be lost with it; it is marked down and later episodes go to the live servers"
            )
        return None

    def end_episode(self, timeout=None):
        """Ends the episode here (flushing it, within ``timeout`` in all); the next one
        takes the pool's next live server. A server that died during the episode is
        marked down and skipped, and this raises: the episode's items it had not
        committed may be lost with it."""
        if self._w is None:
            return
        i = self._server
        deadline = None if timeout is None else time.monotonic() + timeout
        left = lambda: None if deadline is None else max(0.0, deadline - time.monotonic())  # noqa: E731
        try:
            self._w.end_episode(left())
            self._w.flush(left())
            self._unflushed.discard(i)
        except RepriseError as e:
            if not _unreachable(e):
                raise
            lost = self._lost(i, e)
            if lost is not None:
                raise lost from None
        self._server, self._w = None, None

    def flush(self, timeout=None):
        """Waits until every server written to has applied everything. A server that
        was lost with writes not yet flushed raises (after the others are flushed): those
        writes may be lost; the writer carries on with the live servers."""
        lost = None
        for i, w in list(self._writers.items()):
            try:
                w.flush(timeout)
                self._unflushed.discard(i)
            except RepriseError as e:
                if not _unreachable(e):
                    raise
                lost = self._lost(i, e) or lost
        if lost is not None:
            raise lost

    def close(self, timeout=None):
        """Flushes and closes every server's writer (each within ``timeout``); raises as
        ``flush`` does when a server was lost with writes not yet flushed."""
        self._server, self._w = None, None
        lost = None
        for i, w in list(self._writers.items()):
            try:
                w.close(timeout)
                self._unflushed.discard(i)
            except RepriseError as e:
                if not _unreachable(e):
                    raise
                lost = self._lost(i, e) or lost
        self._writers.clear()
        if lost is not None:
            raise lost

    def abort(self):
        """Closes every server's writer at once, waiting for nothing: what the servers
        have not committed is dropped, committed items stay."""
        self._server, self._w = None, None
        for w in self._writers.values():
            w.abort()
        self._writers.clear()
        self._unflushed.clear()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        """Closes on leaving the block; aborts (waits for nothing) when an exception
        leaves it, and lets the exception go on."""
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False

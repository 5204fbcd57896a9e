"""Several replay servers behind one client (Reverb paper, section 3.6).

    pool = rp.ClientPool(["10.0.0.1:7070", "10.0.0.2:7070"], token="...")
    with pool.writer("replay") as w:      # episodes go to the servers in turn
        ...
    s = pool.sample("replay", 256)        # drawn from every live server, merged
    pool.update_priorities("replay", s.keys, new, servers=s.servers)

A server that cannot be reached is skipped with a logged warning (logger ``reprise``)
and tried again after ``retry_after`` seconds.
"""

from __future__ import annotations

import logging
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
      (an item's steps are on one server, so the writer moves on at ``end_episode``).
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
        for i in range(len(addresses)):
            self._client(i)
        if not any(self._clients):
            raise RepriseError(f"none of the servers {addresses} can be reached")

    def _client(self, i: int) -> Client | None:
        c = self._clients[i]
        if c is not None:
            return c
        if time.monotonic() < self._down_until[i]:
            return None
        try:
            c = Client(self.addresses[i], **self._options)
        except RepriseError as e:
            if not _unreachable(e):
                raise
            self._mark_down(i, e)
            return None
        self._clients[i] = c
        return c

    def _mark_down(self, i: int, e: BaseException):
        log.warning("replay server %s is unreachable, skipping it for %.0f s: %s", self.addresses[i], self._retry_after, e)
        self._clients[i] = None
        self._down_until[i] = time.monotonic() + self._retry_after

    def live(self) -> list[int]:
        """Indexes of the servers reachable now."""
        return [i for i in range(len(self.addresses)) if self._client(i) is not None]

    def _next_live(self) -> tuple[int, Client]:
        for _ in range(len(self.addresses)):
            i = self._next
            self._next = (self._next + 1) % len(self.addresses)
            c = self._client(i)
            if c is not None:
                return i, c
        raise RepriseError(f"none of the servers {self.addresses} can be reached")

    def writer(self, table: str | None = None, max_sequence_length: int | None = None) -> "PoolWriter":
        return PoolWriter(self, table, max_sequence_length)

    def sample(self, table: str, n: int, timeout: float | None = None, fields: list[str] | None = None) -> Sample:
        n = as_int("n", n, 1)
        sizes = {}
        for i in self.live():
            try:
                sizes[i] = self._clients[i].info()[table]["size"]
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
                s = self._clients[i].sample(table, k, timeout=timeout, fields=fields)
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
        return {self.addresses[i]: self._clients[i].info() for i in self.live()}

    def close(self):
        for c in self._clients:
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
    """A writer that sends each episode to the next live server of a pool."""

    def __init__(self, pool: ClientPool, table: str | None, max_sequence_length: int | None):
        self._pool, self._table, self._msl = pool, table, max_sequence_length
        self._writers: dict[int, object] = {}
        self._server, self._w = self._open()

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
        """The address the current episode goes to."""
        return self._pool.addresses[self._server]

    @property
    def episode_steps(self) -> int:
        return self._w.episode_steps

    def append(self, step):
        self._w.append(step)

    def extend(self, steps):
        self._w.extend(steps)

    def create_item(self, table, num_steps, priority, timeout=None):
        return self._w.create_item(table, num_steps, priority, timeout)

    def create_items(self, table, num_steps, priorities, timeout=None):
        return self._w.create_items(table, num_steps, priorities, timeout)

    def end_episode(self):
        """Ends the episode here; the next one goes to the next live server. A server
        that died during the episode is reported (the episode's items it had not
        committed are lost with it) and skipped."""
        try:
            self._w.end_episode()
            self._w.flush()
        except RepriseError as e:
            if not _unreachable(e):
                raise
            self._writers.pop(self._server, None)
            self._pool._mark_down(self._server, e)
        self._server, self._w = self._open()

    def flush(self, timeout=None):
        for i, w in list(self._writers.items()):
            try:
                w.flush(timeout)
            except RepriseError as e:
                if not _unreachable(e):
                    raise
                self._writers.pop(i, None)
                self._pool._mark_down(i, e)

    def close(self):
        for i, w in list(self._writers.items()):
            try:
                w.close()
            except RepriseError as e:
                if not _unreachable(e):
                    raise
                self._pool._mark_down(i, e)
        self._writers.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

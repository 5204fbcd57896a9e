"""The soak's client processes: ``python -m benchmarks.soak.clients ROLE SPEC_JSON``.

Roles (each a separate process, so that a SIGKILL takes one of them whole):

- ``writer``: ``rp.ClientPool([address]).writer(...)``; each round extends ``batch`` one-step
  items (field ``id`` = ``slot << 48 | incarnation << 32 | seq``, field ``payload`` = ``id``
  repeated as 4096 bytes), creates one item per step, then ``flush(timeout)``. Before the
  extend it writes a begin record ``B`` (the ids and the time); after the flush returns, a
  commit record ``C`` (its time). Both are written with ``os.write`` on an ``O_APPEND``
  descriptor, so a SIGKILL loses nothing that was written before it: an item present on
  the server always has its ``B`` line, and ``C`` means its flush returned.
- ``sampler``: ``pool.sample(table, n, timeout)``; checks every drawn item's payload against
  its id (``X`` records name a mismatch).
- ``updater``: samples ids only, then ``pool.update_priorities`` with random priorities.
- ``checkpointer``: ``client.checkpoint()`` every ``interval`` seconds, with a begin record
  (monotonic and wall-clock ns) and an end record (the returned path).
- ``stalled``: opens a sample stream (``iterate`` with ``max_in_flight`` 64), reads one batch,
  prints ``READY`` and never reads again; the driver then SIGSTOPs it, so not even its
  runtime reads the socket.

Every call is timed (``K kind start wait limit ok n error``); ``limit`` is the call's timeout, or
for a call that takes none (``update_priorities``, ``checkpoint``, a writer's
``extend``/``create_items``) the budget it is held to. A process ends at SIGTERM after the
call in progress. Times are ``time.monotonic()``: one clock for every process of the host.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

import numpy as np

PAYLOAD_BYTES = 4096


def payload_of(ids: np.ndarray) -> np.ndarray:
    """``[n, 4096]`` uint8: each row is its id (int64, little-endian) repeated 512 times."""
    ids = np.asarray(ids, "<i8")
    return np.repeat(ids[:, None], PAYLOAD_BYTES // 8, axis=1).view(np.uint8)


def payload_matches(ids: np.ndarray, payload: np.ndarray) -> np.ndarray:
    """Per row: whether ``payload`` ([n, 4096] uint8) is ``payload_of(ids)``."""
    words = np.ascontiguousarray(payload).reshape(len(ids), -1).view("<i8")
    return (words == np.asarray(ids, "<i8")[:, None]).all(axis=1)


class Records:
    """One line per event, appended with one ``os.write`` each (whole lines survive SIGKILL)."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, *fields) -> None:
        os.write(self._fd, (" ".join(str(f) for f in fields) + "\n").encode())

    def call(self, kind: str, start: float, limit: float, ok: bool, n: int = 0, error: BaseException | None = None):
        self.write("K", kind, f"{start:.6f}", f"{time.monotonic() - start:.6f}", limit, int(ok), n,
                   "-" if error is None else type(error).__name__)


class Role:
    def __init__(self, spec: dict):
        import reprise as rp
        self.rp = rp
        self.spec = spec
        self.table = spec["table"]
        self.rec = Records(spec["records"])
        self.stop = False
        self.lost = 0  # pool warnings "unreachable": the pool skipped the server
        signal.signal(signal.SIGTERM, self._on_term)
        role = self

        class Lost(logging.Handler):
            def emit(self, record):
                if "unreachable" in record.getMessage():
                    role.lost += 1

        logging.getLogger("reprise").addHandler(Lost())
        logging.getLogger("reprise").propagate = False

    def _on_term(self, *_):
        self.stop = True

    def pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stop and time.monotonic() < end:
            time.sleep(min(0.05, end - time.monotonic()))

    def pool(self):
        """A ``ClientPool`` of the one server, retried until it connects (or SIGTERM)."""
        s = self.spec
        while not self.stop:
            t0 = time.monotonic()
            try:
                pool = self.rp.ClientPool([s["address"]], token=s["token"], retry_after=s["retry_after"],
                                          connect_timeout=s["connect_timeout"])
                self.rec.call("connect", t0, s["connect_timeout"], True)
                return pool
            except self.rp.errors.RepriseError as e:
                self.rec.call("connect", t0, s["connect_timeout"], False, error=e)
                self.pause(0.2)
        return None


def writer(r: Role) -> None:
    s = r.spec
    rp, batch = r.rp, s["batch"]
    base = (s["slot"] << 48) | (s["incarnation"] << 32)
    rng = np.random.default_rng(s["seed"])
    pool = r.pool()
    w, seq = None, 0
    while not r.stop:
        if w is None:
            t0 = time.monotonic()
            try:
                w = pool.writer(r.table, max_sequence_length=batch)
                r.rec.call("open_writer", t0, s["timeout"], True)
            except rp.errors.RepriseError as e:
                r.rec.call("open_writer", t0, s["timeout"], False, error=e)
                r.pause(0.2)
                continue
        ids = base + np.arange(seq, seq + batch, dtype=np.int64)
        t0 = time.monotonic()
        r.rec.write("B", seq, batch, f"{t0:.6f}")
        lost = r.lost
        step = "write"
        try:
            w.extend({"id": ids, "payload": payload_of(ids)})
            w.create_items(r.table, 1, rng.uniform(0.1, 2.0, batch))
            t1 = time.monotonic()
            r.rec.call("write", t0, s["timeout"], True, batch)
            step = "flush"
            w.flush(timeout=s["timeout"])
            t2 = time.monotonic()
            r.rec.call("flush", t1, s["timeout"], True, batch)
            # A pool that lost the server says so on the logger and returns from flush.
            r.rec.write("C" if r.lost == lost else "L", seq, batch, f"{t2:.6f}")
        except rp.errors.RepriseError as e:
            r.rec.call(step, t0 if step == "write" else t1, s["timeout"], False, error=e)
            r.rec.write("F", seq, batch, f"{time.monotonic():.6f}", type(e).__name__)
            try:
                w.close()
            except rp.errors.RepriseError:
                pass  # its stream is gone (the server died): nothing to close
            w = None
            r.pause(0.2)
        seq += batch
    if w is not None:
        try:
            w.close()
        except rp.errors.RepriseError:
            pass
    if pool is not None:
        pool.close()


def sampler(r: Role, update: bool) -> None:
    s = r.spec
    rp, n = r.rp, s["batch"]
    rng = np.random.default_rng(s["seed"])
    pool = r.pool()
    fields = ["id"] if update else None
    while not r.stop:
        t0 = time.monotonic()
        try:
            got = pool.sample(r.table, n, timeout=s["timeout"], fields=fields)
        except rp.errors.RepriseError as e:
            r.rec.call("sample", t0, s["timeout"], False, error=e)
            r.pause(0.2)
            continue
        r.rec.call("sample", t0, s["timeout"], True, len(got))
        ids = got.data["id"].reshape(len(got))
        if not update:
            bad = ~payload_matches(ids, got.data["payload"])
            for i in np.flatnonzero(bad)[:10]:
                r.rec.write("X", int(ids[i]))
            continue
        t0 = time.monotonic()
        try:
            done = pool.update_priorities(r.table, got.keys, rng.uniform(0.1, 2.0, len(got)), servers=got.servers)
            r.rec.call("update", t0, s["timeout"], True, done)
        except rp.errors.RepriseError as e:
            r.rec.call("update", t0, s["timeout"], False, error=e)
            r.pause(0.2)
    if pool is not None:
        pool.close()


def checkpointer(r: Role) -> None:
    s = r.spec
    rp = r.rp
    client = None
    next_at = time.monotonic() + s["interval"]
    while not r.stop:
        if time.monotonic() < next_at:
            r.rec.write("H", f"{time.monotonic():.6f}")  # alive while it waits
            r.pause(min(1.0, next_at - time.monotonic()))
            continue
        t0 = time.monotonic()
        try:
            if client is None:
                client = rp.Client(s["address"], token=s["token"], connect_timeout=s["connect_timeout"])
            r.rec.write("CB", f"{t0:.6f}", time.time_ns())
            path = client.checkpoint()
            r.rec.call("checkpoint", t0, s["checkpoint_budget"], True)
            r.rec.write("CE", f"{time.monotonic():.6f}", path)
            next_at = t0 + s["interval"]
        except rp.errors.RepriseError as e:
            r.rec.call("checkpoint", t0, s["checkpoint_budget"], False, error=e)
            r.pause(0.5)
    if client is not None:
        client.close()


def stalled(r: Role) -> None:
    s = r.spec
    client = r.rp.Client(s["address"], token=s["token"], connect_timeout=s["connect_timeout"])
    it = client.iterate(r.table, s["batch"], max_in_flight=64, timeout=600.0)
    next(it)
    print("READY", flush=True)
    while not r.stop:
        time.sleep(0.5)  # never reads again (and is SIGSTOPped by the driver)


def main(argv: list[str]) -> int:
    role, spec = argv[0], json.loads(argv[1])
    r = Role(spec)
    if role == "writer":
        writer(r)
    elif role == "sampler":
        sampler(r, update=False)
    elif role == "updater":
        sampler(r, update=True)
    elif role == "checkpointer":
        checkpointer(r)
    elif role == "stalled":
        stalled(r)
    else:
        raise SystemExit(f"unknown role {role!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

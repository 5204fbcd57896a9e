"""Functions that processes spawned by test_serving.py run (importable: tests/ is on
sys.path, and spawned children get the parent's sys.path).

Every function here bounds its own waits, so a child never outlives its test by
long even when the parent dies before it can kill it."""

from __future__ import annotations

import json
import os
import random
import time

import numpy as np

import reprise as rp

# --- exact accounting: N writers, M samplers through one queue ---------------------------------

EPISODE = 10          # steps per episode of an accounting writer
QUEUE = "q"


def accounting_signature():
    return {
        "x": rp.Field((), "int64"),        # wid * 1_000_000 + step
        "w": rp.Field((), "int32"),        # wid
        "chk": rp.Field((3,), "float64"),  # (wid, step, wid * 7 + step * 3)
    }


def accounting_plan(wid: int, steps: int):
    """The items writer ``wid`` creates: ``(wid, last step, num_steps)`` after each step."""
    plan = []
    for i in range(steps):
        pos = i % EPISODE
        n = min(pos + 1, 1 + (i * 7 + wid) % 3)
        plan.append((wid, i, n))
    return plan


def accounting_writer(address: str, wid: int, steps: int):
    client = rp.Client(address)
    with client.writer(QUEUE) as w:
        for (_, i, n) in accounting_plan(wid, steps):
            w.append({
                "x": wid * 1_000_000 + i,
                "w": wid,
                "chk": np.array([wid, i, wid * 7 + i * 3], dtype=np.float64),
            })
            w.create_item(QUEUE, num_steps=n, priority=1.0)
            if i % 50 == 49:
                w.flush(timeout=20.0)
            if i % EPISODE == EPISODE - 1:
                w.end_episode()
        w.flush(timeout=20.0)


def check_accounting_item(x, w, chk, length):
    """The id ``(wid, last step, length)`` of a sampled item, or an error string."""
    x, w, chk = x[:length], w[:length], chk[:length]
    wid = int(w[0])
    steps = [int(v) - wid * 1_000_000 for v in x]
    if not (w == wid).all():
        return None, f"steps of several writers in one item: w={w.tolist()}"
    if steps != list(range(steps[0], steps[0] + length)):
        return None, f"steps not consecutive: {x.tolist()}"
    if steps[0] // EPISODE != steps[-1] // EPISODE:
        return None, f"item spans episodes: {steps}"
    want = np.array([[wid, s, wid * 7 + s * 3] for s in steps], dtype=np.float64)
    if not np.array_equal(chk, want):
        return None, f"chk rows torn: {chk.tolist()} vs {want.tolist()}"
    return (wid, steps[-1], length), None


def accounting_sampler(address: str, stop, out_path: str, batch: int, deadline_s: float):
    client = rp.Client(address)
    got, errors = [], []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            s = client.sample(QUEUE, batch, timeout=0.1)
        except rp.errors.Timeout as e:
            s = e.partial
        if s is None or len(s) == 0:
            if stop.is_set():
                break
            continue
        for j in range(len(s)):
            length = int(s.lengths[j])
            ident, err = check_accounting_item(s.data["x"][j], s.data["w"][j], s.data["chk"][j], length)
            if err:
                errors.append(err)
            else:
                got.append([int(s.keys[j]), *ident])
            if int(s.times_sampled[j]) != 1:
                errors.append(f"times_sampled {int(s.times_sampled[j])} for key {int(s.keys[j])}")
            # Rows past the item's length are zeros.
            if s.data["x"].shape[1] > length and (s.data["x"][j, length:] != 0).any():
                errors.append(f"padding is not zero: {s.data['x'][j].tolist()}")
    else:
        errors.append("sampler ran past its deadline")
    with open(out_path, "w") as f:
        json.dump({"got": got, "errors": errors}, f)


# --- SIGKILL of a writer at random points -------------------------------------------------------

KILL_TABLE = "t"


def kill_signature():
    return {
        "ep": rp.Field((), "int64"),
        "k": rp.Field((), "int64"),
        "v": rp.Field((8,), "int32"),   # every entry ep * 1000 + k (mod 2**31)
    }


def kill_step(ep: int, k: int):
    return {"ep": ep, "k": k, "v": np.full(8, (ep * 1000 + k) % (1 << 31), dtype=np.int32)}


def killable_writer(address: str, seed: int, started, attempted, committed, done, max_steps: int, flush_every: int):
    """Writes random episodes and items until killed (or ``max_steps``, then sets
    ``done`` and idles).

    ``started`` is set once the writer has appended its first step; ``attempted``
    counts the items it asked for (raised before each ``create_item``), ``committed``
    how many ``flush`` has confirmed so far. The counters are lock-free shared values:
    the parent must be able to read them after killing us at any point."""
    rng = random.Random(seed)
    client = rp.Client(address)
    w = client.writer(KILL_TABLE)
    created = 0
    steps = 0
    ep = seed * 100_000
    while steps < max_steps:
        ep += 1
        length = rng.randint(1, 24)
        for k in range(length):
            w.append(kill_step(ep, k))
            steps += 1
            if steps == 1:
                started.set()
            if rng.random() < 0.5:
                attempted.value = created + 1
                w.create_item(KILL_TABLE, num_steps=rng.randint(1, k + 1), priority=1.0 + rng.random())
                created += 1
            if rng.random() < 1.0 / flush_every:
                w.flush(timeout=10.0)
                committed.value = created
        if rng.random() < 0.7:
            w.end_episode()
    w.flush(timeout=10.0)
    committed.value = created
    done.value = 1
    time.sleep(30)  # the parent kills us long before


# --- a server in a child process -----------------------------------------------------------------

def serve_in_child(name, conn, capacity: int = 256, block_steps: int = 8, lifetime_s: float = 30.0):
    """Serves tables "replay" (Fifo sampler) and "queue" (a queue: its samples block
    while it is empty) over a store of field x: int64; sends ``(local_address, store
    path, pid)`` through ``conn``, then idles until killed."""
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=capacity, block_steps=block_steps)
    table = rp.Table("replay", store, sampler=rp.selectors.Fifo(), seed=0)
    queue = rp.Table.queue("queue", store, max_size=16)
    server = rp.Server([table, queue], name=name)
    conn.send((server.local_address, store.path, os.getpid()))
    conn.close()
    time.sleep(lifetime_s)
    server.stop()
    store.close()


# --- a process of another user --------------------------------------------------------------------

def foreign_user_attach(address: str, store_path: str, uid: int, conn):
    """Drops to ``uid`` and reports what it could reach: ``{"client": ..., "shm": ...}``,
    each "ok" or the exception's class name."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    report = {}
    try:
        rp.Client(address)
        report["client"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the parent
        report["client"] = f"{type(e).__name__}: {e}"
    try:
        with open(store_path, "rb") as f:
            f.read(1)
        report["shm"] = "ok"
    except Exception as e:  # noqa: BLE001
        report["shm"] = f"{type(e).__name__}: {e}"
    sock = address[len("unix://"):]
    try:
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(sock)
        s.close()
        report["socket"] = "ok"
    except Exception as e:  # noqa: BLE001
        report["socket"] = f"{type(e).__name__}: {e}"
    conn.send(report)
    conn.close()


# --- a writer that keeps evicting under readers -----------------------------------------------------

def evicting_writer(address: str, started, steps: int, row: int):
    """Episodes of 4 steps of ``row`` int64 values each equal to ``ep * 16 + k``; one item
    over the whole episode each time, so the small store keeps evicting and reusing blocks."""
    client = rp.Client(address)
    with client.writer("ring") as w:
        for ep in range(steps // 4):
            for k in range(4):
                w.append({"x": np.full(row, ep * 16 + k, dtype=np.int64)})
            w.create_item("ring", num_steps=4, priority=1.0)
            w.end_episode()
            if ep % 8 == 7:
                w.flush(timeout=10.0)
                started.set()
        w.flush(timeout=10.0)


# --- processes that die while the server waits for them -------------------------------------------

def blocked_sampler(address: str, table: str, ready):
    """Samples one item from the (empty) queue ``table`` with no timeout: blocks in the server."""
    client = rp.Client(address)
    ready.set()
    client.sample(table, 1)


def blocked_writer(address: str, steps: int, item_every: int):
    """One long episode into queue "q": an item over the last step every ``item_every``
    steps. Once the queue is full the server holds the writer's commit, and the writer
    blocks at its next lease."""
    client = rp.Client(address)
    w = client.writer("q")
    for i in range(steps):
        w.append({"x": i})
        if i % item_every == item_every - 1:
            w.create_item("q", num_steps=1, priority=1.0)
    w.flush(timeout=30.0)


def stop_without_socket(name: str, conn):
    """Starts a server, removes its socket file (as a /tmp cleaner or a racing server start
    would), then stops it; reports each stage through ``conn``."""
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=64, block_steps=8)
    server = rp.Server([rp.Table("t", store)], name=name)
    os.unlink(server.local_address[len("unix://"):])
    conn.send("started")
    server.stop()
    conn.send("stopped")
    store.close()


def race_starts(prefix: str, attempts: int, racers: int, conn):
    """Starts ``racers`` servers at once under the name of a dead server (a socket file nobody
    listens on), ``attempts`` times. Reports ``{"attempts", "winners", "errors", "serve_errors",
    "stop_hung"}``: how many servers started in each attempt, the losers' errors other than
    InvalidArgument naming the name, what went wrong when a client used the winner, and
    whether stopping a winner hung. Exits with os._exit (a hung stop keeps a thread)."""
    import socket
    import threading

    store = rp.Store({"x": rp.Field((), "int64")}, capacity=64, block_steps=8)
    table = rp.Table("t", store)
    report = {"attempts": 0, "winners": [], "errors": [], "serve_errors": [], "stop_hung": False}
    for i in range(attempts):
        name = f"{prefix}-{i}"
        probe = rp.Server([table], name=name)  # learn the path; then leave a dead server's socket
        path = probe.local_address[len("unix://"):]
        probe.stop()
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(path)
        dead.close()
        results = [None] * racers
        barrier = threading.Barrier(racers)

        def start(i):
            barrier.wait(5)
            try:
                results[i] = rp.Server([table], name=name)
            except Exception as e:  # noqa: BLE001 - reported
                results[i] = e

        threads = [threading.Thread(target=start, args=(i,), daemon=True) for i in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        report["attempts"] += 1
        servers = [r for r in results if isinstance(r, rp.Server)]
        report["winners"].append(len(servers))
        for r in results:
            if not isinstance(r, rp.Server) and not (isinstance(r, rp.errors.InvalidArgument) and name in str(r)):
                report["errors"].append(repr(r))
        if len(servers) == 1:  # the winner serves: a client reaches it at the name's socket
            try:
                assert servers[0].local_address == f"unix://{path}", servers[0].local_address
                inserts = table.info()["num_inserts"]
                with rp.Client(f"unix://{path}") as client:
                    assert client.tables == ["t"], client.tables
                    with client.writer("t") as w:
                        w.append({"x": i})
                        w.create_item("t", num_steps=1, priority=1.0)
                        w.flush(timeout=5.0)
                    assert client.info()["t"]["num_inserts"] == inserts + 1
            except Exception as e:  # noqa: BLE001 - reported
                report["serve_errors"].append(f"attempt {i}: {e!r}")
        for srv in servers:
            t = threading.Thread(target=srv.stop, daemon=True)
            t.start()
            t.join(3)
            report["stop_hung"] |= t.is_alive()
        if os.path.exists(path):
            os.unlink(path)
        if report["stop_hung"] or ((report["errors"] or report["serve_errors"]) and report["attempts"] >= 10):
            break
    conn.send(report)
    conn.close()
    store.close()
    os._exit(0)

"""Redis baseline of the serving comparison; run with benchmarks/.venvs/redis/bin/python:
``benchmarks/.venvs/redis/bin/python -m benchmarks.peers.redis_serving [--quick]`` (from the
repository root).

The in-network replay paper's baseline (Ape-X inspired, Python + Redis): actors pickle
their experiences and ``RPUSH`` them into a Redis list; a replay process pulls them
(``LPOP``), unpickles them into its local replay memory (numpy arrays + a sum tree),
and the learner samples from that memory locally. Here the replay memory is a
drain *thread* inside the learner/sampler process (the paper used a child process
of the learner; a thread lets the learner sample without another IPC hop), guarded
by one lock. This script starts its own ``redis-server`` on a free loopback port
(no persistence) and stops it at the end.

* writer1 step:  ``RPUSH key pickle(float32[k])`` per step; batch: one ``RPUSH`` of a
  pickled float32[256,k]. A replay process drains the list into a numpy ring and
  counts in Redis (``INCRBY``) what it has stored; the writer's end-of-round "flush"
  waits until every item it pushed has been stored.
* mixed: 4 such writers; the sampler process drains (thread) and samples 256 uniform
  rows from its ring. Inserted items/s counts items *stored in the ring* (sampleable);
  pushed items/s is reported too.
* apex: actors ``RPUSH`` one pickled batch (200 transitions + priorities + a timestamp);
  push latency is pickle + RPUSH. The learner's drain thread stores batches in a
  numpy ring and sum tree (priority**0.6); the learner samples 512 proportionally
  (stratified, as Ape-X/cpprb do), gathers the four fields, and sets 512 new
  priorities. ``commit_lag`` = push start until the batch is in the sum tree.

Writers back off while the Redis list holds more than 256 MiB (actors: 32 batches), so that
a drain slower than the pushes cannot exhaust memory; that wait is not part of the
push latency (it is reported as ``throttled_s``).
"""

from __future__ import annotations

import pickle
import shutil
import subprocess
import tempfile
import threading
import time

import numpy as np

from benchmarks.common.bench import Bench, package_versions
from benchmarks.common.payload import PriorityStream, payload, random_priorities
from benchmarks.common.processes import Group, free_port, stop_all
from benchmarks.common.timing import (Window, count_in_window, latencies_in_window,
                                      latency_stats, now, timed_rounds)
from benchmarks.serving.workloads import (APEX_ACTORS, APEX_FRAME, APEX_POOL, APEX_SAMPLE,
                                          N_WRITERS, PRIORITY_EXPONENT, SAMPLE_BATCH,
                                          STEPS_PER_CALL, apex_batches, apex_entry, apex_pool,
                                          apex_timing, make_config, mixed_entry, serving_bench,
                                          serving_suite, writer1_entry, writer_capacity)

KEY = b"exp"
DRAINED = b"drained"
STOP = b"STOP"
QUEUE_BYTES = 256 * (1 << 20)   # writers wait while the list holds more than this
APEX_MAX_QUEUED = 32             # Ape-X batches (11 MB each) in the list before actors wait


def connect(port: int):
    import redis
    return redis.Redis(host="127.0.0.1", port=port)


# --- redis-server ----------------------------------------------------------------------------
class RedisServer:
    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found (apt-get install redis-server)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-bench-")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "yes", "--dir", self.dir,
             "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = connect(self.port)
        for _ in range(200):
            try:
                if r.ping():
                    break
            except Exception:
                time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError("redis-server did not answer PING")
        self.version = r.info()["redis_version"]

    def flush(self) -> None:
        connect(self.port).flushall()

    def rss_mib(self) -> float:
        return connect(self.port).info("memory")["used_memory_rss"] / 2**20

    def stop(self) -> None:
        stop_all([self.proc], 20)
        shutil.rmtree(self.dir, ignore_errors=True)


# --- a local ring that a drain thread fills ------------------------------------------------
class Ring:
    """Replay memory of one float32 field: rows [capacity, floats], FIFO overwrite."""

    def __init__(self, capacity: int, floats: int) -> None:
        self.x = np.zeros((capacity, floats), np.float32)
        self.x[:] = 1.0  # touch every page
        self.cap = capacity
        self.pos = 0
        self.size = 0
        self.lock = threading.Lock()

    def put(self, rows: np.ndarray) -> None:
        n = len(rows)
        with self.lock:
            end = self.pos + n
            if end <= self.cap:
                self.x[self.pos:end] = rows
            else:
                k = self.cap - self.pos
                self.x[self.pos:] = rows[:k]
                self.x[:n - k] = rows[k:]
            self.pos = end % self.cap
            self.size = min(self.cap, self.size + n)

    def sample(self, n: int, rng) -> np.ndarray:
        with self.lock:
            return self.x[rng.integers(0, self.size, n)]


def drain(r, store_rows, stop: threading.Event | None, count_key: bool, stops_expected: int = 0):
    """Pull elements off the list and store them until ``stop`` is set (or, with
    ``stops_expected``, until that many STOP sentinels came). Returns items stored."""
    stored = 0
    stops = 0
    while stop is None or not stop.is_set():
        got = r.lpop(KEY, 64)
        if not got:
            b = r.blpop([KEY], timeout=0.05)
            if b is None:
                continue
            got = [b[1]]
        n = 0
        for raw in got:
            if raw == STOP:
                stops += 1
                continue
            rows = pickle.loads(raw)
            if rows.ndim == 1:
                rows = rows[None]
            store_rows(rows)
            n += len(rows)
        stored += n
        if count_key and n:
            r.incrby(DRAINED, n)
        if stops_expected and stops >= stops_expected:
            break
    return stored


# --- child processes -----------------------------------------------------------------------
def make_push(r, rows: np.ndarray, variant: str):
    """A call that pushes STEPS_PER_CALL items; returns pushes and list length.
    ``state["until"]`` (a clock time), once set, ends any wait for room: after a
    measurement window nothing may drain the list any more."""
    element = rows[0].nbytes if variant == "step" else rows.nbytes
    limit = max(2, QUEUE_BYTES // element)
    state = {"len": 0, "throttled": 0.0, "until": float("inf")}

    def wait_room() -> None:
        if state["len"] > limit:
            t = now()
            while r.llen(KEY) > limit // 2 and now() < state["until"]:
                time.sleep(0.001)
            state["throttled"] += now() - t
            state["len"] = 0

    if variant == "step":
        steps = list(rows)

        def call() -> None:
            rpush = r.rpush
            for a in steps:
                state["len"] = rpush(KEY, pickle.dumps(a, protocol=5))
            wait_room()
    else:
        def call() -> None:
            state["len"] = r.rpush(KEY, pickle.dumps(rows, protocol=5))
            wait_room()
    return call, state


def writer1_child(port: int, floats: int, variant: str, capacity: int, quick: bool):
    cfg = make_config(quick, None)
    r = connect(port)
    call, state = make_push(r, payload(STEPS_PER_CALL, floats), variant)
    pushed = {"n": 0}

    def counted() -> None:
        call()
        pushed["n"] += STEPS_PER_CALL

    def flush() -> None:  # until the replay process has stored all we pushed
        while int(r.get(DRAINED) or 0) < pushed["n"]:
            time.sleep(0.0005)

    def run(_start):
        # the replay process drains only once every process has started: warm up here
        # (its ring is already touched; wrap it once only if that takes < 3 s)
        t_end = now() + 3.0
        for _ in range(-(-capacity // STEPS_PER_CALL) + 1):
            counted()
            if now() > t_end:
                break
        flush()
        rates = timed_rounds(counted, STEPS_PER_CALL, cfg, flush=flush)
        r.rpush(KEY, STOP)
        return {"rates": rates, "throttled_s": state["throttled"]}
    return run


def replay1_child(port: int, capacity: int, floats: int):
    r = connect(port)
    ring = Ring(capacity, floats)

    def run(_start):
        stored = drain(r, ring.put, None, count_key=True, stops_expected=1)
        return {"stored": stored}
    return run


def mixed_writer_child(port: int, variant: str, seed: int, warmup: float, seconds: float):
    r = connect(port)
    call, state = make_push(r, payload(STEPS_PER_CALL, 100, seed), variant)

    def run(start):
        win = Window(start, warmup, seconds)
        state["until"] = win.end   # the sampler stops draining when the window ends
        out = count_in_window(win, call, STEPS_PER_CALL)
        out["throttled_s"] = state["throttled"]
        return out
    return run


def mixed_sampler_child(port: int, capacity: int, warmup: float, seconds: float):
    r = connect(port)
    ring = Ring(capacity, 100)
    src = payload(4096, 100)
    for start in range(0, capacity, 4096):  # prefilled, like every system's table
        ring.put(src[:min(4096, capacity - start)])
    rng = np.random.default_rng(5)

    def run(start):
        win = Window(start, warmup, seconds)
        stop = threading.Event()
        counts = {"in_window": 0}

        def store_rows(rows):
            ring.put(rows)
            if win.begin <= now() <= win.end:
                counts["in_window"] += len(rows)

        t = threading.Thread(target=lambda: counts.__setitem__(
            "total", drain(r, store_rows, stop, count_key=False)), daemon=True)
        t.start()
        out = count_in_window(win, lambda: ring.sample(SAMPLE_BATCH, rng), SAMPLE_BATCH)
        stop.set()
        t.join()
        out["stored_in_window"] = counts["in_window"]
        out["stored_per_s"] = counts["in_window"] / seconds
        out["backlog_at_end"] = r.llen(KEY)
        return out
    return run


class SumTree:
    """Sum tree over ``capacity`` leaves in numpy (vectorised over a batch)."""

    def __init__(self, capacity: int) -> None:
        size = 1
        while size < capacity:
            size *= 2
        self.size = size
        self.cap = capacity
        self.t = np.zeros(2 * size, np.float64)

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        i = np.asarray(idx, np.int64) + self.size
        self.t[i] = values
        i = np.unique(i // 2)
        while i[0] >= 1:
            self.t[i] = self.t[2 * i] + self.t[2 * i + 1]
            if i[0] == 1:
                break
            i = np.unique(i // 2)

    def sample(self, n: int, rng) -> np.ndarray:
        total = self.t[1]
        u = (np.arange(n) + rng.random(n)) * (total / n)   # stratified
        u = np.minimum(u, total * (1 - 1e-12))
        i = np.ones(n, np.int64)
        while i[0] < self.size:
            left = self.t[2 * i]
            right = u > left
            u = np.where(right, u - left, u)
            i = 2 * i + right
        return np.minimum(i - self.size, self.cap - 1)


class ApexMemory:
    """The baseline's replay memory: numpy columns + a numpy sum tree, FIFO overwrite (also the
    placement benchmark's Redis-side replay, with its own frame)."""

    def __init__(self, capacity: int, frame: tuple = APEX_FRAME) -> None:
        self.cap = capacity
        self.cols = {"state": np.zeros((capacity, *frame), np.uint8),
                     "next_state": np.zeros((capacity, *frame), np.uint8),
                     "action": np.zeros(capacity, np.int64),
                     "reward": np.zeros(capacity, np.float32)}
        self.tree = SumTree(capacity)
        self.pos = 0
        self.size = 0
        self.stored = 0
        self.lock = threading.Lock()

    def put(self, cols: dict, prios: np.ndarray) -> None:
        n = len(prios)
        idx = (self.pos + np.arange(n)) % self.cap
        with self.lock:
            if self.pos + n <= self.cap:
                for f, v in cols.items():
                    self.cols[f][self.pos:self.pos + n] = v
            else:
                for f, v in cols.items():
                    self.cols[f][idx] = v
            self.tree.set(idx, np.asarray(prios, np.float64) ** PRIORITY_EXPONENT)
            self.pos = (self.pos + n) % self.cap
            self.size = min(self.cap, self.size + n)
            self.stored += n

    def sample(self, n: int, rng):
        with self.lock:
            idx = self.tree.sample(n, rng)
            data = {f: v[idx] for f, v in self.cols.items()}
        return idx, data

    def update(self, idx: np.ndarray, prios: np.ndarray) -> None:
        with self.lock:
            self.tree.set(idx, np.asarray(prios, np.float64) ** PRIORITY_EXPONENT)


def apex_actor_child(port: int, seed: int, warmup: float, seconds: float, timing: tuple):
    r = connect(port)
    batches = apex_batches(apex_pool(APEX_POOL, seed), seed)
    limit = APEX_MAX_QUEUED

    def push() -> int:
        cols, prios = next(batches)
        blob = pickle.dumps({"t": now(), "cols": cols, "prios": prios}, protocol=5)
        return r.rpush(KEY, blob)

    r.rpush(b"warm", b"x")

    def run(start):
        win = Window(start, warmup, seconds)
        throttled = [0.0]

        def guard(length: int) -> None:   # the list too long: wait, outside the push's latency
            if length > limit:
                t = now()
                while r.llen(KEY) > limit // 2 and now() < win.end:
                    time.sleep(0.001)
                throttled[0] += now() - t

        lat = latencies_in_window(win, push, *timing, after=guard)
        return {"lat": lat, "seconds": seconds, "throttled_s": throttled[0]}
    return run


def apex_learner_child(port: int, capacity: int, warmup: float, seconds: float, timing: tuple):
    r = connect(port)
    mem = ApexMemory(capacity)
    pool = apex_pool(1024, 99)
    prios = random_priorities(capacity, 98)
    for start in range(0, capacity, 1024):   # prefilled, like every system's table
        k = min(1024, capacity - start)
        mem.put({f: v[:k] for f, v in pool.items()}, prios[start:start + k])
    del pool
    rng = np.random.default_rng(7)
    new = PriorityStream(APEX_SAMPLE)

    def round_() -> None:
        idx, data = mem.sample(APEX_SAMPLE, rng)
        assert data["state"].shape == (APEX_SAMPLE, *APEX_FRAME)
        mem.update(idx, new.next())

    round_()

    def run(start):
        win = Window(start, warmup, seconds)
        stop = threading.Event()
        lags: list[float] = []

        def drain_apex() -> None:
            while not stop.is_set():
                b = r.blpop([KEY], timeout=0.05)
                if b is None:
                    continue
                obj = pickle.loads(b[1])
                mem.put(obj["cols"], obj["prios"])
                if obj["t"] >= win.begin and now() <= win.end:
                    lags.append(now() - obj["t"])

        t = threading.Thread(target=drain_apex, daemon=True)
        t.start()
        lat = latencies_in_window(win, round_, *timing)
        stop.set()
        t.join()
        return {"lat": lat, "seconds": seconds, "commit_lag": latency_stats(lags),
                "backlog_at_end": r.llen(KEY), "table_items": mem.size}
    return run


# --- workloads ----------------------------------------------------------------------------
class RedisBaseline:
    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.cfg = bench.cfg
        self.server = RedisServer()
        bench.versions["redis-server"] = self.server.version

    def close(self) -> None:
        self.server.stop()

    def writer1(self, size: int, variant: str) -> dict:
        cfg = self.cfg
        floats = size // 4
        cap = writer_capacity(cfg, size)
        self.server.flush()
        g = Group(cfg)
        g.add("replay", replay1_child, self.server.port, cap, floats)
        g.add("writer", writer1_child, self.server.port, floats, variant, cap, cfg.quick)
        res = g.run()
        rss = self.server.rss_mib()
        self.server.flush()
        path = ("RPUSH pickle(float32[k]) per step" if variant == "step"
                else "RPUSH pickle(float32[256,k]) per call")
        return writer1_entry(res["writer"]["rates"], size,
                             path + "; replay process LPOPs into a numpy ring; a round ends "
                             "when the replay process has stored every pushed item",
                             throttled_s=res["writer"]["throttled_s"], redis_rss_mib=rss)

    def mixed(self, variant: str) -> dict:
        cfg = self.cfg
        self.server.flush()
        g = Group(cfg)
        for i in range(N_WRITERS):
            g.add(f"writer{i}", mixed_writer_child, self.server.port, variant, 10 + i,
                  cfg.mixed_warmup_seconds, cfg.mixed_seconds)
        g.add("sampler", mixed_sampler_child, self.server.port, cfg.mixed_table_items,
              cfg.mixed_warmup_seconds, cfg.mixed_seconds)
        res = g.run()
        self.server.flush()
        e = mixed_entry(res, f"4 writers RPUSH ({variant}); sampler process: drain thread "
                             "LPOP -> numpy ring, main thread samples 256 uniform rows",
                        pushed_items_per_s=sum(v["per_s"] for k, v in res.items()
                                               if k.startswith("writer")),
                        throttled_s=[v["throttled_s"] for k, v in res.items()
                                     if k.startswith("writer")],
                        backlog_at_end=res["sampler"]["backlog_at_end"])
        e["items_per_s"] = res["sampler"]["stored_per_s"]  # stored (sampleable), not pushed
        return e

    def apex(self, variant: str) -> dict:
        cfg = self.cfg
        self.server.flush()
        g = Group(cfg)
        g.add("learner", apex_learner_child, self.server.port, cfg.apex_table_items,
              cfg.apex_warmup_seconds, cfg.apex_seconds, apex_timing(variant, "learner"))
        for i in range(APEX_ACTORS):
            g.add(f"actor{i}", apex_actor_child, self.server.port, 20 + i,
                  cfg.apex_warmup_seconds, cfg.apex_seconds, apex_timing(variant, "actor", i))
        res = g.run()
        rss = self.server.rss_mib()
        self.server.flush()
        return apex_entry(res, "actor: pickle.dumps(batch of 200, protocol 5) + RPUSH; learner "
                               "process: drain thread BLPOP -> numpy arrays + numpy sum tree, "
                               "learner samples 512 locally + sets 512 priorities",
                          redis_rss_mib=rss)


def main() -> None:
    bench = serving_bench("redis")
    bench.versions.update(package_versions("redis", "hiredis"))
    s = RedisBaseline(bench)
    bench.notes.append(f"redis-server {s.server.version} started by this script on "
                       f"127.0.0.1:{s.server.port} (no persistence), stopped at the end")
    try:
        serving_suite(bench, s)
    finally:
        s.close()
    bench.finish()


if __name__ == "__main__":
    main()

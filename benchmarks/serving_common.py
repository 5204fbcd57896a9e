"""Shared harness for the serving comparison (``compare_serving.py``).

Every system script (``reprise_serving.py``, ``peers/*_serving.py``) runs in its own
interpreter (the peers in their own venvs) and starts its own processes: a server
(where the system has one), writer/actor processes and a sampler/learner process,
all started with the ``spawn`` method so each is a fresh interpreter as in a real
deployment. This module owns what must be identical across systems: item sizes,
table sizes, batch sizes, payloads, durations, how rounds and windows are timed,
percentiles, and the JSON layout. It depends on numpy and the standard library only.

Workloads (keys of ``results``):
  writer1[SIZE,VARIANT]   one writer process, nothing else running:  items/s, GB/s
                          VARIANT "step": one step + one item per call (an actor loop)
                                  "batch": the system's batched path (256 per call)
  mixed[VARIANT]          4 writer processes (400 B items) + 1 sampler process (uniform
                          batches of 256) at once: aggregate items/s and samples/s
  apex                    4 actor processes push batches of 200 Atari transitions with
                          priorities; a learner samples 512 (Prioritized(0.6)) and
                          updates their 512 priorities: latency p50/p99 of both
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue as queue_mod
import statistics
import sys
import time
import traceback
from dataclasses import dataclass

import numpy as np

from bench_common import MiB, PriorityStream  # noqa: F401  (one copy for both harnesses)

WRITER_SIZES = [("400B", 400), ("400KB", 400_000)]
STEPS_PER_CALL = 256           # writer1/mixed: steps between clock checks / one batched call
SAMPLE_BATCH = 256             # mixed: uniform sample size
N_WRITERS = 4                  # mixed
PRIORITY_EXPONENT = 0.6
IMPORTANCE_BETA = 0.4          # only for systems whose prioritized sample requires it

# Ape-X (the in-network replay paper's setup, Atari DQN transitions)
APEX_ACTORS = 4
APEX_PUSH = 200                # transitions per actor push
APEX_SAMPLE = 512              # learner batch
APEX_FRAME = (4, 84, 84)       # uint8 state and next_state
APEX_TRANSITION_BYTES = 2 * int(np.prod(APEX_FRAME)) + 8 + 4   # 56,460 B
APEX_POOL = 1024               # distinct random transitions an actor cycles through
APEX_VARIANTS = ["apex", "apex-paced"]   # actors and learner back to back / paced
APEX_ACTOR_PERIOD = 0.4        # apex-paced: one push per actor every 0.4 s (2,000 transitions/s in all)
APEX_LEARNER_PERIOD = 0.05     # apex-paced: one learner round every 50 ms (at most 20/s)


@dataclass
class Config:
    quick: bool
    rounds: int
    round_seconds: float
    warmup_seconds: float          # writer1: after the ring has wrapped once
    writer_table_bytes: int
    writer_table_max_items: int
    mixed_table_items: int
    mixed_warmup_seconds: float
    mixed_seconds: float
    apex_table_items: int
    apex_warmup_seconds: float
    apex_seconds: float
    budget_seconds: float
    start_timeout: float = 120.0   # processes to import and get ready

    def writer_capacity(self, size: int) -> int:
        return max(2 * STEPS_PER_CALL, min(self.writer_table_max_items,
                                           self.writer_table_bytes // size))

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["writer_capacity_items"] = {lbl: self.writer_capacity(s) for lbl, s in WRITER_SIZES}
        d["apex"] = {"actors": APEX_ACTORS, "push": APEX_PUSH, "sample": APEX_SAMPLE,
                     "frame": list(APEX_FRAME), "transition_bytes": APEX_TRANSITION_BYTES,
                     "push_mb": APEX_PUSH * APEX_TRANSITION_BYTES / 1e6,
                     "priority_exponent": PRIORITY_EXPONENT,
                     "paced_actor_period_s": APEX_ACTOR_PERIOD,
                     "paced_learner_period_s": APEX_LEARNER_PERIOD}
        d["mixed"] = {"writers": N_WRITERS, "item_bytes": 400, "sample_batch": SAMPLE_BATCH}
        return d


def make_config(quick: bool, budget: float | None) -> Config:
    if quick:
        return Config(quick=True, rounds=3, round_seconds=0.1, warmup_seconds=0.05,
                      writer_table_bytes=16 * MiB, writer_table_max_items=4_096,
                      mixed_table_items=4_096, mixed_warmup_seconds=0.3, mixed_seconds=1.0,
                      apex_table_items=2_000, apex_warmup_seconds=0.5, apex_seconds=2.0,
                      budget_seconds=budget or 120.0)
    return Config(quick=False, rounds=7, round_seconds=0.4, warmup_seconds=0.3,
                  writer_table_bytes=512 * MiB, writer_table_max_items=100_000,
                  mixed_table_items=100_000, mixed_warmup_seconds=1.0, mixed_seconds=4.0,
                  apex_table_items=50_000, apex_warmup_seconds=3.0, apex_seconds=15.0,
                  budget_seconds=budget or 240.0)


# --- payloads -----------------------------------------------------------------------------
def payload(n: int, floats: int, seed: int = 0) -> np.ndarray:
    """float32[n, floats] random normals: compression cannot help anyone."""
    return np.random.default_rng(seed).standard_normal((n, floats), dtype=np.float32)


def apex_pool(n: int, seed: int) -> dict:
    """n random Atari transitions as columns: state/next_state uint8[n,4,84,84],
    action int64[n], reward float32[n]; random bytes, so nothing compresses."""
    rng = np.random.default_rng(seed)
    return {
        "state": rng.integers(0, 256, (n, *APEX_FRAME), dtype=np.uint8),
        "next_state": rng.integers(0, 256, (n, *APEX_FRAME), dtype=np.uint8),
        "action": rng.integers(0, 18, n, dtype=np.int64),
        "reward": rng.standard_normal(n, dtype=np.float32),
    }


def apex_priorities(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random(n) * 10.0 + 0.01).astype(np.float64)


def apex_batches(pool: dict, seed: int):
    """Endless (columns, priorities) batches of APEX_PUSH transitions cut from pool
    (contiguous slices: no copy) with fresh priorities each time."""
    n = len(pool["action"])
    prios = apex_priorities(APEX_PUSH * 64, seed)
    i = 0
    while True:
        start = (i * APEX_PUSH) % (n - APEX_PUSH + 1)
        cols = {k: v[start:start + APEX_PUSH] for k, v in pool.items()}
        j = i % 64
        yield cols, prios[j * APEX_PUSH:(j + 1) * APEX_PUSH]
        i += 1


# --- timing -------------------------------------------------------------------------------
def now() -> float:
    """CLOCK_MONOTONIC: one clock for every process on this host."""
    return time.monotonic()


def timed_rounds(call, flush, units_per_call: int, cfg: Config) -> list[float]:
    """writer1: warm-up, then ``cfg.rounds`` rounds of calls for >= round_seconds each,
    every round ending with ``flush()`` (inside the timed span): units/s per round."""
    t_end = now() + cfg.warmup_seconds
    n = 0
    while n < 2 or now() < t_end:
        call()
        n += 1
    flush()
    rates = []
    for _ in range(cfg.rounds):
        calls = 0
        t0 = now()
        deadline = t0 + cfg.round_seconds
        while calls < 2 or now() < deadline:
            call()
            calls += 1
        flush()
        rates.append(calls * units_per_call / (now() - t0))
    return rates


@dataclass
class Window:
    """The measured span of a concurrent run: every process starts at ``start``,
    warms up for ``warmup`` seconds, and counts what it finishes inside
    [start + warmup, start + warmup + duration]."""

    start: float
    warmup: float
    duration: float

    @property
    def begin(self) -> float:
        return self.start + self.warmup

    @property
    def end(self) -> float:
        return self.start + self.warmup + self.duration

    def wait_start(self) -> None:
        d = self.start - now()
        if d > 0:
            time.sleep(d)


def count_in_window(win: Window, call, units_per_call: int) -> dict:
    """Call repeatedly from win.start until win.end; count units of calls that
    finished inside the window."""
    win.wait_start()
    counted = 0
    calls = 0
    while True:
        t = now()
        if t >= win.end:
            break
        call()
        calls += 1
        done = now()
        if win.begin <= done <= win.end:
            counted += units_per_call
    return {"units": counted, "calls": calls, "seconds": win.duration,
            "per_s": counted / win.duration}


def latencies_in_window(win: Window, call, period: float = 0.0, phase: float = 0.0) -> list[float]:
    """Call from win.start until win.end, back to back (``period`` 0) or once every
    ``period`` seconds starting at ``phase`` (a call that overruns its slot is
    followed at once by the next, with no catching up); latency (s) of each call that
    began after warm-up and finished inside the window."""
    win.wait_start()
    lat = []
    next_t = win.start + phase
    while True:
        if period:
            d = next_t - now()
            if d > 0:
                time.sleep(d)
        t0 = now()
        if t0 >= win.end:
            break
        call()
        t1 = now()
        if t0 >= win.begin and t1 <= win.end:
            lat.append(t1 - t0)
        if period:
            next_t = max(next_t + period, t1)
    return lat


def latency_run(call, warmup: float, seconds: float, timing: tuple, after=None):
    """The ``run(start)`` of an Ape-X actor or learner child: latencies of ``call``
    in the window (see :func:`latencies_in_window`, ``timing`` = (period, phase)),
    then ``after()`` if given (e.g. closing a writer)."""
    def run(start):
        lat = latencies_in_window(Window(start, warmup, seconds), call, *timing)
        if after is not None:
            after()
        return {"lat": lat, "seconds": seconds}
    return run


def apex_timing(variant: str, role: str, index: int = 0) -> tuple[float, float]:
    """(period, phase) of an Ape-X actor or learner: back to back for ``apex``; for
    ``apex-paced`` actors push every APEX_ACTOR_PERIOD s (staggered) and the learner
    starts a round every APEX_LEARNER_PERIOD s."""
    if variant != "apex-paced":
        return 0.0, 0.0
    if role == "actor":
        return APEX_ACTOR_PERIOD, index * APEX_ACTOR_PERIOD / APEX_ACTORS
    return APEX_LEARNER_PERIOD, 0.0


def latency_stats(lat_s: list[float]) -> dict:
    if not lat_s:
        return {"n": 0}
    a = np.sort(np.asarray(lat_s)) * 1e3
    return {"n": int(a.size), "p50_ms": float(np.percentile(a, 50)),
            "p90_ms": float(np.percentile(a, 90)), "p99_ms": float(np.percentile(a, 99)),
            "mean_ms": float(a.mean()), "max_ms": float(a[-1])}


# --- processes ----------------------------------------------------------------------------
def mp_context():
    import multiprocessing as mp
    return mp.get_context("spawn")


def child_entry(fn, args, q, ready, go, start_value, role):
    """Target of every child process: set up (``fn`` returns a callable that runs
    the timed part given the Window), say ready, wait for go, run, report."""
    try:
        run = fn(*args)
        q.put((role, "ready", None))
        go.wait()
        win_start = start_value.value
        out = run(win_start)
        q.put((role, "result", out))
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        q.put((role, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class Group:
    """Spawned child processes that set up, wait for one common start time, run, and
    report one result each (see :func:`child_entry`)."""

    def __init__(self, cfg: Config, log) -> None:
        self.ctx = mp_context()
        self.cfg = cfg
        self.log = log
        self.q = self.ctx.Queue()
        self.ready = self.ctx.Event()
        self.go = self.ctx.Event()
        self.start_value = self.ctx.Value("d", 0.0)
        self.procs: dict[str, object] = {}

    def add(self, role: str, fn, *args) -> None:
        p = self.ctx.Process(target=child_entry, name=role,
                             args=(fn, args, self.q, self.ready, self.go, self.start_value, role),
                             daemon=True)
        p.start()
        self.procs[role] = p

    def run(self, lead_s: float = 0.2, timeout: float | None = None) -> dict:
        """Wait until every child is ready, start them all at now()+lead_s, collect
        results. Raises RuntimeError with the child's traceback if one fails."""
        cfg = self.cfg
        pending = set(self.procs)
        deadline = now() + cfg.start_timeout
        while pending:
            role, kind, payload_ = self._get(deadline, "getting ready", pending)
            if kind == "error":
                self.kill()
                raise RuntimeError(f"{role} failed while setting up: {payload_}")
            pending.discard(role)
        self.start_value.value = now() + lead_s
        self.go.set()
        results: dict[str, object] = {}
        pending = set(self.procs)
        deadline = now() + (timeout or 600.0)
        while pending:
            role, kind, payload_ = self._get(deadline, "running", pending)
            if kind == "error":
                self.kill()
                raise RuntimeError(f"{role} failed: {payload_}")
            results[role] = payload_
            pending.discard(role)
        for p in self.procs.values():
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        return results

    def _get(self, deadline: float, what: str, pending: set):
        while True:
            try:
                return self.q.get(timeout=1.0)
            except queue_mod.Empty:
                dead = [r for r in pending if not self.procs[r].is_alive()]
                if dead:
                    codes = {r: self.procs[r].exitcode for r in dead}
                    self.kill()
                    raise RuntimeError(f"{what}: process(es) died without reporting: {codes}")
                if now() > deadline:
                    self.kill()
                    raise RuntimeError(f"{what}: timed out waiting for {sorted(pending)}")

    def kill(self) -> None:
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
        for p in self.procs.values():
            p.join(timeout=10)


# --- one system's run ---------------------------------------------------------------------
class Bench:
    """Collects one system's results and prints its JSON object on stdout."""

    def __init__(self, system: str) -> None:
        ap = argparse.ArgumentParser(description=f"{system} serving benchmark")
        ap.add_argument("--quick", action="store_true",
                        help="tiny tables and short runs: checks the script, numbers are noise")
        ap.add_argument("--budget", type=float, default=None,
                        help="seconds for this system; workloads past it are skipped")
        ap.add_argument("--only", default=None,
                        help="comma-separated substrings: run only workloads whose key contains one")
        self.args = ap.parse_args()
        self.cfg = make_config(self.args.quick, self.args.budget)
        self.system = system
        self.t0 = time.perf_counter()
        self.results: dict[str, dict] = {}
        self.notes: list[str] = []
        self.versions = {"numpy": np.__version__, "python": platform.python_version()}
        self.only = [s for s in (self.args.only or "").split(",") if s]

    def log(self, msg: str) -> None:
        print(f"[{self.system} {self.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def wanted(self, key: str) -> bool:
        return not self.only or any(s in key for s in self.only)

    def run(self, key: str, fn, *args) -> None:
        """``fn(*args)`` returns the result dict of one workload (or raises)."""
        if not self.wanted(key):
            return
        if self.elapsed() > self.cfg.budget_seconds:
            self.results[key] = {"skipped": f"time budget {self.cfg.budget_seconds:.0f}s spent"}
            self.log(f"{key}: skipped (budget)")
            return
        t = time.perf_counter()
        try:
            entry = fn(*args)
        except Unsupported as exc:
            self.results[key] = {"unsupported": str(exc)}
            self.log(f"{key}: not supported: {exc}")
            return
        except Exception as exc:
            self.results[key] = {"error": f"{type(exc).__name__}: {exc}"}
            self.log(f"{key}: FAILED: {type(exc).__name__}: {exc}")
            return
        entry["wall_s"] = round(time.perf_counter() - t, 1)
        self.results[key] = entry
        self.log(f"{key}: {summarize(entry)}")

    def cannot(self, key: str, why: str) -> None:
        if self.wanted(key):
            self.results[key] = {"unsupported": why}

    def finish(self) -> None:
        out = {"system": self.system, "versions": self.versions, "quick": self.cfg.quick,
               "config": self.cfg.as_dict(),
               "host": {"cpus": os.cpu_count(), "platform": platform.platform()},
               "elapsed_s": round(self.elapsed(), 2), "notes": self.notes,
               "results": self.results}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


class Unsupported(Exception):
    """A workload this system cannot do (the table says so)."""


def summarize(e: dict) -> str:
    parts = []
    if "items_per_s" in e:
        parts.append(f"{e['items_per_s']:,.0f} items/s")
    if "gb_per_s" in e:
        parts.append(f"{e['gb_per_s']:.3f} GB/s")
    if "samples_per_s" in e:
        parts.append(f"{e['samples_per_s']:,.0f} samples/s")
    for k in ("push", "sample"):
        if k in e and e[k].get("n"):
            parts.append(f"{k} p50 {e[k]['p50_ms']:.2f} ms p99 {e[k]['p99_ms']:.2f} ms "
                         f"(n={e[k]['n']})")
    return ", ".join(parts) or json.dumps(e)[:200]


def writer1_entry(rates: list[float], item_bytes: int, path: str, **extra) -> dict:
    med = statistics.median(rates)
    e = {"items_per_s": med, "gb_per_s": med * item_bytes / 1e9, "item_bytes": item_bytes,
         "rounds": rates, "path": path}
    e.update(extra)
    return e


def mixed_entry(results: dict, path: str, **extra) -> dict:
    writers = [v for k, v in results.items() if k.startswith("writer")]
    sampler = results["sampler"]
    e = {"items_per_s": sum(w["per_s"] for w in writers),
         "per_writer_items_per_s": [w["per_s"] for w in writers],
         "samples_per_s": sampler["per_s"], "sampler": sampler, "path": path}
    e.update(extra)
    return e


def apex_entry(results: dict, path: str, **extra) -> dict:
    push = [x for k, v in results.items() if k.startswith("actor") for x in v["lat"]]
    learner = results["learner"]
    pushes_per_s = len(push) / results["actor0"]["seconds"] if push else 0.0  # in the window
    e = {"push": latency_stats(push), "sample": latency_stats(learner["lat"]),
         "transitions_per_s": pushes_per_s * APEX_PUSH,
         "learner_rounds_per_s": len(learner["lat"]) / learner["seconds"],
         "path": path}
    for k, v in results.items():  # anything else a child reported
        for kk, vv in v.items():
            if kk not in ("lat", "seconds"):
                e.setdefault(f"{k}_{kk}", vv)
    e.update(extra)
    return e

"""Shared harness for the core comparison (``compare_core.py``).

Every system script (``reprise_bench.py``, ``peers/*_bench.py``) runs in its own
interpreter (the peers in their own venvs), builds its tables through its own best
documented path, and hands this module one callable per workload. This module owns
everything that must be identical across systems: item sizes, table sizes, batch
size, payloads, warm-up, rounds, medians, the time budget and the JSON layout. It
depends on numpy and the standard library only, so every venv can import it.

Workloads (keys of ``results``):
  insert_batched[SIZE]  256 one-step items per call          items/s, GB/s
  insert_step[SIZE]     one step + one item per call          items/s, GB/s
  sample_uniform[SIZE]  uniform batch of 256, data as numpy   samples/s, GB/s
  prioritized_round     prioritized sample of 256 (exponent 0.6) with data, then
                        update_priorities of those keys       rounds/s
GB/s is payload bytes (decimal GB) moved per second; it ignores keys and metadata.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

SIZES = [("400B", 400), ("4KB", 4_000), ("40KB", 40_000), ("400KB", 400_000)]
BATCH = 256
PRIORITY_EXPONENT = 0.6
IMPORTANCE_BETA = 0.4  # only for systems whose prioritized sample requires it
PRIO_ITEM_BYTES = 400

MiB = 1 << 20


@dataclass
class Config:
    """Table sizes and timing; identical for every system in one comparison."""

    quick: bool
    rounds: int
    round_seconds: float
    warmup_seconds: float
    budget_seconds: float
    insert_table_bytes: int
    insert_table_max_items: int
    sample_table_bytes: int
    sample_table_items: int
    prio_table_items: int
    sizes: list = field(default_factory=lambda: list(SIZES))

    def insert_capacity(self, size: int) -> int:
        """Items the insert benchmarks' ring holds: it wraps during warm-up."""
        by_bytes = self.insert_table_bytes // size
        return max(2 * BATCH, min(self.insert_table_max_items, by_bytes))

    def sample_items(self, size: int) -> int:
        """Items in the uniform-sampling table (capped by bytes for large items)."""
        return max(2 * BATCH, min(self.sample_table_items, self.sample_table_bytes // size))

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["sizes"] = [label for label, _ in self.sizes]
        d["insert_capacity_items"] = {lbl: self.insert_capacity(s) for lbl, s in self.sizes}
        d["sample_table_items_by_size"] = {lbl: self.sample_items(s) for lbl, s in self.sizes}
        return d


def make_config(quick: bool, budget_seconds: float | None) -> Config:
    if quick:
        return Config(quick=True, rounds=5, round_seconds=0.05, warmup_seconds=0.05,
                      budget_seconds=budget_seconds or 120.0,
                      insert_table_bytes=16 * MiB, insert_table_max_items=4_096,
                      sample_table_bytes=64 * MiB, sample_table_items=1_000,
                      prio_table_items=20_000)
    return Config(quick=False, rounds=7, round_seconds=0.4, warmup_seconds=0.3,
                  budget_seconds=budget_seconds or 210.0,
                  insert_table_bytes=512 * MiB, insert_table_max_items=100_000,
                  sample_table_bytes=1024 * MiB, sample_table_items=10_000,
                  prio_table_items=1_000_000)


def payload(n: int, floats: int, seed: int = 0) -> np.ndarray:
    """float32[n, 1, floats] of random normals: compression cannot help anyone."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 1, floats), dtype=np.float32)


def floats_for(size: int) -> int:
    assert size % 4 == 0
    return size // 4


@dataclass
class Workload:
    """What a system hands the harness for one workload.

    ``call`` does ``units_per_call`` units of work (items inserted, items sampled,
    or prioritized rounds). ``close`` releases the table so memory is back before
    the next workload. ``path`` names the API path used; ``note`` anything a reader
    of the numbers must know (e.g. a smaller table).
    """

    call: Callable[[], object]
    units_per_call: int
    path: str
    close: Callable[[], None] = lambda: None
    note: str | None = None
    extra: dict = field(default_factory=dict)


class Bench:
    """Runs workloads for one system and prints its JSON object."""

    def __init__(self, system: str, description: str = "") -> None:
        parser = argparse.ArgumentParser(description=description or f"{system} core benchmark")
        parser.add_argument("--quick", action="store_true",
                            help="tiny tables and short rounds: checks the script, numbers are noise")
        parser.add_argument("--budget", type=float, default=None,
                            help="seconds for this system; workloads past it are skipped")
        parser.add_argument("--only", default=None,
                            help="comma-separated substrings: run only workloads whose key contains one")
        self.args = parser.parse_args()
        self.cfg = make_config(self.args.quick, self.args.budget)
        self.system = system
        self.t0 = time.perf_counter()
        self.results: dict[str, dict] = {}
        self.notes: list[str] = []
        self.versions: dict[str, str] = {"numpy": np.__version__,
                                         "python": platform.python_version()}
        self.only = [s for s in (self.args.only or "").split(",") if s]

    # -- helpers for system scripts --------------------------------------------------
    def log(self, msg: str) -> None:
        print(f"[{self.system} {self.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over_budget(self) -> bool:
        return self.elapsed() > self.cfg.budget_seconds

    def wanted(self, key: str) -> bool:
        return not self.only or any(s in key for s in self.only)

    # -- running ---------------------------------------------------------------------
    def run(self, key: str, setup: Callable[[], Workload], *, item_bytes: int | None,
            unit: str) -> None:
        """Set up one workload, warm it up, time ``rounds`` rounds, record the median.

        ``item_bytes`` turns units/s into GB/s (None for prioritized rounds).
        """
        if not self.wanted(key):
            return
        if self.over_budget():
            self.results[key] = {"skipped": f"time budget {self.cfg.budget_seconds:.0f}s spent"}
            self.log(f"{key}: skipped (budget)")
            return
        t_setup = time.perf_counter()
        try:
            wl = setup()
        except Exception as exc:  # a peer that cannot do a workload: say so, go on
            self.results[key] = {"error": f"setup: {type(exc).__name__}: {exc}"}
            self.log(f"{key}: setup failed: {exc!r}")
            return
        setup_s = time.perf_counter() - t_setup
        try:
            rates = self._time(wl)
        except Exception as exc:
            self.results[key] = {"error": f"run: {type(exc).__name__}: {exc}"}
            self.log(f"{key}: failed: {exc!r}")
            wl.close()
            gc.collect()
            return
        wl.close()
        path, note, extra = wl.path, wl.note, wl.extra
        del wl
        gc.collect()
        med = statistics.median(rates)
        entry = {f"{unit}_per_s": med, "rounds": rates, "path": path,
                 "setup_s": round(setup_s, 3)}
        if item_bytes is not None:
            entry["gb_per_s"] = med * item_bytes / 1e9
            entry["item_bytes"] = item_bytes
        if note:
            entry["note"] = note
        entry.update(extra)
        self.results[key] = entry
        gbs = f", {entry['gb_per_s']:.3f} GB/s" if item_bytes is not None else ""
        self.log(f"{key}: {med:,.0f} {unit}/s{gbs} (setup {setup_s:.1f}s)")

    def _time(self, wl: Workload) -> list[float]:
        cfg = self.cfg
        # Warm-up: at least two calls and warmup_seconds.
        t_end = time.perf_counter() + cfg.warmup_seconds
        n = 0
        while n < 2 or time.perf_counter() < t_end:
            wl.call()
            n += 1
        rates = []
        for _ in range(cfg.rounds):
            calls = 0
            t0 = time.perf_counter()
            deadline = t0 + cfg.round_seconds
            while True:
                wl.call()
                calls += 1
                now = time.perf_counter()
                if now >= deadline and calls >= 2:
                    break
            rates.append(calls * wl.units_per_call / (now - t0))
        return rates

    def standard_suite(self, insert_batched, insert_step, sample_uniform, prioritized) -> None:
        """Run every workload in the fixed order. Each argument is a factory:
        ``insert_batched(floats, capacity, batch)``, ``insert_step(floats, capacity)``,
        ``sample_uniform(floats, n_items, batch)``, ``prioritized(floats, n_items, batch,
        exponent)``; each returns a :class:`Workload`."""
        cfg = self.cfg
        for label, size in cfg.sizes:
            k = floats_for(size)
            cap = cfg.insert_capacity(size)
            self.run(f"insert_batched[{label}]", lambda: insert_batched(k, cap, BATCH),
                     item_bytes=size, unit="items")
        for label, size in cfg.sizes:
            k = floats_for(size)
            cap = cfg.insert_capacity(size)
            self.run(f"insert_step[{label}]", lambda: insert_step(k, cap),
                     item_bytes=size, unit="items")
        for label, size in cfg.sizes:
            k = floats_for(size)
            n = cfg.sample_items(size)
            self.run(f"sample_uniform[{label}]", lambda: sample_uniform(k, n, BATCH),
                     item_bytes=size, unit="samples")
        self.run("prioritized_round",
                 lambda: prioritized(floats_for(PRIO_ITEM_BYTES), cfg.prio_table_items, BATCH,
                                     PRIORITY_EXPONENT),
                 item_bytes=None, unit="rounds")

    def finish(self) -> None:
        out = {
            "system": self.system,
            "versions": self.versions,
            "quick": self.cfg.quick,
            "config": self.cfg.as_dict(),
            "host": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "elapsed_s": round(self.elapsed(), 2),
            "notes": self.notes,
            "results": self.results,
        }
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


def check_batch(data: np.ndarray, batch: int, floats: int) -> None:
    """Sanity check once per workload that a system returned what was asked for."""
    arr = np.asarray(data)
    if arr.shape[0] != batch or arr.size != batch * floats:
        raise AssertionError(f"expected {batch} x {floats} floats, got shape {arr.shape}")
    if arr.dtype != np.float32:
        raise AssertionError(f"expected float32, got {arr.dtype}")


def fill_rows(n_items: int, floats: int, chunk: int = 4096) -> int:
    """Rows of payload to fill a table from: at most ``chunk`` and about 64 MiB."""
    return max(1, min(n_items, chunk, (64 * MiB) // (4 * floats)))


def fill_batches(n_items: int, batch: int):
    """Yield (start, stop) covering n_items in chunks of at most batch."""
    for start in range(0, n_items, batch):
        yield start, min(n_items, start + batch)


def prio_fill_priorities(n_items: int, seed: int = 1) -> np.ndarray:
    """Random initial priorities in (0.01, 10]: the same for every system."""
    rng = np.random.default_rng(seed)
    return (rng.random(n_items) * 10.0 + 0.01).astype(np.float64)


class PriorityStream:
    """Fresh random priorities for update_priorities, reused buffers: cheap per round."""

    def __init__(self, batch: int, seed: int = 2, dtype=np.float64) -> None:
        rng = np.random.default_rng(seed)
        self._pool = (rng.random(batch * 64) * 10.0 + 0.01).astype(dtype)
        self._batch = batch
        self._i = 0

    def next(self) -> np.ndarray:
        i = self._i
        self._i = (i + 1) % 64
        return self._pool[i * self._batch:(i + 1) * self._batch]

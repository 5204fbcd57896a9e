"""The core comparison's workloads (``benchmarks.core.compare``).

Every system script (``core/reprise_core.py``, ``peers/*_core.py``) runs in its own
interpreter (the peers in their own venvs), builds its tables through its own best
documented path, and hands :func:`standard_suite` one factory per workload. This module
owns what must be identical across systems: item sizes, table sizes, batch size, the
configuration and how a workload is timed (warm-up, rounds, median); payloads come
from ``benchmarks.common.payload``. numpy and the standard library only.

Workloads (keys of ``results``):
  insert_batched[SIZE]  256 one-step items per call          items/s, GB/s
  insert_step[SIZE]     one step + one item per call          items/s, GB/s
  sample_uniform[SIZE]  uniform batch of 256, data as numpy   samples/s, GB/s
  prioritized_round     prioritized sample of 256 (exponent 0.6) with data, then
                        update_priorities of those keys       rounds/s
GB/s is payload bytes (decimal GB) moved per second; it ignores keys and metadata.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from benchmarks.common.bench import Bench
from benchmarks.common.config import Config, MiB
from benchmarks.common.payload import floats_for
from benchmarks.common.timing import timed_rounds

SIZES = [("400B", 400), ("4KB", 4_000), ("40KB", 40_000), ("400KB", 400_000)]
BATCH = 256
PRIORITY_EXPONENT = 0.6
IMPORTANCE_BETA = 0.4  # only for systems whose prioritized sample requires it
PRIO_ITEM_BYTES = 400

# Table sizes and timing; identical for every system in one comparison.
FULL = dict(rounds=7, round_seconds=0.4, warmup_seconds=0.3, budget_seconds=210.0,
            insert_table_bytes=512 * MiB, insert_table_max_items=100_000,
            sample_table_bytes=1024 * MiB, sample_table_items=10_000,
            prio_table_items=1_000_000)
QUICK = dict(rounds=3, round_seconds=0.02, warmup_seconds=0.02, budget_seconds=120.0,
             insert_table_bytes=4 * MiB, insert_table_max_items=1_024,
             sample_table_bytes=16 * MiB, sample_table_items=1_000,
             prio_table_items=4_096)


def make_config(quick: bool, budget: float | None) -> Config:
    """The configuration, with the table sizes per item size it implies:
    ``insert_capacity_items[label]`` (the insert benchmarks' ring, which wraps during
    warm-up) and ``sample_table_items_by_size[label]`` (capped by bytes for large items)."""
    cfg = Config.choose(quick, budget, FULL, QUICK)
    cfg.sizes = [label for label, _ in SIZES]
    cfg.insert_capacity_items = {
        label: max(2 * BATCH, min(cfg.insert_table_max_items, cfg.insert_table_bytes // size))
        for label, size in SIZES}
    cfg.sample_table_items_by_size = {
        label: max(2 * BATCH, min(cfg.sample_table_items, cfg.sample_table_bytes // size))
        for label, size in SIZES}
    return cfg


def core_bench(system: str) -> Bench:
    """The harness of one system's core script (arguments, budget, log, JSON)."""
    return Bench(system, "core", make_config)


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


def measure(bench: Bench, key: str, setup: Callable[[], Workload], *, item_bytes: int | None,
            unit: str) -> None:
    """Set up one workload, warm it up, time ``rounds`` rounds, record the median.

    ``item_bytes`` turns units/s into GB/s (None for prioritized rounds)."""
    bench.run(key, _timed, bench.cfg, setup, item_bytes, unit)


def _timed(cfg: Config, setup: Callable[[], Workload], item_bytes: int | None, unit: str) -> dict:
    t_setup = time.perf_counter()
    wl = setup()
    setup_s = time.perf_counter() - t_setup
    try:
        rates = timed_rounds(wl.call, wl.units_per_call, cfg)
    finally:
        wl.close()
        path, note, extra = wl.path, wl.note, wl.extra
        del wl
        gc.collect()
    med = statistics.median(rates)
    entry = {f"{unit}_per_s": med, "rounds": rates, "path": path, "setup_s": round(setup_s, 3)}
    if item_bytes is not None:
        entry["gb_per_s"] = med * item_bytes / 1e9
        entry["item_bytes"] = item_bytes
    if note:
        entry["note"] = note
    entry.update(extra)
    return entry


def standard_suite(bench: Bench, insert_batched, insert_step, sample_uniform, prioritized) -> None:
    """Run every workload in the fixed order. Each argument is a factory:
    ``insert_batched(floats, capacity, batch)``, ``insert_step(floats, capacity)``,
    ``sample_uniform(floats, n_items, batch)``, ``prioritized(floats, n_items, batch,
    exponent)``; each returns a :class:`Workload`."""
    cfg = bench.cfg
    for label, size in SIZES:
        k, cap = floats_for(size), cfg.insert_capacity_items[label]
        measure(bench, f"insert_batched[{label}]", lambda: insert_batched(k, cap, BATCH),
                item_bytes=size, unit="items")
    for label, size in SIZES:
        k, cap = floats_for(size), cfg.insert_capacity_items[label]
        measure(bench, f"insert_step[{label}]", lambda: insert_step(k, cap),
                item_bytes=size, unit="items")
    for label, size in SIZES:
        k, n = floats_for(size), cfg.sample_table_items_by_size[label]
        measure(bench, f"sample_uniform[{label}]", lambda: sample_uniform(k, n, BATCH),
                item_bytes=size, unit="samples")
    measure(bench, "prioritized_round",
            lambda: prioritized(floats_for(PRIO_ITEM_BYTES), cfg.prio_table_items, BATCH,
                                PRIORITY_EXPONENT),
            item_bytes=None, unit="rounds")

"""The serving comparison's workloads (``benchmarks.serving.compare``).

Every system script (``serving/reprise_serving.py``, ``peers/*_serving.py``) runs in its
own interpreter (the peers in their own venvs) and starts its own processes: a server
(where the system has one), writer/actor processes and a sampler/learner process, all
started with the ``spawn`` method so each is a fresh interpreter as in a real
deployment (``benchmarks.common.processes.Group``). This module owns what must be
identical across systems: item sizes, table sizes, batch sizes, the Ape-X transitions,
durations, and the result entries; payloads, timing and processes come from
``benchmarks.common``. numpy and the standard library only.

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

import statistics

import numpy as np

from benchmarks.common.bench import Bench
from benchmarks.common.config import Config, MiB
from benchmarks.common.payload import random_priorities
from benchmarks.common.timing import Window, latencies_in_window, latency_stats

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

# warmup_seconds (writer1) counts after the ring has wrapped once; start_timeout bounds
# the processes' imports and set-up.
FULL = dict(rounds=7, round_seconds=0.4, warmup_seconds=0.3,
            writer_table_bytes=512 * MiB, writer_table_max_items=100_000,
            mixed_table_items=100_000, mixed_warmup_seconds=1.0, mixed_seconds=4.0,
            apex_table_items=50_000, apex_warmup_seconds=3.0, apex_seconds=15.0,
            budget_seconds=240.0, start_timeout=120.0)
QUICK = dict(rounds=2, round_seconds=0.05, warmup_seconds=0.02,
             writer_table_bytes=4 * MiB, writer_table_max_items=1_024,
             mixed_table_items=2_048, mixed_warmup_seconds=0.1, mixed_seconds=0.3,
             apex_table_items=1_000, apex_warmup_seconds=0.2, apex_seconds=0.5,
             budget_seconds=120.0)


def writer_capacity(cfg: Config, size: int) -> int:
    """Items in the writer1 table for items of ``size`` bytes."""
    return max(2 * STEPS_PER_CALL, min(cfg.writer_table_max_items, cfg.writer_table_bytes // size))


def make_config(quick: bool, budget: float | None) -> Config:
    cfg = Config.choose(quick, budget, FULL, QUICK)
    cfg.writer_capacity_items = {lbl: writer_capacity(cfg, s) for lbl, s in WRITER_SIZES}
    cfg.apex = {"actors": APEX_ACTORS, "push": APEX_PUSH, "sample": APEX_SAMPLE,
                "frame": list(APEX_FRAME), "transition_bytes": APEX_TRANSITION_BYTES,
                "push_mb": APEX_PUSH * APEX_TRANSITION_BYTES / 1e6,
                "priority_exponent": PRIORITY_EXPONENT,
                "paced_actor_period_s": APEX_ACTOR_PERIOD,
                "paced_learner_period_s": APEX_LEARNER_PERIOD}
    cfg.mixed = {"writers": N_WRITERS, "item_bytes": 400, "sample_batch": SAMPLE_BATCH}
    return cfg


def serving_bench(system: str, add_arguments=None) -> Bench:
    """The harness of one system's serving script (arguments, budget, log, JSON;
    ``add_arguments(parser)`` adds the system's own options)."""
    return Bench(system, "serving", make_config, add_arguments)


def serving_suite(bench: Bench, system, writer_variants=("step", "batch")) -> None:
    """Every workload, in the order of the driver's tables: ``system.writer1(size,
    variant)`` per size and variant, ``system.mixed(variant)``, ``system.apex(variant)``
    (a variant a system has no path for raises :class:`~benchmarks.common.bench.Unsupported`)."""
    for label, size in WRITER_SIZES:
        for variant in writer_variants:
            bench.run(f"writer1[{label},{variant}]", system.writer1, size, variant)
    for variant in ("step", "batch"):
        bench.run(f"mixed[{variant}]", system.mixed, variant)
    for variant in APEX_VARIANTS:
        bench.run(variant, system.apex, variant)


# --- Ape-X transitions ----------------------------------------------------------------------
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


def apex_batches(pool: dict, seed: int):
    """Endless (columns, priorities) batches of APEX_PUSH transitions cut from pool
    (contiguous slices: no copy) with fresh priorities each time."""
    n = len(pool["action"])
    prios = random_priorities(APEX_PUSH * 64, seed)
    i = 0
    while True:
        start = (i * APEX_PUSH) % (n - APEX_PUSH + 1)
        cols = {k: v[start:start + APEX_PUSH] for k, v in pool.items()}
        j = i % 64
        yield cols, prios[j * APEX_PUSH:(j + 1) * APEX_PUSH]
        i += 1


def apex_timing(variant: str, role: str, index: int = 0) -> tuple[float, float]:
    """(period, phase) of an Ape-X actor or learner: back to back for ``apex``; for
    ``apex-paced`` actors push every APEX_ACTOR_PERIOD s (staggered) and the learner
    starts a round every APEX_LEARNER_PERIOD s."""
    if variant != "apex-paced":
        return 0.0, 0.0
    if role == "actor":
        return APEX_ACTOR_PERIOD, index * APEX_ACTOR_PERIOD / APEX_ACTORS
    return APEX_LEARNER_PERIOD, 0.0


def latency_run(call, warmup: float, seconds: float, timing: tuple, after=None):
    """The ``run(start)`` of an Ape-X actor or learner child: latencies of ``call``
    in the window (see :func:`~benchmarks.common.timing.latencies_in_window`,
    ``timing`` = (period, phase)), then ``after()`` if given (e.g. closing a writer)."""
    def run(start):
        lat = latencies_in_window(Window(start, warmup, seconds), call, *timing)
        if after is not None:
            after()
        return {"lat": lat, "seconds": seconds}
    return run


# --- result entries -----------------------------------------------------------------------
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

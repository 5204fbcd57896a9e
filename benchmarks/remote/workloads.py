"""The remote comparison's workloads (``benchmarks.remote.compare``): a replay server in
its own process and 1, 2, 4 or 8 client processes on the same host, over loopback TCP.

Every system script (``remote/reprise_remote.py``, ``peers/reverb_remote.py``) starts its
server as a child process (``benchmarks.common.processes.ServerProcess``: the module
with ``--serve SPECS``) and a pool of ``max(cfg.clients)`` spawned client processes,
started once and reused for every point (``benchmarks.common.processes.Pool``; Reverb's
clients import TensorFlow: starting them per point would cost more than the points).
This module owns what must be identical across systems: item sizes, batches, table
sizes, payloads, the configuration, and the result entries. numpy and the standard
library only.

Workloads (keys of ``results``), each for n in ``cfg.clients``:
  insert[SIZE/nc]  n processes, each writing batches of one-step items into a FIFO
                   ring (already full, so every insert evicts); one call = the
                   system's batched write of BATCH[SIZE] items + a flush that returns
                   once they are in the table: items/s, GB/s, latency per call
  sample[SIZE/nc]  n processes, each drawing uniform batches of BATCH[SIZE] items with
                   their data as numpy from a prefilled table: items/s, GB/s, latency
                   per call

A point: the processes start together, warm up for ``warmup_seconds``, then count the
calls that finish inside a window of ``window_seconds``; ``rounds`` such windows. items/s
is the median over rounds of the sum over processes; p50/p99 are over every call of every
round that started and finished inside a window. GB/s counts payload bytes (decimal).
"""

from __future__ import annotations

import statistics

import numpy as np

from benchmarks.common.bench import Bench
from benchmarks.common.config import Config
from benchmarks.common.payload import payload
from benchmarks.common.processes import Pool
from benchmarks.common.timing import latency_stats

SIZES = [("4KB", 4_000), ("400KB", 400_000)]
# Items per call. 16 x 400 KB = 6.4 MB keeps every message far below the 64 MiB
# limit both servers have by default (256 x 400 KB would be 102 MB).
BATCH = {"4KB": 256, "400KB": 16}
# Items in each table (the insert rings and the sample tables): 64 MB and 410 MB.
TABLE_ITEMS = {"4KB": 16_384, "400KB": 1_024}
CLIENTS = [1, 2, 4, 8]
OPS = ["insert", "sample"]
SOCKET_BUFFER = 4 << 20        # plain-socket test: bytes per sendall / recv_into

# start_timeout: 8 client processes importing TensorFlow on 2 cores.
FULL = dict(rounds=3, warmup_seconds=0.5, window_seconds=2.0, budget_seconds=300.0,
            start_timeout=180.0, clients=CLIENTS, table_items=TABLE_ITEMS)
QUICK = dict(rounds=1, warmup_seconds=0.1, window_seconds=0.2, budget_seconds=120.0,
             clients=[1, 2], table_items={"4KB": 1_024, "400KB": 64})


def make_config(quick: bool, budget: float | None) -> Config:
    cfg = Config.choose(quick, budget, FULL, QUICK)
    cfg.sizes = dict(SIZES)
    cfg.batch = BATCH
    cfg.socket_buffer = SOCKET_BUFFER
    return cfg


def remote_bench(system: str) -> Bench:
    """The harness of one system's remote script (arguments, budget, log, JSON)."""
    return Bench(system, "remote", make_config)


def size_bytes(label: str) -> int:
    return dict(SIZES)[label]


def floats(label: str) -> int:
    return size_bytes(label) // 4


def key(op: str, label: str, n: int) -> str:
    return f"{op}[{label}/{n}c]"


def table_name(op: str, label: str) -> str:
    return f"{op}_{label}"


def table_specs(cfg: Config) -> list[dict]:
    """One table per (op, size): ``name``, ``floats`` (float32 per item), ``items``,
    ``batch`` (items per call), ``clients`` (the most clients that write at once)."""
    return [{"name": table_name(op, label), "floats": floats(label),
             "items": cfg.table_items[label], "batch": BATCH[label],
             "clients": max(cfg.clients)} for op in OPS for label, _ in SIZES]


def batch_rows(label: str, seed: int) -> np.ndarray:
    """float32[BATCH, floats] of random normals: one call's items, one step each."""
    return payload(BATCH[label], floats(label), seed)


# --- results -------------------------------------------------------------------------------
def point_entry(rounds: list[list[dict]], label: str, cfg: Config, path: str, **extra) -> dict:
    """The result of one point from :meth:`Pool.point`'s rounds."""
    batch = BATCH[label]
    rates = [sum(c["calls"] for c in r) * batch / cfg.window_seconds for r in rounds]
    lat = [x for r in rounds for c in r for x in c["lat"]]
    med = statistics.median(rates)
    e = {"items_per_s": med, "gb_per_s": med * size_bytes(label) / 1e9, "batch": batch,
         "item_bytes": size_bytes(label), "rounds": rates, "latency": latency_stats(lat),
         "per_client_calls": [[c["calls"] for c in r] for r in rounds], "path": path}
    e.update(extra)
    return e


def run_points(bench: Bench, pool: Pool, path_of, extra=None) -> None:
    """Every (op, size, n) point, in order, into bench.results; ``path_of(op, label)``
    names the system's path, ``extra(op, label)`` adds fields (e.g. server RSS)."""
    for op in OPS:
        for label, _ in SIZES:
            for n in bench.cfg.clients:
                k = key(op, label, n)
                bench.run(k, lambda op=op, label=label, n=n: point_entry(
                    pool.point(op, label, n), label, bench.cfg, path_of(op, label),
                    **(extra(op, label) if extra else {})))
                if "latency" in bench.results.get(k, {}):
                    bench.log(f"{k}: {latency_text(bench.results[k])}")


def latency_text(e: dict) -> str:
    lat = e.get("latency", {})
    if not lat.get("n"):
        return "no calls"
    return f"p50 {lat['p50_ms']:.2f} ms p99 {lat['p99_ms']:.2f} ms (n={lat['n']})"

"""The remote comparison's workloads (``benchmarks.remote.compare``): a replay server in
its own process and 1, 2, 4 or 8 client processes on the same host, over loopback TCP.

Every system script (``remote/reprise_remote.py``, ``peers/reverb_remote.py``) starts its
server as a child process (``benchmarks.common.processes.ServerProcess``: the module
with ``--serve SPECS``) and a pool of ``max(cfg.clients)`` spawned client processes,
started once and reused for every point (:class:`ClientPool` over
``benchmarks.common.processes.Pool``; Reverb's clients import TensorFlow: starting them
per point would cost more than the points). This module owns what must be identical
across systems: item sizes, items per call, table sizes, payloads, the configuration,
which points exist, and the result entries. numpy and the standard library only.

Workloads (keys of ``results``: ``OP[SIZE/nc]``), each for n in ``cfg.clients``, in
:data:`WORKLOADS` order; every item is one step of one float32 field:
  insert[SIZE/nc]       each process writes batches of BATCH[SIZE] one-step items into a
                        FIFO ring (already full, so every insert evicts); one call = the
                        system's batched write + a flush that returns once the items are
                        in the table
  sample[SIZE/nc]       each process draws uniform batches of BATCH[SIZE] items with their
                        data as numpy from a prefilled table, one call after the other
  step_insert[SIZE/nc]  a new user's actor loop (issue 18): one writer kept open per
                        process, one ``append`` + one ``create_item`` (1 step) per step;
                        one call = STEP_CHUNK steps and a flush (items in the table); same
                        rings as ``insert``
  iterate[SIZE/nc]      Reprise only: ``sample``'s batches through the pipelined
                        ``Client.iterate`` (ITERATE_IN_FLIGHT batches in flight on one
                        stream); Reverb's reference is its ``sample`` point, which already
                        is such a stream
  sample256[400KB/nc]   ``sample`` with batches of 256 x 400 KB (102 MB per batch, above
                        the 64 MiB message limit both servers have by default: a system
                        has to stream it in parts); the harness's 4 KB half is ``sample[4KB]``
  iterate256[400KB/nc]  Reprise only: ``sample256`` through ``Client.iterate``

A point: the processes start together, warm up for ``warmup_seconds``, then count the
calls that finish inside a window of ``window_seconds``; ``rounds`` such windows. items/s
is the median over rounds of the sum over processes; p50/p99 are over every call of every
round that started and finished inside a window. GB/s counts payload bytes (decimal).

``--ops``, ``--sizes`` and ``--clients`` (every system script takes them, and the driver
passes them on) choose a subset of points; ``--clients`` also sets how many client
processes are started.
"""

from __future__ import annotations

import statistics

import numpy as np

from benchmarks.common.bench import Bench
from benchmarks.common.config import Config
from benchmarks.common.payload import payload
from benchmarks.common.processes import Pool, ServerProcess
from benchmarks.common.timing import latency_stats

SIZES = [("4KB", 4_000), ("400KB", 400_000)]
# Items per call of insert and sample. 16 x 400 KB = 6.4 MB keeps every message far
# below the 64 MiB limit both servers have by default; sample256 is the 102 MB case.
BATCH = {"4KB": 256, "400KB": 16}
# Items in each table (the insert rings and the sample tables): 64 MB and 410 MB.
TABLE_ITEMS = {"4KB": 16_384, "400KB": 1_024}
CLIENTS = [1, 2, 4, 8]
OPS = ["insert", "sample"]     # the original points (issue 5), in every table since
STEP_CHUNK = 32                # step_insert: steps per call (Reverb's flush cadence)
ITERATE_IN_FLIGHT = 2          # iterate: batches in flight (as Reverb's sampler: 2 batches)
SOCKET_BUFFER = 4 << 20        # plain-socket test: bytes per sendall / recv_into

# (op, size, items per call, table it uses), in the order they run: the points that may
# fail (sample256: a message above the default limit) last.
WORKLOADS = [
    ("insert", "4KB", BATCH["4KB"], "insert"), ("insert", "400KB", BATCH["400KB"], "insert"),
    ("sample", "4KB", BATCH["4KB"], "sample"), ("sample", "400KB", BATCH["400KB"], "sample"),
    ("step_insert", "4KB", STEP_CHUNK, "insert"), ("step_insert", "400KB", STEP_CHUNK, "insert"),
    ("iterate", "4KB", BATCH["4KB"], "sample"), ("iterate", "400KB", BATCH["400KB"], "sample"),
    ("sample256", "400KB", 256, "sample"), ("iterate256", "400KB", 256, "sample"),
]
ALL_OPS = list(dict.fromkeys(op for op, *_ in WORKLOADS))
# The pipelined points and the serial ones they are measured against.
PIPELINED = {"iterate": "sample", "iterate256": "sample256"}

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
    cfg.step_chunk = STEP_CHUNK
    cfg.iterate_in_flight = ITERATE_IN_FLIGHT
    return cfg


def add_point_args(ap) -> None:
    """The point filters every remote system script takes (the driver passes them on)."""
    ap.add_argument("--ops", default=None,
                    help="comma-separated operations to run (default all): " + ",".join(ALL_OPS))
    ap.add_argument("--sizes", default=None,
                    help="comma-separated item sizes to run (default all): "
                         + ",".join(s for s, _ in SIZES))
    ap.add_argument("--clients", default=None,
                    help="comma-separated client counts (default 1,2,4,8; --quick 1,2); "
                         "also how many client processes are started")


def split_list(text: str | None, known: list[str], what: str) -> list[str] | None:
    """``text`` split on commas and checked against ``known`` (None: no filter)."""
    if not text:
        return None
    items = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in items if s not in known]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown}; expected some of {known}")
    return items


def remote_bench(system: str) -> Bench:
    """The harness of one system's remote script (arguments, budget, log, JSON), with
    ``--ops/--sizes/--clients`` applied to its config (``cfg.ops``, ``cfg.size_labels``,
    ``cfg.clients``)."""
    bench = Bench(system, "remote", make_config, add_point_args)
    a, cfg = bench.args, bench.cfg
    cfg.ops = split_list(a.ops, ALL_OPS, "ops") or ALL_OPS
    cfg.size_labels = split_list(a.sizes, [s for s, _ in SIZES], "sizes") or [s for s, _ in SIZES]
    if a.clients:
        try:
            cfg.clients = sorted({int(n) for n in a.clients.split(",") if n.strip()})
        except ValueError:
            raise SystemExit(f"--clients takes comma-separated integers, got {a.clients!r}")
        if not cfg.clients or cfg.clients[0] < 1:
            raise SystemExit(f"--clients takes counts >= 1, got {a.clients!r}")
    return bench


def size_bytes(label: str) -> int:
    return dict(SIZES)[label]


def floats(label: str) -> int:
    return size_bytes(label) // 4


def key(op: str, label: str, n: int) -> str:
    return f"{op}[{label}/{n}c]"


def batch_of(op: str, label: str) -> int:
    """Items per call of a workload."""
    for o, lbl, batch, _ in WORKLOADS:
        if (o, lbl) == (op, label):
            return batch
    raise KeyError(f"no workload {op}[{label}]")


def table_op(op: str) -> str:
    """The table kind a workload uses: ``insert`` (FIFO rings) or ``sample``."""
    return next(t for o, _, _, t in WORKLOADS if o == op)


def table_name(op: str, label: str) -> str:
    return f"{table_op(op)}_{label}"


def table_specs(cfg: Config) -> list[dict]:
    """One table per (table kind, size): ``name``, ``floats`` (float32 per item),
    ``items``, ``batch`` (items per ``insert`` call), ``clients`` (the most clients that
    write at once). ``insert`` and ``step_insert`` share the rings, every sampling
    workload the sample tables."""
    return [{"name": table_name(op, label), "floats": floats(label),
             "items": cfg.table_items[label], "batch": BATCH[label],
             "clients": max(cfg.clients)} for op in OPS for label, _ in SIZES]


def used_tables(cfg: Config, specs: list[dict]) -> list[dict]:
    """The specs of the tables the selected points (``cfg.ops``, ``cfg.size_labels``) use."""
    names = {table_name(op, label) for op, label, _, _ in WORKLOADS
             if op in cfg.ops and label in cfg.size_labels}
    return [s for s in specs if s["name"] in names]


def batch_rows(label: str, seed: int, n: int | None = None) -> np.ndarray:
    """float32[n, floats] of random normals (n: BATCH[label]): one call's items, one
    step each."""
    return payload(BATCH[label] if n is None else n, floats(label), seed)


# --- results -------------------------------------------------------------------------------
def point_entry(rounds: list[list[dict]], op: str, label: str, cfg: Config, path: str,
                **extra) -> dict:
    """The result of one point from :meth:`Pool.point`'s rounds."""
    batch = batch_of(op, label)
    rates = [sum(c["calls"] for c in r) * batch / cfg.window_seconds for r in rounds]
    lat = [x for r in rounds for c in r for x in c["lat"]]
    med = statistics.median(rates)
    e = {"items_per_s": med, "gb_per_s": med * size_bytes(label) / 1e9, "batch": batch,
         "item_bytes": size_bytes(label), "rounds": rates, "latency": latency_stats(lat),
         "per_client_calls": [[c["calls"] for c in r] for r in rounds], "path": path}
    e.update(extra)
    return e


class ClientPool:
    """A :class:`~benchmarks.common.processes.Pool` that is started again after a point
    fails (a client that fails makes ``Pool`` kill them all): the failing point records
    its error, the next point gets fresh clients."""

    def __init__(self, bench: Bench, setup, args: tuple) -> None:
        self.bench, self.setup, self.args = bench, setup, args
        self.size = max(bench.cfg.clients)
        self.pool: Pool | None = None
        self.start()

    def start(self) -> None:
        self.pool = Pool(self.size, self.setup, self.args, self.bench.cfg)
        self.bench.log(f"{self.size} client processes ready in {self.pool.start_s:.1f}s")

    def point(self, op: str, label: str, n: int) -> list[list[dict]]:
        if self.pool is None:
            self.bench.log("starting the client processes again (the last point failed)")
            self.start()
        try:
            return self.pool.point(op, label, n)
        except BaseException:
            self.pool.kill()
            for p in self.pool.procs:
                p.join(timeout=10)
            self.pool = None
            raise

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def run_points(bench: Bench, server: ServerProcess, client_setup, path_of,
               ops: list[str] | None = None) -> None:
    """Every selected point against ``server``, in :data:`WORKLOADS` order, into
    bench.results, from a :class:`ClientPool` of processes set up by
    ``client_setup(index, address)`` (closed at the end). ``path_of(op, label)`` names the
    system's path; ``ops`` are the operations this system runs (default all). Each point
    checks first that the server still runs and records its RSS."""
    cfg = bench.cfg
    pool = ClientPool(bench, client_setup, (server.address,))
    try:
        for op, label, _, _ in WORKLOADS:
            if op not in cfg.ops or label not in cfg.size_labels or (ops and op not in ops):
                continue
            for n in cfg.clients:
                k = key(op, label, n)

                def measure(op=op, label=label, n=n) -> dict:
                    if server.proc.poll() is not None:
                        raise RuntimeError(f"the server process exited ({server.proc.returncode})")
                    return point_entry(pool.point(op, label, n), op, label, cfg, path_of(op, label),
                                       server_rss_mib=server.rss_mib())
                bench.run(k, measure)
                if "latency" in bench.results.get(k, {}):
                    bench.log(f"{k}: {latency_text(bench.results[k])}")
    finally:
        pool.close()


def latency_text(e: dict) -> str:
    lat = e.get("latency", {})
    if not lat.get("n"):
        return "no calls"
    return f"p50 {lat['p50_ms']:.2f} ms p99 {lat['p99_ms']:.2f} ms (n={lat['n']})"

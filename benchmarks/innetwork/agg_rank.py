"""One worker of the aggregation benchmark (``aggregation.py`` starts N of these, one per worker
namespace): it opens every system it is given, then runs the same sequence of all-reduces as the
other workers, systems interleaved, and writes the start and end time of every call.

    python -m benchmarks.innetwork.agg_rank SPEC.json

SPEC (JSON): ``rank``, ``world``, ``systems`` ({name: endpoint}, in order), ``sizes`` (bytes),
``rounds`` ({size: timed rounds}), ``warmup``, ``blocks``, ``dir`` (a directory every worker
shares), ``call_timeout_s``, ``set_timeout_s``. Endpoints: ``{"kind": "daemon", "address",
"job", "dtype", "scale", "token", "segment_values", "rto"}`` (``reprise.aggregate.Worker``), ``{"kind": "ps", "address"}``
(``param_server.PSWorker``), ``{"kind": "gloo", "master": "ip:port", "iface"}``
(``torch.distributed`` all_reduce, SUM, on a gloo group of the workers).

Order of work:

1. open every system (the gloo group's rendezvous is a TCPStore on rank 0); write
   ``open{rank}.json``; wait (file barrier, timeout) for every worker's, and keep the systems
   every worker opened;
2. ``blocks`` times: for each system (the order rotates by one every block, so drifts in the
   machine's load hit every system alike), for each size: (first block only) ``warmup`` calls,
   the first one checked against the exact sum; then ``rounds[size] / blocks`` timed calls,
   back to back, each timed with ``time.monotonic`` (one clock for every namespace of the
   host) and then (outside the timed span) compared with the exact sum: ``wrong`` counts the
   calls that returned anything else. The gloo tensor is refilled before each call, outside the timed span (all_reduce
   works in place).
3. after every block, ``rank{rank}.json`` (atomically): the times so far, the checks, the
   errors. A system that raises is dropped (its error kept); a set of calls that runs past
   ``set_timeout_s`` ends the process (``faulthandler`` prints where it hung), keeping what the
   earlier blocks wrote.

Gradients: ``(arange(n) % 13) + rank + 1`` as float32, so every sum is an exact small integer,
in float32 and in fixed point alike.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
import traceback

import numpy as np

clock = time.monotonic


def gradient(nbytes: int, rank: int) -> np.ndarray:
    n = nbytes // 4
    return ((np.arange(n) % 13) + rank + 1).astype(np.float32)


def expected_sum(nbytes: int, world: int) -> np.ndarray:
    n = nbytes // 4
    return ((np.arange(n) % 13) * world + world * (world + 1) // 2).astype(np.float32)


class _Gloo:
    def __init__(self, ep: dict, rank: int, world: int, timeout_s: float):
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if ep.get("iface"):
            os.environ["GLOO_SOCKET_IFNAME"] = ep["iface"]
        host, _, port = ep["master"].rpartition(":")
        limit = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, int(port), world, is_master=(rank == 0), timeout=limit)
        dist.init_process_group("gloo", store=self.store, rank=rank, world_size=world, timeout=limit)
        self.dist, self.torch = dist, torch
        self.buf: dict[int, tuple] = {}

    def prepare(self, x: np.ndarray):
        t = self.torch.empty(x.shape, dtype=self.torch.float32)
        src = self.torch.from_numpy(x)
        return t, src

    def call(self, prepared):
        t, src = prepared
        t.copy_(src)                       # before the clock starts (the caller times call_timed)
        return t

    def timed(self, t):
        self.dist.all_reduce(t)
        return t

    def close(self):
        try:
            self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


class _Plain:
    """PS or daemon worker: ``allreduce(x)`` returns a new array."""

    def __init__(self, worker):
        self.w = worker

    def prepare(self, x):
        return x

    def call(self, x):
        return x

    def timed(self, x):
        return self.w.allreduce(x)

    def close(self):
        try:
            self.w.close()
        except Exception:  # noqa: BLE001
            pass


def open_system(ep: dict, rank: int, world: int, timeout_s: float):
    kind = ep["kind"]
    if kind == "gloo":
        return _Gloo(ep, rank, world, timeout_s)
    if kind == "ps":
        from benchmarks.innetwork.param_server import PSWorker
        return _Plain(PSWorker(ep["address"], rank, world, timeout=timeout_s, connect_timeout=timeout_s))
    if kind == "daemon":
        from benchmarks.innetwork.agg_daemon import open_worker
        return _Plain(open_worker(ep["address"], ep["job"], rank, world, ep.get("dtype", "float32"),
                                  ep.get("scale"), ep.get("token"), ep.get("segment_values"),
                                  ep.get("rto")))
    raise ValueError(f"unknown system kind {kind!r}")


def _write(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _barrier(spec: dict, opened: list[str]) -> list[str]:
    d, rank, world = spec["dir"], spec["rank"], spec["world"]
    _write(os.path.join(d, f"open{rank}.json"), opened)
    deadline = clock() + spec["call_timeout_s"] * 2
    every = set(opened)
    for r in range(world):
        path = os.path.join(d, f"open{r}.json")
        while not os.path.exists(path):
            if clock() > deadline:
                raise TimeoutError(f"worker {r} did not open its systems in time")
            time.sleep(0.02)
        with open(path) as f:
            every &= set(json.load(f))
    return [s for s in spec["systems"] if s in every]


def run(spec: dict) -> dict:
    rank, world = spec["rank"], spec["world"]
    out = {"rank": rank, "pid": os.getpid(), "errors": {}, "results": {}, "checks": {}}
    path = os.path.join(spec["dir"], f"rank{rank}.json")
    systems = {}
    for name, ep in spec["systems"].items():
        try:
            systems[name] = open_system(ep, rank, world, spec["call_timeout_s"])
        except Exception as e:  # noqa: BLE001 - recorded; the others still run
            out["errors"][name] = f"open: {type(e).__name__}: {e}\n{traceback.format_exc()}"
    order = _barrier(spec, list(systems))
    out["ran"] = order
    for name in list(systems):
        if name not in order and name not in out["errors"]:
            out["errors"][name] = "not opened by every worker"
    xs = {size: gradient(size, rank) for size in spec["sizes"]}
    sums = {size: expected_sum(size, world) for size in spec["sizes"]}
    blocks = max(1, spec["blocks"])
    for b in range(blocks):
        shift = b % len(order) if order else 0
        for name in order[shift:] + order[:shift]:
            if name in out["errors"]:
                continue
            sysm = systems[name]
            res = out["results"].setdefault(name, {})
            try:
                for size in spec["sizes"]:
                    faulthandler.dump_traceback_later(spec["set_timeout_s"], exit=True)
                    x = sysm.prepare(xs[size])
                    entry = res.setdefault(str(size), {"t": [], "cpu_s": 0.0, "wrong": 0})
                    if b == 0:
                        for i in range(max(1, spec["warmup"])):
                            y = sysm.timed(sysm.call(x))
                            if i == 0:
                                got = np.asarray(y, dtype=np.float32).reshape(-1)
                                err = float(np.max(np.abs(got - expected_sum(size, world)))) if got.size else 0.0
                                out["checks"].setdefault(name, {})[str(size)] = err
                    n = max(1, spec["rounds"][str(size)] // blocks)
                    cpu0 = sum(os.times()[:2])
                    for _ in range(n):
                        arg = sysm.call(x)
                        t0 = clock()
                        y = sysm.timed(arg)
                        entry["t"].append((t0, clock()))
                        if not np.array_equal(np.asarray(y).reshape(-1), sums[size]):  # after the clock
                            entry["wrong"] += 1
                    entry["cpu_s"] += sum(os.times()[:2]) - cpu0
                    faulthandler.cancel_dump_traceback_later()
            except Exception as e:  # noqa: BLE001 - recorded; this system stops, the others go on
                faulthandler.cancel_dump_traceback_later()
                out["errors"][name] = f"block {b}: {type(e).__name__}: {e}\n{traceback.format_exc()}"
        _write(path, out)
    for s in systems.values():
        s.close()
    out["done"] = True
    _write(path, out)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m benchmarks.innetwork.agg_rank SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    faulthandler.enable()
    run(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())

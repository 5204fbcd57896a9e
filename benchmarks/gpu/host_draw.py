"""The host side of a GPU draw: what a learner's thread spends per ``sample(b, device="cuda")``
before any kernel runs, with the rows held by one pinned epoch against a reference per block.

    python -m benchmarks.gpu.host_draw            # ~1 minute; no GPU needed
    python -m benchmarks.gpu.host_draw --quick    # smoke test; numbers are noise

One process, one run: a table of 1,000,000 one-step items (uniform sampler) over a host store;
for b in 256/1024/4096, ``sample_rows(b, pinned=...)`` then ``rows.index(buffer)`` (keys,
probabilities, lengths and the row index the gather reads, in one call) then ``release()``,
alternating the two modes call by call; median and p99 of each, and their ratio. This is the
per-item host work issue 14 names (random reads of the item index plus, with references, a
random read-modify-write of a block's count per item); the gather itself is not in it.

A third arm, when torch is installed: the same items in a table with GPU selection
(``selection_device="cuda"``, emulated on the CPU: only the host side is timed), whose draws
are device-resident (``reprise.torch.resident``). Its host side is one native ``admit(b)``
(rate limiter in bulk, changes since the last draw, an epoch) and the epoch's release: no work
per drawn item, so its time should not grow with b.
The JSON goes to ``--out`` (default ``benchmarks/out/host-draw-<timestamp>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

import reprise as rp

from benchmarks.common.timing import call_summary

BATCHES = (256, 1024, 4096)


def build(items: int, block_steps: int):
    store = rp.Store({"x": rp.Field((100,), "float32")}, capacity=items, block_steps=block_steps)
    table = rp.Table("t", store, max_size=items, seed=0)
    resident = None
    try:
        from reprise.torch import emulate_cuda
        emulate_cuda(True)
        resident = rp.Table("resident", store, max_size=items, seed=0, selection_device="cuda")
    except (ImportError, rp.errors.InvalidArgument):  # no torch: two arms
        pass
    rows = np.random.default_rng(0).standard_normal((items, 1, 100), dtype=np.float32)
    chunk = 65_536
    with store.writer() as w:
        for i in range(0, items, chunk):
            n = len(rows[i:i + chunk])
            w.extend({"x": rows[i:i + chunk, 0]})
            w.create_items(table, 1, np.ones(n))
            if resident is not None:
                w.create_items(resident, 1, np.ones(n))
    if resident is not None:
        resident.sample(1)  # the mirror takes in every item once
    return store, table, resident


def per_item(times: list[float], batch: int) -> dict:
    """:func:`~benchmarks.common.timing.call_summary` of the calls, and ns per drawn item."""
    out = call_summary(times)
    out["ns_per_item"] = out["us_median"] * 1e3 / batch
    return out


def measure_resident(table, batch: int, calls: int) -> dict:
    times = []
    for i in range(calls + 10):
        t0 = time.perf_counter()
        admitted = table._selection.admit(batch, 0)
        admitted.rows.release()
        if i >= 10:
            times.append(time.perf_counter() - t0)
        assert admitted.count == batch and len(admitted.changes[0]) == 0
    return per_item(times, batch)


def measure(table, batch: int, calls: int) -> dict:
    buf = np.empty(batch * 4, np.int64)
    times = {True: [], False: []}
    for i in range(2 * calls + 20):
        pinned = bool(i % 2)
        t0 = time.perf_counter()
        rows = table._native.sample_rows(batch, 0, pinned=pinned)
        rows.index(buf)
        rows.release()
        if i >= 20:  # warm-up first
            times[pinned].append(time.perf_counter() - t0)
    out = {}
    for pinned, name in ((True, "epoch"), (False, "references")):
        out[name] = per_item(times[pinned], batch)
    out["references_over_epoch"] = out["references"]["us_median"] / out["epoch"]["us_median"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20,000 items, 50 calls: a smoke test")
    p.add_argument("--items", type=int, default=1_000_000)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    items, calls = (20_000, 50) if a.quick else (a.items, a.calls)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = a.out or os.path.join("benchmarks", "out", f"host-draw-{stamp}{'-quick' if a.quick else ''}.json")
    store, table, resident = build(items, block_steps=16)
    try:
        results = {"header": {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                              "items": items, "calls": calls, "date": stamp, "quick": a.quick},
                   "batches": {}}
        print("| batch | epoch median (us) | references median (us) | references / epoch | epoch ns/item "
              "| resident median (us) | epoch / resident |")
        print("|---|---|---|---|---|---|---|")
        for b in BATCHES:
            r = measure(table, b, calls)
            cells = "| - | - |"
            if resident is not None:
                r["resident"] = measure_resident(resident, b, calls)
                r["epoch_over_resident"] = r["epoch"]["us_median"] / r["resident"]["us_median"]
                cells = f"| {r['resident']['us_median']:.1f} | {r['epoch_over_resident']:.1f}x |"
            results["batches"][str(b)] = r
            print(f"| {b} | {r['epoch']['us_median']:.1f} | {r['references']['us_median']:.1f} | "
                  f"{r['references_over_epoch']:.2f}x | {r['epoch']['ns_per_item']:.0f} {cells}", flush=True)
    finally:
        store.close()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

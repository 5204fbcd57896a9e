"""A/B: the host path on a store of 4 KiB pages (/dev/shm) against the same store on
2 MiB pages (``Store(huge_pages=True)`` in a hugetlbfs or ``huge=within_size`` tmpfs).

    python -m benchmarks.core.huge_pages                      # root: mounts a private tmpfs
    python -m benchmarks.core.huge_pages --huge-dir /mnt/huge # a directory you mounted
    python -m benchmarks.core.huge_pages --quick              # smoke test; numbers are noise

Per row size (400 B and 4 KB, one float32 field, one-step items), a store of ``--gib``
GiB filled to the brim and a Uniform table over all of it; per backing:

- ``fill``: ``Table.insert`` of 4096 items per call into the empty store (every page
  touched for the first time), GB/s.
- ``sample``: ``Table.sample(256).data["x"]``, items/s (random rows of the whole store:
  one TLB miss per row on small pages).
- ``prioritized``: the same rows under ``Prioritized(0.6)``, ``sample(256)`` +
  ``update_priorities``, rounds/s (400 B only).

The two backings alternate ``--pairs`` times in one process; the report is the median
of each backing and the median of the pairwise ratios (huge / small) with their range.
Without ``--huge-dir`` and as root, the script re-runs itself under ``unshare --mount``
with a private tmpfs mounted ``huge=within_size``, so nothing outside it changes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import reprise as rp

GIB = 1 << 30
BATCH = 256
CHUNK = 4096


def timed(call, seconds: float, rounds: int) -> float:
    """Median calls/s over ``rounds`` rounds of about ``seconds`` each."""
    call()
    rates = []
    for _ in range(rounds):
        n, t0 = 0, time.perf_counter()
        while (dt := time.perf_counter() - t0) < seconds:
            call()
            n += 1
        rates.append(n / dt)
    return statistics.median(rates)


def one_backing(row: int, gib: float, directory: str | None, huge: bool, seconds: float,
                rounds: int) -> dict:
    k = row // 4
    n = int(gib * GIB // row) // CHUNK * CHUNK
    out = {}
    for sampler in ("uniform", "prioritized") if row == 400 else ("uniform",):
        store = rp.Store({"x": rp.Field((k,), "float32")}, capacity=n, block_steps=64,
                         directory=directory, huge_pages=huge)
        spec = rp.selectors.Uniform() if sampler == "uniform" else rp.selectors.Prioritized(0.6)
        table = rp.Table("t", store, sampler=spec, remover=rp.selectors.Fifo(), max_size=n)
        src = np.random.default_rng(0).standard_normal((CHUNK, 1, k), dtype=np.float32)
        prios = np.random.default_rng(1).uniform(0.1, 10.0, n)
        t0 = time.perf_counter()
        for start in range(0, n, CHUNK):
            table.insert({"x": src}, priorities=prios[start:start + CHUNK])
        fill_s = time.perf_counter() - t0
        assert table.size == n, (table.size, n)
        if sampler == "uniform":
            out["fill_gbps"] = n * row / fill_s / 1e9
            out["huge_page_bytes"] = store.huge_page_bytes
            out["items"] = n
            out["sample_items_per_s"] = BATCH * timed(lambda: table.sample(BATCH).data["x"], seconds, rounds)
        else:
            new = np.random.default_rng(2).uniform(0.1, 10.0, BATCH)

            def round_():
                s = table.sample(BATCH)
                _ = s.data["x"]
                table.update_priorities(s.keys, new)
            out["prioritized_rounds_per_s"] = timed(round_, seconds, rounds)
        del table
        store.close()
        del store  # the mapping (and the tmpfs's space) goes with the last handle
        gc.collect()
    return out


def in_private_mount(argv: list[str], gib: float) -> int:
    """Re-runs this script (``argv``) under ``unshare --mount`` with a private huge
    tmpfs room for a store of ``gib``."""
    if os.geteuid() != 0:
        raise SystemExit("without --huge-dir this script mounts a private tmpfs, which needs root; "
                         "pass --huge-dir DIR (a hugetlbfs, or a tmpfs mounted with huge=within_size)")
    mnt = tempfile.mkdtemp(prefix="reprise-huge-")
    size = f"{int(gib) + 1}g"
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           f'mount -t tmpfs -o huge=within_size,size={size} none "$1" && shift && exec "$@"', "sh", mnt,
           sys.executable, "-m", "benchmarks.core.huge_pages", "--huge-dir", mnt, *argv]
    try:
        return subprocess.call(cmd)
    finally:
        os.rmdir(mnt)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--huge-dir", default=None, help="a directory that hands out huge pages")
    ap.add_argument("--small-dir", default=None, help="the small-page side (default /dev/shm)")
    ap.add_argument("--gib", type=float, default=3.0, help="GiB per store (default 3)")
    ap.add_argument("--pairs", type=int, default=3, help="alternations of the two backings (default 3)")
    ap.add_argument("--quick", action="store_true", help="64 MiB stores, short rounds")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args(argv)
    if a.huge_dir is None:
        return in_private_mount(argv, a.gib)
    kind, _, why = rp._native.page_backing(a.huge_dir)
    if kind == "small":
        raise SystemExit(f"--huge-dir gives no huge pages: {why}")
    gib, seconds, rounds = (1 / 16, 0.05, 3) if a.quick else (a.gib, 0.4, 5)
    runs: dict = {}
    for pair in range(a.pairs):
        for row in (400, 4000):
            for name, directory, huge in (("small", a.small_dir, False), ("huge", a.huge_dir, True)):
                r = one_backing(row, gib, directory, huge, seconds, rounds)
                runs.setdefault(f"{row}B", {}).setdefault(name, []).append(r)
                print(f"pair {pair} {row:>4} B {name:5}: " + ", ".join(
                    f"{k} {v:,.3g}" for k, v in r.items()), file=sys.stderr, flush=True)
    report = {"gib": gib, "pairs": a.pairs, "huge_backing": kind, "rows": {}}
    for row, sides in runs.items():
        cell = report["rows"][row] = {}
        for metric in ("fill_gbps", "sample_items_per_s", "prioritized_rounds_per_s"):
            if metric not in sides["small"][0]:
                continue
            small = [r[metric] for r in sides["small"]]
            huge = [r[metric] for r in sides["huge"]]
            ratios = [h / s for h, s in zip(huge, small)]
            cell[metric] = {"small": statistics.median(small), "huge": statistics.median(huge),
                            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                            "ratio_max": max(ratios)}
            print(f"{row:>6} {metric:26} small {cell[metric]['small']:>12,.3g}  huge "
                  f"{cell[metric]['huge']:>12,.3g}  huge/small {cell[metric]['ratio_median']:.2f} "
                  f"[{min(ratios):.2f}-{max(ratios):.2f}]")
        cell["huge_page_bytes"] = min(r["huge_page_bytes"] for r in sides["huge"])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

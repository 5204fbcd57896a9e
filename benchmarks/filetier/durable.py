"""What a durable flush costs (issue 36): writers of 4 KB steps that flush every few steps,
over a store in shared memory, a file store, and a durable file store, in one run.

    python -m benchmarks.filetier.durable [--dir DIR] [--seconds 4] [--quick]

Part 1, *flushes*: W in-process writer threads (1, 4, 16) each append a step of 4 KB,
create a one-step item per step and flush every ``--every`` (8) steps, for ``--seconds``.
Reported per arm: items/s, the median and 99th percentile flush time, and for the durable
store the commits it ran (flushes that arrive during a commit share the next one) and their
mean time. Part 2, *commit time against table size*: a durable store whose table holds N
one-step items (10k, 100k, 1M; 64-byte rows), the median of 9 ``store.commit()`` calls,
each after one more insert (so each has something to write). The file stores live under
``--dir`` (default: a directory on a disk, /var/tmp when /tmp is a tmpfs) and are removed
after each arm. Writes ``benchmarks/out/durable-<time>.json``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_store(rp, arm: str, base: str, signature: dict, capacity: int, block_steps: int = 64):
    if arm == "memory":
        return rp.Store(signature, capacity, block_steps), None
    d = tempfile.mkdtemp(prefix="reprise-durable-bench-", dir=base)
    store = rp.Store(signature, capacity, block_steps, directory=os.path.join(d, "store"), backing="file",
                     durable=arm == "durable")
    return store, d


def flushes(rp, arm: str, base: str, writers: int, seconds: float, every: int) -> dict:
    sig = {"obs": rp.Field((4096,), "uint8"), "step": rp.Field((), "int64")}
    store, d = make_store(rp, arm, base, sig, capacity=1 << 16)
    table = rp.Table("t", store, max_size=(1 << 16) - 4 * 64 * (writers + 2), seed=1)
    row = np.random.default_rng(0).integers(0, 255, 4096, dtype=np.uint8)
    times: list[list[float]] = [[] for _ in range(writers)]
    items = [0] * writers
    start = threading.Barrier(writers + 1)
    stop = threading.Event()

    def write(k: int) -> None:
        with store.writer(max_sequence_length=1) as w:
            start.wait()
            i = 0
            while not stop.is_set():
                w.append({"obs": row, "step": i})
                w.create_item(table, 1, 1.0)
                i += 1
                if i % every == 0:
                    t = time.perf_counter()
                    w.flush()
                    times[k].append(time.perf_counter() - t)
                    items[k] = i

    threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
    for th in threads:
        th.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    all_times = sorted(x for ts in times for x in ts)
    out = {"arm": arm, "writers": writers, "every": every, "items_per_s": sum(items) / wall,
           "flushes": len(all_times), "flush_median_us": 1e6 * statistics.median(all_times),
           "flush_p99_us": 1e6 * all_times[int(0.99 * (len(all_times) - 1))]}
    if arm == "durable":
        c = store.commits()
        out.update(commits=c["commits"], commit_mean_us=1e6 * c["seconds"] / max(1, c["commits"]),
                   flushes_per_commit=len(all_times) / max(1, c["commits"]))
    store.close()
    if d:
        shutil.rmtree(d, ignore_errors=True)
    return out


def commit_time(rp, base: str, items: int) -> dict:
    sig = {"x": rp.Field((8,), "int64")}
    store, d = make_store(rp, "durable", base, sig, capacity=items + 4096, block_steps=256)
    table = rp.Table("t", store, max_size=items + 100, seed=1)
    chunk = 100_000
    for at in range(0, items, chunk):
        n = min(chunk, items - at)
        table.insert({"x": np.zeros((n, 1, 8), np.int64)}, np.ones(n))
    store.commit()
    took = []
    for _ in range(9):
        table.insert({"x": np.zeros((1, 1, 8), np.int64)}, np.ones(1))
        t = time.perf_counter()
        store.commit()
        took.append(time.perf_counter() - t)
    index = rp.checkpoint.latest(os.path.join(d, "store", "index"))
    size = sum(os.path.getsize(os.path.join(index, f)) for f in os.listdir(index))
    store.close()
    shutil.rmtree(d, ignore_errors=True)
    return {"items": items, "commit_median_ms": 1e3 * statistics.median(took), "index_bytes": size,
            "bytes_per_item": size / items}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.filetier.durable", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="where the file stores go (a directory on a disk)")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--every", type=int, default=8, help="steps between flushes")
    ap.add_argument("--quick", action="store_true", help="1 s runs, 1 and 4 writers, tables of 10k and 100k")
    a = ap.parse_args(argv)
    import reprise as rp
    from benchmarks.common.driver import OUT, host_info
    from reprise.file_store import disk_directory
    base = a.dir or disk_directory()
    if base is None:
        raise SystemExit("no writable directory on a disk (/tmp, /var/tmp and . are memory): pass --dir")
    seconds = 1.0 if a.quick else a.seconds
    writer_counts = (1, 4) if a.quick else (1, 4, 16)
    sizes = (10_000, 100_000) if a.quick else (10_000, 100_000, 1_000_000)
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": host_info(), "dir": base, "flushes": [],
              "commits": []}
    for w in writer_counts:
        for arm in ("memory", "file", "durable"):
            r = flushes(rp, arm, base, w, seconds, a.every)
            report["flushes"].append(r)
            extra = (f", {r['commits']} commits ({r['flushes_per_commit']:.1f} flushes each, "
                     f"{r['commit_mean_us']:.0f} us mean)" if arm == "durable" else "")
            print(f"{w:2d} writers {arm:8s}: {r['items_per_s']:9,.0f} items/s, flush median "
                  f"{r['flush_median_us']:8.1f} us, p99 {r['flush_p99_us']:8.1f} us{extra}", flush=True)
    for n in sizes:
        r = commit_time(rp, base, n)
        report["commits"].append(r)
        print(f"commit with {n:>9,} items: {r['commit_median_ms']:7.2f} ms median (index {r['index_bytes']:,} B, "
              f"{r['bytes_per_item']:.0f} B/item)", flush=True)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"durable-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

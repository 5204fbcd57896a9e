"""What the checkpoint benchmark measures on Reprise's side (``benchmarks.checkpoint.compare``):

1. Save / load: ``rp.checkpoint.save`` of a table ``rounds`` times (fsync included), then
   ``load`` of the last checkpoint with its files dropped from the page cache first
   (cold) and with them cached (warm): :func:`bench_save`, :func:`bench_load`.
2. Throughput during a save: a writer thread (``insert`` of 256 x 4 KB items) and a
   sampler thread (``sample(256)``) run continuously (:class:`Load`); items/s of each
   over a window without a save, then over one ``save`` from the main thread:
   :func:`bench_during`.

Data: one float32 field of 1024 floats (4 KB) per step, one-step items, one table
``Uniform`` (uniform sampler, FIFO remover), filled with ``table.insert`` in chunks of
16,384 items (:func:`make_table`); :func:`disk_baseline` is the disk's own rate.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import sys
import threading
import time

import numpy as np
import reprise as rp

from benchmarks.common.page_cache import evict, files_of, resident

FLOATS = 1024
ITEM_BYTES = FLOATS * 4
CHUNK = 16384  # items per fill insert
BATCH = 256


def log(msg: str) -> None:
    print(f"[checkpoint] {msg}", file=sys.stderr, flush=True)


# --- files and the page cache ----------------------------------------------------------
def du(path: str) -> int:
    return sum(os.path.getsize(f) for f in files_of(path))


def disk_baseline(directory: str, nbytes: int) -> dict:
    """Sequential write (64 MiB os.write calls + fsync) and cold read of one file."""
    path = os.path.join(directory, "disk-baseline")
    buf = np.random.default_rng(0).bytes(nbytes)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    mv = memoryview(buf)
    while mv:
        mv = mv[os.write(fd, mv[: 64 << 20]):]
    os.fsync(fd)
    os.close(fd)
    w = time.perf_counter() - t0
    del buf, mv
    evict(directory)
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    r = time.perf_counter() - t0
    os.unlink(path)
    return {"bytes": nbytes, "write_fsync_gb_per_s": nbytes / w / 1e9, "cold_read_gb_per_s": nbytes / r / 1e9}


# --- tables -------------------------------------------------------------------------------
def make_table(capacity: int, max_size: int, fill: int, kind: str, seed: int = 0) -> rp.Table:
    store = rp.Store({"x": rp.Field((FLOATS,), "float32")}, capacity=capacity)
    table = rp.Table("Uniform", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(),
                     max_size=max_size)
    rng = np.random.default_rng(seed)
    for a in range(0, fill, CHUNK):
        n = min(CHUNK, fill - a)
        if kind == "random":
            x = rng.random((n, 1, FLOATS), dtype=np.float32)
        else:  # 8-bit values stored as float32: compressible
            x = rng.integers(0, 256, (n, 1, FLOATS), dtype=np.uint8).astype(np.float32) / np.float32(255)
        table.insert({"x": x}, 1.0)
    assert table.size == min(fill, max_size), (table.size, fill)
    return table


def close(table: rp.Table) -> None:
    table.store.close()


# --- 1. save / load -----------------------------------------------------------------------
def bench_save(table: rp.Table, directory: str, rounds: int, compression) -> tuple[dict, str]:
    """Times ``rounds`` saves; keeps the last checkpoint (returned), removes the others."""
    data = table.size * ITEM_BYTES
    secs, last = [], None
    for r in range(rounds):
        if last:
            shutil.rmtree(last)
        t0 = time.perf_counter()
        last = rp.checkpoint.save(directory, [table], compression=compression, progress=False)
        secs.append(time.perf_counter() - t0)
        log(f"save {compression or 'none'} {r + 1}/{rounds}: {secs[-1]:.2f}s = {data / secs[-1] / 1e9:.2f} GB/s")
    med = statistics.median(secs)
    return ({"seconds": secs, "median_s": med, "gb_per_s": data / med / 1e9, "data_bytes": data,
             "bytes_on_disk": du(last), "resident_after_save": resident(last)}, last)


def bench_load(path: str, rounds: int, items: int, warm_rounds: int) -> dict:
    data = items * ITEM_BYTES
    out = {"data_bytes": data}
    for mode, n in (("cold", rounds), ("warm", warm_rounds)):
        secs, res = [], []
        for r in range(n):
            if mode == "cold":
                evict(path)
            res.append(resident(path))
            t0 = time.perf_counter()
            tables = rp.checkpoint.load(path, progress=False)
            secs.append(time.perf_counter() - t0)
            t = tables["Uniform"]
            assert t.size == items, (t.size, items)
            t.sample(BATCH)  # usable
            close(t)
            del tables, t
            log(f"load {mode} {r + 1}/{n}: {secs[-1]:.2f}s = {data / secs[-1] / 1e9:.2f} GB/s "
                f"(page cache before: {res[-1]:.0%})")
        if n:
            med = statistics.median(secs)
            out[mode] = {"seconds": secs, "median_s": med, "gb_per_s": data / med / 1e9,
                         "resident_before": res}
    return out


# --- 2. throughput during a save ------------------------------------------------------------
class Load:
    """A writer thread (insert 256 x 4 KB) and a sampler thread (sample 256); each
    appends (time, cumulative items) after every call."""

    def __init__(self, table: rp.Table) -> None:
        self.table = table
        self.stop_flag = threading.Event()
        self.w_marks: list[tuple[float, int]] = [(time.perf_counter(), 0)]
        self.s_marks: list[tuple[float, int]] = [(time.perf_counter(), 0)]
        self.full: list[float] = []  # times of ResourceExhausted
        self.recording = threading.Event()  # keep the keys of inserts while set
        self.keys: list = []
        self.pause = threading.Event()  # the writer waits while set
        self.paused = threading.Event()
        self.errors: list[str] = []
        self.batch = {"x": np.random.default_rng(1).random((BATCH, 1, FLOATS), dtype=np.float32)}
        self.threads = [threading.Thread(target=self._write, daemon=True),
                        threading.Thread(target=self._sample, daemon=True)]
        for t in self.threads:
            t.start()

    def _write(self) -> None:
        n = 0
        try:
            while not self.stop_flag.is_set():
                if self.pause.is_set():
                    self.paused.set()
                    while self.pause.is_set() and not self.stop_flag.is_set():
                        time.sleep(0.001)
                    self.paused.clear()
                    continue
                try:
                    keys = self.table.insert(self.batch, 1.0)
                except rp.errors.ResourceExhausted:
                    self.full.append(time.perf_counter())
                    time.sleep(0.001)
                    continue
                n += BATCH
                self.w_marks.append((time.perf_counter(), n))
                if self.recording.is_set():
                    self.keys.append(keys)
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"writer: {type(e).__name__}: {e}")

    def _sample(self) -> None:
        n = 0
        try:
            while not self.stop_flag.is_set():
                self.table.sample(BATCH)
                n += BATCH
                self.s_marks.append((time.perf_counter(), n))
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"sampler: {type(e).__name__}: {e}")

    def stop(self) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=60)


def count_at(marks, t: float) -> int:
    i = np.searchsorted(np.fromiter((m[0] for m in marks), float, len(marks)), t, side="right")
    return marks[i - 1][1] if i else 0


def rate(marks, t0: float, t1: float) -> float:
    return (count_at(marks, t1) - count_at(marks, t0)) / (t1 - t0)


def max_gap(marks, t0: float, t1: float) -> float:
    ts = [t0] + [t for t, _ in marks if t0 < t < t1] + [t1]
    return max(b - a for a, b in zip(ts, ts[1:]))


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def bench_during(table: rp.Table, directory: str, rounds: int, window: float, warmup: float) -> dict:
    load = Load(table)
    time.sleep(warmup)
    per = []
    for r in range(rounds):
        w0, c0 = time.perf_counter(), cpu_s()
        time.sleep(window)
        w1, c1 = time.perf_counter(), cpu_s()
        i0 = table.info()
        load.keys = []
        load.recording.set()
        t0 = time.perf_counter()
        path = rp.checkpoint.save(directory, [table], progress=False)
        t1, c2 = time.perf_counter(), cpu_s()
        load.pause.set()
        load.paused.wait(10)
        load.recording.clear()
        i1 = table.info()
        # New items the table still holds, against what a FIFO table keeps: the newest max_size.
        new = np.concatenate(load.keys) if load.keys else np.zeros(0, np.uint64)
        held = np.fromiter((k for k, *_ in table.items()), np.uint64)
        kept = int(np.isin(new, held).sum())
        fifo = min(new.size, i1["max_size"])
        load.pause.clear()
        e = {"window_s": w1 - w0, "save_s": t1 - t0,
             "cores_busy_without": (c1 - c0) / (w1 - w0), "cores_busy_during": (c2 - c1) / (t1 - t0),
             "store_evictions_during": i1["num_store_evictions"] - i0["num_store_evictions"],
             "table_evictions_during": i1["num_evictions"] - i0["num_evictions"],
             "table_size_after": i1["size"], "inserted_during": int(new.size),
             "new_items_kept": kept, "new_items_fifo_would_keep": fifo,
             "new_items_kept_ratio": kept / fifo if fifo else None}
        for k, marks in (("writer", load.w_marks), ("sampler", load.s_marks)):
            wo, du_ = rate(marks, w0, w1), rate(marks, t0, t1)
            e[f"{k}_items_per_s_without"] = wo
            e[f"{k}_items_per_s_during"] = du_
            e[f"{k}_ratio"] = du_ / wo if wo else None
            e[f"{k}_longest_gap_during_s"] = max_gap(marks, t0, t1)
        full = [t for t in load.full if t0 <= t <= t1]
        e["writer_store_full_errors_during"] = len(full)
        e["writer_first_store_full_after_s"] = (full[0] - t0) if full else None
        e["writer_store_full_span_s"] = (full[-1] - full[0]) if full else 0.0
        e["writer_store_full_errors_without"] = len([t for t in load.full if w0 <= t <= w1])
        shutil.rmtree(path)
        per.append(e)
        log(f"round {r + 1}/{rounds}: save {e['save_s']:.2f}s; writer {e['writer_items_per_s_during']:,.0f} vs "
            f"{e['writer_items_per_s_without']:,.0f} items/s ({e['writer_ratio']:.0%}), sampler "
            f"{e['sampler_items_per_s_during']:,.0f} vs {e['sampler_items_per_s_without']:,.0f} "
            f"({e['sampler_ratio']:.0%}); store-full errors during: {len(full)} "
            f"(from +{e['writer_first_store_full_after_s'] or 0:.2f}s for {e['writer_store_full_span_s']:.2f}s), "
            f"store evictions {e['store_evictions_during']:,}; new items kept {kept:,} of {fifo:,} "
            f"a FIFO table keeps; table size after {i1['size']:,}")
        time.sleep(0.5)
    load.stop()
    out = {"rounds": per, "errors": load.errors}
    for k in ("writer_items_per_s_without", "writer_items_per_s_during", "writer_ratio",
              "sampler_items_per_s_without", "sampler_items_per_s_during", "sampler_ratio",
              "save_s", "cores_busy_without", "cores_busy_during", "writer_store_full_span_s",
              "store_evictions_during", "new_items_kept", "new_items_fifo_would_keep",
              "table_size_after"):
        out[k] = statistics.median(e[k] for e in per)
    return out

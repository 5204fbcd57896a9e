"""What the checkpoint benchmark measures on Reprise's side (``benchmarks.checkpoint.compare``):

1. Save / load: ``rp.checkpoint.save`` of a table ``rounds`` times (fsync included), then
   ``load`` of the last checkpoint with its files dropped from the page cache first
   (cold) and with them cached (warm): :func:`bench_save`, :func:`bench_load`.
2. Throughput during a save: a writer thread (``insert`` of 256 x 4 KB items) and a
   sampler thread (``sample(256)``) run continuously (:class:`SaveLoad`); items/s of each
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

from benchmarks.checkpoint.load import Load, compare_windows
from benchmarks.common.page_cache import du, evict, resident

FLOATS = 1024
ITEM_BYTES = FLOATS * 4
CHUNK = 16384  # items per fill insert
BATCH = 256


def log(msg: str) -> None:
    print(f"[checkpoint] {msg}", file=sys.stderr, flush=True)


# --- files and the page cache ----------------------------------------------------------
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
class SaveLoad(Load):
    """The :class:`~benchmarks.checkpoint.load.Load` of a save: a writer (insert 256 x 4 KB;
    the times it met ResourceExhausted in ``full``; the keys it inserted while ``recording``
    in ``keys``; it waits while ``pause`` is set, saying so in ``paused``) and a sampler
    (sample 256)."""

    def __init__(self, table: rp.Table) -> None:
        self.table = table
        self.full: list[float] = []
        self.recording = threading.Event()
        self.keys: list = []
        self.pause = threading.Event()
        self.paused = threading.Event()
        self.batch = {"x": np.random.default_rng(1).random((BATCH, 1, FLOATS), dtype=np.float32)}
        super().__init__(self._write, self._sample)

    def _write(self) -> int:
        if self.pause.is_set():
            self.paused.set()
            while self.pause.is_set() and not self.stop_flag.is_set():
                time.sleep(0.001)
            self.paused.clear()
            return 0
        try:
            keys = self.table.insert(self.batch, 1.0)
        except rp.errors.ResourceExhausted:
            self.full.append(time.perf_counter())
            time.sleep(0.001)
            return 0
        if self.recording.is_set():
            self.keys.append(keys)
        return BATCH

    def _sample(self) -> int:
        self.table.sample(BATCH)
        return BATCH


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def bench_during(table: rp.Table, directory: str, rounds: int, window: float, warmup: float) -> dict:
    load = SaveLoad(table)
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
        e.update(compare_windows(load, (w0, w1), (t0, t1)))
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

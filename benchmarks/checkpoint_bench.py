"""Checkpoint benchmark (issue 6): ``rp.checkpoint.save`` / ``load`` speed, the
throughput of a writer and a sampler while a save runs, and dm-reverb's checkpoint of
the same kind of data.

    PYTHONPATH=python python3.11 benchmarks/checkpoint_bench.py           # ~8 minutes on 2 cores
    PYTHONPATH=python python3.11 benchmarks/checkpoint_bench.py --quick   # checks the script

Data: one float32 field of 1024 floats (4 KB) per step, one-step items, one table
``Uniform`` (uniform sampler, FIFO remover) over a store of ``--steps`` steps (default
1M = 4.1 GB), filled with ``table.insert`` in chunks of 16,384 items.

1. Save / load: ``save`` ``--rounds`` times (fsync included: ``save`` syncs every file),
   then ``load`` of the last checkpoint ``--rounds`` times with its files dropped from the
   page cache first (``fdatasync`` + ``posix_fadvise(DONTNEED)``, checked with
   ``fincore``), then once with them cached. Random data (incompressible) without and
   with ``compression="zstd"``, and a compressible 1 GB variant (8-bit values stored as
   float32). GB/s = step data bytes (steps x 4096, decimal) / seconds.
2. Throughput during a save: a writer thread (``insert`` of 256 x 4 KB items) and a
   sampler thread (``sample(256)``) in this process (the library releases the GIL while
   it copies) run continuously; items/s of each over ``--window`` s without a save, then
   over one ``save`` of the table from the main thread; ``--rounds`` rounds, medians.
   Two stores: full (capacity = max_size = 1M steps) and with 25% headroom (capacity
   1.25M steps, max_size 1M). A save pins every block the table's items reference until
   it ends, so the writer gets ``ResourceExhausted`` (store full) once the free blocks are
   used; the writer counts those and retries after 1 ms.
3. Reverb: ``peers/reverb_checkpoint.py`` in benchmarks/.venvs/reverb (server in its own
   process, ``DefaultCheckpointer``, ``client.checkpoint()``), ``--reverb-items`` items
   (default 100k: its checkpoint runs at ~16 MB/s here, so 1M items would take ~4 min
   idle and ~7 min under load; its time per item is linear from 20k to 100k items).

Writes ``benchmarks/out/checkpoint-<date>.json`` and ``.md``; the table on stdout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import reprise as rp  # noqa: E402
from driver_common import OUT, VENVS, host_info  # noqa: E402
from page_cache import evict, files_of, resident  # noqa: E402

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


# --- 3. Reverb ------------------------------------------------------------------------------
def run_reverb(items: int, directory: str, window: float, timeout: float) -> dict:
    py = os.path.join(VENVS, "reverb", "bin", "python")
    if not os.access(py, os.X_OK):
        return {"skipped": f"{py} missing: run bash benchmarks/setup_peers.sh"}
    cmd = [py, os.path.join(HERE, "peers", "reverb_checkpoint.py"), "--items", str(items),
           "--dir", os.path.join(directory, "reverb"), "--window", str(window)]
    log(" ".join(cmd))
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    if r.returncode:
        return {"error": f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


# --- report ---------------------------------------------------------------------------------
def gbs(x):
    return f"{x:.2f}"


def pct(x):
    return "—" if x is None else f"{100 * x:.0f}%"


def build_markdown(rep: dict) -> str:
    h, c = rep["host"], rep["config"]
    out = [f"# Checkpoints, {rep['date']}" + (" (QUICK: small, noisy)" if rep["quick"] else ""), "",
           f"Machine: {h.get('cpu_model', '?')}, {h['cpus']} cores, {h.get('mem_gib', '?')} GiB; "
           f"{h['platform']}; checkpoints in {c['dir']}.",
           f"Disk baseline (one {rep['disk']['bytes'] / 2**30:.3g} GiB file): write + fsync "
           f"{gbs(rep['disk']['write_fsync_gb_per_s'])} GB/s, cold read {gbs(rep['disk']['cold_read_gb_per_s'])} GB/s.",
           f"Load average (1 min) at start / before Reverb / end: "
           + " / ".join(f"{v:.2f}" for v in rep["loadavg_1m"].values()) + ".",
           f"Versions: reprise {rp.__version__}, numpy {np.__version__}, zstandard {c.get('zstandard') or 'missing'}.",
           "", "## 1. Save and load", "",
           "GB/s = step data (steps x 4096 B) / seconds; median of "
           f"{c['rounds']} (zstd: {c['zstd_rounds']}). Save includes fsync. Cold load: the checkpoint's files dropped from the page "
           "cache first (resident fraction checked with fincore); warm: left cached.", "",
           "| data | compression | steps | on disk | save GB/s | load GB/s cold | load GB/s warm |",
           "|---|---|---|---|---|---|---|"]
    for key, e in rep["save_load"].items():
        s, lo = e["save"], e["load"]
        cold = lo.get("cold", {})
        warm = lo.get("warm", {})
        out.append(f"| {e['data']} | {e['compression'] or 'none'} | {e['steps']:,} | "
                   f"{s['bytes_on_disk'] / 1e9:.2f} GB ({s['bytes_on_disk'] / s['data_bytes']:.0%}) | "
                   f"{gbs(s['gb_per_s'])} ({s['median_s']:.1f} s) | "
                   + (f"{gbs(cold['gb_per_s'])} ({cold['median_s']:.1f} s; cached before: "
                      f"{max(cold['resident_before']):.0%})" if cold else "—") + " | "
                   + (f"{gbs(warm['gb_per_s'])} ({warm['median_s']:.1f} s)" if warm else "—") + " |")
    out += ["", "## 2. Writer and sampler throughput during a save", "",
            f"Threads in one process: writer `insert` 256 x 4 KB, sampler `sample(256)`; items/s over "
            f"{c['window']} s without a save, then over a save of the whole table; median of {c['rounds']} rounds.", "",
            "| store | writer without | writer during | writer % | sampler without | sampler during | sampler % | save s (idle) | writer: store full for | new items kept at the end / FIFO would keep | CPU cores busy without / during |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, e in rep["during"].items():
        idle = rep["save_load"].get("random-none", {}).get("save", {}).get("median_s")
        out.append(f"| {e['label']} | {e['writer_items_per_s_without']:,.0f} | {e['writer_items_per_s_during']:,.0f} | "
                   f"**{pct(e['writer_ratio'])}** | {e['sampler_items_per_s_without']:,.0f} | "
                   f"{e['sampler_items_per_s_during']:,.0f} | **{pct(e['sampler_ratio'])}** | "
                   f"{e['save_s']:.1f} ({'—' if idle is None else f'{idle:.1f}'}) | "
                   f"{e['writer_store_full_span_s']:.1f} s | {e['new_items_kept']:,.0f} / {e['new_items_fifo_would_keep']:,.0f} | "
                   f"{e['cores_busy_without']:.2f} / {e['cores_busy_during']:.2f} |")
    rv = rep.get("reverb", {})
    out += ["", "## 3. dm-reverb", ""]
    if "checkpoint_idle" not in rv:
        out.append(f"not run: {rv.get('skipped') or rv.get('error')}")
    else:
        ci, d, rs = rv["checkpoint_idle"], rv["during"], rv.get("restore", {})
        scale = c["steps"] / rv["items"]
        mine = rep["save_load"].get("random-none", {})
        out += [f"{rv['items']:,} items of 4 KB ({rv['data_bytes'] / 1e9:.2f} GB; Reprise above: {c['steps']:,}). "
                f"Server in its own process, `DefaultCheckpointer`, `client.checkpoint()`; "
                f"writer: {rv['path']['fill']}; sampler: {rv['path']['sampler']}. "
                f"Versions: " + ", ".join(f"{k} {v}" for k, v in rv["versions"].items()) + ".", "",
                "| | Reverb | Reprise | Reprise / Reverb |", "|---|---|---|---|",
                f"| checkpoint GB/s (idle) | {gbs(ci['gb_per_s'])} ({ci['median_s']:.1f} s; "
                f"{scale:.0f}x the items: ~{ci['median_s'] * scale:.0f} s) | "
                + (f"{gbs(mine['save']['gb_per_s'])} ({mine['save']['median_s']:.1f} s) | "
                   f"{mine['save']['gb_per_s'] / ci['gb_per_s']:.0f}x |" if mine else "— | |"),
                f"| dirty page cache when the call returned | {ci['dirty_mib_after'][-1]:.0f} MiB (not fsynced) | every file fsynced | |"]
        if rs:
            out.append(f"| load GB/s, cold (Reverb: server constructor) | {gbs(rs['gb_per_s'])} ({rs['constructor_s']:.1f} s) | "
                       + (f"{gbs(mine['load']['cold']['gb_per_s'])} | {mine['load']['cold']['gb_per_s'] / rs['gb_per_s']:.0f}x |"
                          if mine and "cold" in mine["load"] else "— | |"))
        ref = rep["during"].get("headroom") or rep["during"].get("full") or {}
        out.append(f"| writer during checkpoint, % of without | {pct(d['writer_ratio'])} "
                   f"({d['writer_items_per_s_during']:,.0f} / {d['writer_items_per_s_without']:,.0f} items/s) | "
                   + "; ".join(f"{v['label'].split(' (')[0]}: {pct(v['writer_ratio'])}" for v in rep["during"].values()) + " | |")
        out.append(f"| sampler during checkpoint, % of without | {pct(d['sampler_ratio'])} "
                   f"({d['sampler_items_per_s_during']:,.0f} / {d['sampler_items_per_s_without']:,.0f} items/s) | "
                   + "; ".join(f"{v['label'].split(' (')[0]}: {pct(v['sampler_ratio'])}" for v in rep["during"].values()) + " | |")
        out.append(f"| longest writer / sampler pause during | {d['writer_longest_gap_during_s']:.2f} / "
                   f"{d['sampler_longest_gap_during_s']:.2f} s | "
                   + (f"{statistics.median(r['writer_longest_gap_during_s'] for r in ref['rounds']):.2f} / "
                      f"{statistics.median(r['sampler_longest_gap_during_s'] for r in ref['rounds']):.2f} s ({ref['label'].split(' (')[0]}) |"
                      if ref else "— |") + " |")
        out.append(f"| checkpoint under load | {d['checkpoint_s']:.1f} s | | |")
    out.append("")
    return "\n".join(out) + "\n"


# --- main -----------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small store, one round: checks the script")
    ap.add_argument("--steps", type=int, default=None, help="steps of 4 KB in the main store (default 1M)")
    ap.add_argument("--dir", default="/tmp/ckpt-bench", help="checkpoint directory on disk (removed after)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--zstd-rounds", type=int, default=1,
                    help="rounds of the zstd saves and loads (single-threaded zstd: slow)")
    ap.add_argument("--window", type=float, default=None, help="seconds of each no-save window")
    ap.add_argument("--reverb-items", type=int, default=None)
    ap.add_argument("--no-reverb", action="store_true")
    args = ap.parse_args()
    q = args.quick
    steps = args.steps or (65536 if q else 1_000_000)
    rounds = args.rounds or (1 if q else 3)
    window = args.window or (1.0 if q else 4.0)
    reverb_items = args.reverb_items or (5000 if q else 100_000)
    small = max(steps // 4, 1)
    zr = args.zstd_rounds
    try:
        import zstandard
        zstd = zstandard.__version__
    except ImportError:
        zstd = None

    now = dt.datetime.now()
    stem = f"checkpoint-{now:%Y%m%d-%H%M%S}" + ("-quick" if q else "")
    rep = {"date": now.isoformat(timespec="seconds"), "quick": q, "host": host_info(),
           "command": "PYTHONPATH=python python3.11 benchmarks/checkpoint_bench.py " + " ".join(sys.argv[1:]),
           "config": {"steps": steps, "item_bytes": ITEM_BYTES, "rounds": rounds, "zstd_rounds": zr, "window": window,
                      "reverb_items": reverb_items, "dir": args.dir, "compressible_steps": small,
                      "zstandard": zstd, "fill_chunk_items": CHUNK, "batch": BATCH},
           "save_load": {}, "during": {}}
    rep["loadavg_1m"] = {"start": os.getloadavg()[0]}
    if rep["loadavg_1m"]["start"] > 0.5:
        log(f"WARNING: load average {rep['loadavg_1m']['start']:.2f} at the start: the machine is busy")
    t_start = time.perf_counter()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    try:
        log("disk baseline")
        rep["disk"] = disk_baseline(args.dir, (256 << 20) if q else (1 << 30))
        log(f"disk: write+fsync {rep['disk']['write_fsync_gb_per_s']:.2f} GB/s, "
            f"cold read {rep['disk']['cold_read_gb_per_s']:.2f} GB/s")

        # 1 + 2a: the full 4 GB store
        log(f"filling {steps:,} steps of random data")
        t0 = time.perf_counter()
        table = make_table(steps, steps, steps, "random")
        rep["config"]["fill_s"] = time.perf_counter() - t0
        kept = {}
        for comp in [None] + (["zstd"] if zstd else []):
            key = f"random-{comp or 'none'}"
            s, kept[key] = bench_save(table, os.path.join(args.dir, key), rounds if comp is None else zr, comp)
            rep["save_load"][key] = {"data": "random float32", "compression": comp, "steps": steps, "save": s}
        log("throughput during a save: full store")
        rep["during"]["full"] = dict(label=f"full ({steps:,} steps, max_size {steps:,})",
                                     **bench_during(table, os.path.join(args.dir, "during"), rounds, window, 1.0))
        close(table)
        del table
        for key, path in kept.items():
            rep["save_load"][key]["load"] = bench_load(path, rounds if key.endswith("none") else zr, steps,
                                                       1 if key == "random-none" else 0)
            shutil.rmtree(path)

        # 2b: a store with headroom
        cap = steps + steps // 4
        log(f"throughput during a save: store of {cap:,} steps, table max_size {steps:,}")
        table = make_table(cap, steps, steps, "random", seed=2)
        rep["during"]["headroom"] = dict(label=f"25% headroom ({cap:,} steps, max_size {steps:,})",
                                         **bench_during(table, os.path.join(args.dir, "during"), rounds, window, 1.0))
        close(table)
        del table

        # 1b: compressible
        log(f"compressible: {small:,} steps of 8-bit values as float32")
        table = make_table(small, small, small, "bytes", seed=3)
        kept = {}
        for comp in [None] + (["zstd"] if zstd else []):
            key = f"compressible-{comp or 'none'}"
            s, kept[key] = bench_save(table, os.path.join(args.dir, key), rounds if comp is None else zr, comp)
            rep["save_load"][key] = {"data": "8-bit values as float32", "compression": comp, "steps": small, "save": s}
        close(table)
        del table
        for key, path in kept.items():
            rep["save_load"][key]["load"] = bench_load(path, rounds if key.endswith("none") else zr, small, 0)
            shutil.rmtree(path)
        rep["reprise_wall_s"] = time.perf_counter() - t_start
        rep["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        # 3: Reverb
        if args.no_reverb:
            rep["reverb"] = {"skipped": "--no-reverb"}
        else:
            rep["loadavg_1m"]["before_reverb"] = os.getloadavg()[0]
            t0 = time.perf_counter()
            rep["reverb"] = run_reverb(reverb_items, args.dir, window, timeout=900)
            rep["reverb_wall_s"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    rep["wall_s"] = time.perf_counter() - t_start
    rep["loadavg_1m"]["end"] = os.getloadavg()[0]

    md = build_markdown(rep)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, stem + ".json"), "w") as f:
        json.dump(rep, f, indent=1)
    with open(os.path.join(OUT, stem + ".md"), "w") as f:
        f.write(md)
    print(md)
    log(f"wrote {os.path.join(OUT, stem)}.json and .md ({rep['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()

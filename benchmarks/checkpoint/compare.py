"""Checkpoint benchmark (issue 6): ``rp.checkpoint.save`` / ``load`` speed, the
throughput of a writer and a sampler while a save runs, and dm-reverb's checkpoint of
the same kind of data.

    python3.11 -m benchmarks.checkpoint.compare           # ~8 minutes on 2 cores
    python3.11 -m benchmarks.checkpoint.compare --quick   # smoke test (seconds); numbers are noise

Run it from the repository root with the Python that has ``reprise`` installed.

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
   Skipped (a line on stderr says so) when the venv is missing.

Parts 1 and 2 are in ``measure.py``, the tables in ``report.py``. Writes
``benchmarks/out/checkpoint-<date>.json`` and ``.md`` (``--out-dir`` elsewhere); the
table on stdout.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time

from benchmarks.checkpoint.measure import (BATCH, CHUNK, ITEM_BYTES, bench_during, bench_load,
                                           bench_save, close, disk_baseline, log, make_table)
from benchmarks.checkpoint.report import build_markdown
from benchmarks.common.config import Config
from benchmarks.common.driver import (OUT, command_line, interpreter_for, new_report, run_system,
                                      write_outputs)

# The run's sizes; each can be overridden by its option (--steps, --rounds, ...).
FULL = dict(steps=1_000_000, rounds=3, window=4.0, warmup=1.0, reverb_items=100_000,
            disk_baseline_bytes=1 << 30)
QUICK = dict(steps=16_384, rounds=1, window=0.3, warmup=0.2, reverb_items=5_000,
             disk_baseline_bytes=32 << 20)


# --- 3. Reverb ------------------------------------------------------------------------------
def run_reverb(items: int, directory: str, window: float, timeout: float, log_path: str) -> dict:
    py, why = interpreter_for("reverb", sys.executable)
    if py is None:
        log(f"reverb: SKIPPED: {why}")
        return {"skipped": why}
    return run_system("reverb", py, "benchmarks.peers.reverb_checkpoint",
                      ["--items", str(items), "--dir", os.path.join(directory, "reverb"),
                       "--window", str(window)],
                      timeout=timeout, log_path=log_path, echo=lambda line: True)


# --- main -----------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small store, one round, short windows: a smoke test, numbers are noise")
    ap.add_argument("--steps", type=int, default=None, help="steps of 4 KB in the main store (default 1M)")
    ap.add_argument("--dir", default="/tmp/ckpt-bench", help="checkpoint directory on disk (removed after)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--zstd-rounds", type=int, default=1,
                    help="rounds of the zstd saves and loads (single-threaded zstd: slow)")
    ap.add_argument("--window", type=float, default=None, help="seconds of each no-save window")
    ap.add_argument("--reverb-items", type=int, default=None)
    ap.add_argument("--no-reverb", action="store_true")
    ap.add_argument("--out-dir", default=OUT,
                    help="where the .json and .md files go (default benchmarks/out)")
    args = ap.parse_args()
    q = args.quick
    cfg = Config.choose(q, None, FULL, QUICK).override(args, "steps", "rounds", "window", "reverb_items")
    steps, rounds, window, reverb_items = cfg.steps, cfg.rounds, cfg.window, cfg.reverb_items
    small = max(steps // 4, 1)
    zr = args.zstd_rounds
    try:
        import zstandard
        zstd = zstandard.__version__
    except ImportError:
        zstd = None

    stem, rep = new_report(
        "checkpoint", q, args.out_dir, command=command_line(__spec__.name),
        config={"steps": steps, "item_bytes": ITEM_BYTES, "rounds": rounds, "zstd_rounds": zr, "window": window,
                "reverb_items": reverb_items, "dir": args.dir, "compressible_steps": small,
                "zstandard": zstd, "fill_chunk_items": CHUNK, "batch": BATCH, "warmup": cfg.warmup},
        save_load={}, during={})
    rep["loadavg_1m"] = {"start": os.getloadavg()[0]}
    if rep["loadavg_1m"]["start"] > 0.5:
        log(f"WARNING: load average {rep['loadavg_1m']['start']:.2f} at the start: the machine is busy")
    t_start = time.perf_counter()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    try:
        log("disk baseline")
        rep["disk"] = disk_baseline(args.dir, cfg.disk_baseline_bytes)
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
                                     **bench_during(table, os.path.join(args.dir, "during"), rounds, window,
                                                    cfg.warmup))
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
                                         **bench_during(table, os.path.join(args.dir, "during"), rounds, window,
                                                        cfg.warmup))
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
            rep["reverb"] = run_reverb(reverb_items, args.dir, window, timeout=900,
                                       log_path=os.path.join(args.out_dir, f"{stem}-reverb.log"))
            rep["reverb_wall_s"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    rep["wall_s"] = time.perf_counter() - t_start
    rep["loadavg_1m"]["end"] = os.getloadavg()[0]

    write_outputs(args.out_dir, stem, rep, build_markdown(rep))


if __name__ == "__main__":
    main()

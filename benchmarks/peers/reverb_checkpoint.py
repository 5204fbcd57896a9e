"""dm-reverb's checkpoint of a 4 KB-item table, for ``benchmarks.checkpoint.compare``; run
with the reverb venv's python from the repository root:

    benchmarks/.venvs/reverb/bin/python -m benchmarks.peers.reverb_checkpoint --items N --dir D

The server runs in its own process (this module started with ``--serve``) with one
table ``Uniform`` (uniform sampler, FIFO remover, ``max_size`` = items, one-step items
of one float32[1, 1024] field) and ``DefaultCheckpointer(path=DIR)``; this process is
the client, over loopback gRPC, as Reverb's users run it.

1. Fill: ``StructuredWriter`` (items made in C++ from an ``x[-1:]`` pattern), one
   ``append`` per step, ``flush()`` every 32 items (the fastest write path, as in
   ``reverb_core.py``); random float32 rows.
2. ``client.checkpoint()`` on the idle server, ``--rounds`` times (each checkpoint is
   deleted after it is timed).
3. Throughput during a checkpoint: a writer thread (the same append/flush loop) and a
   sampler thread (a persistent ``TrajectoryDataset`` stream, batches of 256) run
   continuously; items/s of each over ``--window`` s without a checkpoint, then over
   the duration of one ``client.checkpoint()`` from the main thread.
4. Restore: a new server process started over the checkpoint directory (Reverb loads
   the newest checkpoint when the server is constructed); the time of the
   ``reverb.Server(...)`` constructor, measured inside the server process.

Prints one JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks.checkpoint.load import Load, compare_windows  # noqa: E402  (after the TF log level)
from benchmarks.common.page_cache import du, evict, resident  # noqa: E402
from benchmarks.common.processes import ready_until_stdin_closes, serve_if_asked  # noqa: E402
from benchmarks.peers.reverb_common import ServerProcess, structured_writer, x_table  # noqa: E402

FLOATS = 1024  # 4 KB items
FLUSH_EVERY = 32
TABLE = "Uniform"


def log(msg: str) -> None:
    print(f"[reverb] {msg}", file=sys.stderr, flush=True)


def dirty_mib() -> float:
    """Dirty page cache, MiB (/proc/meminfo): written but not yet on disk."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Dirty:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# --- server process -------------------------------------------------------------------
def serve(spec_json: str) -> None:
    """Build the table and the checkpointer, print ``READY port seconds``
    (seconds: the Server constructor, which loads the newest checkpoint), serve until
    stdin closes."""
    import reverb
    import tensorflow as tf

    spec = json.loads(spec_json)
    t = spec["table"]
    sig = {f: tf.TensorSpec(shape, getattr(tf, dtype)) for f, (shape, dtype) in t["fields"].items()}
    table = reverb.Table(name=t["name"], sampler=reverb.selectors.Uniform(),
                         remover=reverb.selectors.Fifo(), max_size=t["max_size"],
                         rate_limiter=reverb.rate_limiters.MinSize(1), signature=sig)
    ckpt = reverb.checkpointers.DefaultCheckpointer(path=spec["checkpoint_dir"])
    t0 = time.perf_counter()
    server = reverb.Server(tables=[table], port=None, checkpointer=ckpt)
    ready_until_stdin_closes(server.port, f"{time.perf_counter() - t0:.6f}")
    server.stop()


class Server(ServerProcess):
    """ServerProcess that also keeps the constructor time from the READY line."""

    def __init__(self, items: int, ckpt_dir: str) -> None:
        spec = {"table": x_table(TABLE, FLOATS, items), "checkpoint_dir": ckpt_dir}
        super().__init__(__spec__.name, spec, stop_timeout=120)   # our serve() reads this dict
        self.construct_s = float(self.extra[0])


# --- client side ----------------------------------------------------------------------
def rows(n: int, seed: int):
    import numpy as np
    rng = np.random.default_rng(seed)
    return [{"x": r} for r in rng.standard_normal((n, FLOATS), dtype=np.float32)]  # one step: [1024]


def fill(client, items: int) -> dict:
    w = structured_writer(client, TABLE)
    steps = rows(4096, 1)  # 16 MB of distinct random rows, cycled
    t0 = time.perf_counter()
    done = 0
    while done < items:
        for s in steps[: min(len(steps), items - done)]:
            w.append(s)
            done += 1
            if done % FLUSH_EVERY == 0:
                w.flush()
        if done % (64 * 4096) == 0:
            log(f"filled {done:,} / {items:,}")
    w.flush()
    dt = time.perf_counter() - t0
    size = client.server_info()[TABLE].current_size
    return {"seconds": dt, "items_per_s": items / dt, "table_size": size}


def timed_checkpoint(client, ckpt_dir: str) -> dict:
    t0 = time.perf_counter()
    path = client.checkpoint()
    dt = time.perf_counter() - t0
    return {"seconds": dt, "t0": t0, "t1": t0 + dt, "path": path, "bytes_on_disk": du(path),
            "dirty_mib_after": dirty_mib()}


def background_load(client, address: str, batch: int = 256) -> Load:
    """The :class:`~benchmarks.checkpoint.load.Load` of a checkpoint: the writer appends
    ``FLUSH_EVERY`` steps and flushes per call, the sampler draws ``batch`` from a
    persistent dataset stream."""
    import reverb
    import tensorflow as tf
    w = structured_writer(client, TABLE)
    steps = itertools.cycle(rows(1024, 2))
    ds = reverb.TrajectoryDataset(
        server_address=address, table=TABLE, dtypes={"x": tf.float32},
        shapes={"x": tf.TensorShape([1, FLOATS])}, max_in_flight_samples_per_worker=batch)
    it = iter(ds.batch(batch, drop_remainder=True))

    def write() -> int:
        for _ in range(FLUSH_EVERY):
            w.append(next(steps))
        w.flush()
        return FLUSH_EVERY

    def sample() -> int:
        next(it).data["x"].numpy()
        return batch

    return Load(write, sample)


def main() -> None:
    if serve_if_asked(serve):
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--dir", required=True, help="checkpoint root (emptied first, removed after)")
    ap.add_argument("--rounds", type=int, default=1, help="idle checkpoints to time")
    ap.add_argument("--window", type=float, default=4.0, help="seconds of the no-checkpoint window")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--no-restore", action="store_true")
    args = ap.parse_args()

    import reverb

    item_bytes = FLOATS * 4
    from importlib.metadata import version
    out = {"system": "reverb", "versions": {p: version(p) for p in ("dm-reverb", "tensorflow", "numpy")},
           "items": args.items, "item_bytes": item_bytes, "data_bytes": args.items * item_bytes,
           "path": {"fill": f"StructuredWriter(x[-1:]).append, flush() every {FLUSH_EVERY}",
                    "sampler": "TrajectoryDataset(max_in_flight_samples_per_worker=256).batch(256)",
                    "checkpoint": "reverb.checkpointers.DefaultCheckpointer(path); client.checkpoint()",
                    "restore": "reverb.Server(tables, checkpointer=DefaultCheckpointer(path)) constructor"}}
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    server = Server(args.items, args.dir)
    try:
        client = reverb.Client(server.address)
        log(f"filling {args.items:,} items of {item_bytes} B")
        out["fill"] = fill(client, args.items)
        log(f"fill: {out['fill']['items_per_s']:,.0f} items/s")
        out["server_rss_mib_after_fill"] = server.rss_mib()

        idle = []
        for r in range(args.rounds):
            c = timed_checkpoint(client, args.dir)
            log(f"idle checkpoint {r + 1}: {c['seconds']:.2f}s, {c['bytes_on_disk'] / 1e9:.2f} GB on disk")
            idle.append(c)
        secs = [c["seconds"] for c in idle]
        out["checkpoint_idle"] = {"seconds": secs, "median_s": statistics.median(secs),
                                  "dirty_mib_after": [c["dirty_mib_after"] for c in idle],
                                  "gb_per_s": out["data_bytes"] / statistics.median(secs) / 1e9,
                                  "bytes_on_disk": idle[-1]["bytes_on_disk"]}

        log("throughput without / during a checkpoint")
        load = background_load(client, server.address)
        time.sleep(args.warmup)
        w0 = time.perf_counter()
        time.sleep(args.window)
        w1 = time.perf_counter()
        c = timed_checkpoint(client, args.dir)
        time.sleep(0.5)
        load.stop()
        keep = None if args.no_restore else c["path"]  # Reverb keeps only its newest checkpoints
        out["checkpoints_left"] = sorted(os.listdir(args.dir))
        d = {"window_s": w1 - w0, "checkpoint_s": c["seconds"],
             **compare_windows(load, (w0, w1), (c["t0"], c["t1"])), "errors": load.errors}
        out["during"] = d
        log(f"during a {c['seconds']:.2f}s checkpoint: writer {d['writer_items_per_s_during']:,.0f} vs "
            f"{d['writer_items_per_s_without']:,.0f} items/s, sampler {d['sampler_items_per_s_during']:,.0f} "
            f"vs {d['sampler_items_per_s_without']:,.0f} items/s; errors: {load.errors}")
    finally:
        server.stop()

    if keep:
        log("restore: a new server over the checkpoint (its files dropped from the page cache)")
        evict(keep)
        res = resident(keep)
        t0 = time.perf_counter()
        server = Server(args.items, args.dir)
        wall = time.perf_counter() - t0
        try:
            client = reverb.Client(server.address)
            size = client.server_info()[TABLE].current_size
            out["restore"] = {"constructor_s": server.construct_s, "process_start_to_ready_s": wall,
                              "table_size": size, "page_cache_resident_before": res,
                              "gb_per_s": out["data_bytes"] / server.construct_s / 1e9}
            log(f"restore: {server.construct_s:.2f}s ({size:,} items)")
        finally:
            server.stop()
    if not os.environ.get("REVERB_CKPT_KEEP"):
        shutil.rmtree(args.dir, ignore_errors=True)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

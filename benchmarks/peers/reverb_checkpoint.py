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
import json
import os
import shutil
import statistics
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks.common.page_cache import evict, resident  # noqa: E402  (after the TF log level)
from benchmarks.peers.reverb_common import ServerProcess, x_table  # noqa: E402

FLOATS = 1024  # 4 KB items
FLUSH_EVERY = 32
TABLE = "Uniform"


def log(msg: str) -> None:
    print(f"[reverb] {msg}", file=sys.stderr, flush=True)


def du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


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
    print(f"READY {server.port} {time.perf_counter() - t0:.6f}", flush=True)
    sys.stdin.read()
    server.stop()


class Server(ServerProcess):
    """ServerProcess that also keeps the constructor time from the READY line."""

    def __init__(self, items: int, ckpt_dir: str) -> None:
        spec = {"table": x_table(TABLE, FLOATS, items), "checkpoint_dir": ckpt_dir}
        super().__init__(__spec__.name, spec, stop_timeout=120)   # our serve() reads this dict
        self.construct_s = float(self.extra[0])


# --- client side ----------------------------------------------------------------------
def writer(client):
    from reverb import structured_writer as sw
    pattern = sw.pattern_from_transform({"x": None}, lambda ref: {"x": ref["x"][-1:]})
    cfg = sw.create_config(pattern, table=TABLE, priority=sw.constant_priority_fn(1.0))
    return client.structured_writer([cfg])


def rows(n: int, seed: int):
    import numpy as np
    rng = np.random.default_rng(seed)
    return [{"x": r} for r in rng.standard_normal((n, FLOATS), dtype=np.float32)]  # one step: [1024]


def fill(client, items: int) -> dict:
    w = writer(client)
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


class Load:
    """A writer thread and a sampler thread, running until stop(); each records
    (time, items) after every flush / batch."""

    def __init__(self, client, address: str, batch: int = 256) -> None:
        import reverb
        import tensorflow as tf
        self.stop_flag = threading.Event()
        self.w_marks: list[tuple[float, int]] = []
        self.s_marks: list[tuple[float, int]] = []
        self.errors: list[str] = []
        self.w = writer(client)
        self.steps = rows(1024, 2)
        ds = reverb.TrajectoryDataset(
            server_address=address, table=TABLE, dtypes={"x": tf.float32},
            shapes={"x": tf.TensorShape([1, FLOATS])}, max_in_flight_samples_per_worker=batch)
        self.it = iter(ds.batch(batch, drop_remainder=True))
        self.batch = batch
        self.threads = [threading.Thread(target=self._write, daemon=True),
                        threading.Thread(target=self._sample, daemon=True)]
        for t in self.threads:
            t.start()

    def _write(self) -> None:
        try:
            n = 0
            while not self.stop_flag.is_set():
                for s in self.steps:
                    self.w.append(s)
                    n += 1
                    if n % FLUSH_EVERY == 0:
                        self.w.flush()
                        self.w_marks.append((time.perf_counter(), n))
                    if self.stop_flag.is_set():
                        break
            self.w.flush()
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"writer: {type(e).__name__}: {e}")

    def _sample(self) -> None:
        try:
            n = 0
            while not self.stop_flag.is_set():
                s = next(self.it)
                s.data["x"].numpy()
                n += self.batch
                self.s_marks.append((time.perf_counter(), n))
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"sampler: {type(e).__name__}: {e}")

    def stop(self) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=60)


def rate(marks: list[tuple[float, int]], t0: float, t1: float) -> float:
    """Items/s between t0 and t1 from cumulative (time, count) marks."""
    before = [n for t, n in marks if t <= t0]
    upto = [n for t, n in marks if t <= t1]
    a = before[-1] if before else 0
    b = upto[-1] if upto else 0
    return (b - a) / (t1 - t0) if t1 > t0 else 0.0


def max_gap(marks: list[tuple[float, int]], t0: float, t1: float) -> float:
    ts = [t0] + [t for t, _ in marks if t0 < t < t1] + [t1]
    return max(b - a for a, b in zip(ts, ts[1:]))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
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
        load = Load(client, server.address)
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
             "writer_items_per_s_without": rate(load.w_marks, w0, w1),
             "writer_items_per_s_during": rate(load.w_marks, c["t0"], c["t1"]),
             "sampler_items_per_s_without": rate(load.s_marks, w0, w1),
             "sampler_items_per_s_during": rate(load.s_marks, c["t0"], c["t1"]),
             "writer_longest_gap_during_s": max_gap(load.w_marks, c["t0"], c["t1"]),
             "sampler_longest_gap_during_s": max_gap(load.s_marks, c["t0"], c["t1"]),
             "errors": load.errors}
        for k in ("writer", "sampler"):
            wo = d[f"{k}_items_per_s_without"]
            d[f"{k}_ratio"] = d[f"{k}_items_per_s_during"] / wo if wo else None
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

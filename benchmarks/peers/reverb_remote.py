"""dm-reverb side of the remote comparison; run with benchmarks/.venvs/reverb/bin/python:
``benchmarks/.venvs/reverb/bin/python -m benchmarks.peers.reverb_remote [--quick]`` (from
the repository root).

As Reverb's users run it: one ``reverb.Server`` in its own process (this module with
``--serve``; tables from ``reverb_common``: Uniform sampler, Fifo remover, ``max_size`` =
the config's ``table_items``, MinSize(1), signature ``x: float32[1, floats]``: an item is
one step), filled to ``max_size`` by this process before timing, and every client a spawned
process with its own ``reverb.Client`` over loopback gRPC. Paths (the fastest Reverb offers without
TensorFlow datasets; the environment variables switch):

* insert: ``StructuredWriter`` (items made in C++ from an ``x[-1:]`` pattern, priority
  1.0); one call = BATCH ``append`` calls with ``flush(block_until_num_items=0)`` every
  32 items (Reverb warns and slows past ~40 pending items; REVERB_FLUSH_EVERY changes
  it) and ``flush()`` at the end: the items are then in the table. Reverb has no
  batched insert. REVERB_WRITE_PATH=trajectory: ``TrajectoryWriter.append`` +
  ``create_item`` per step instead.
* step_insert (issue 18's actor loop): ``client.trajectory_writer(num_keep_alive_refs=1)``
  kept open; one call = STEP_CHUNK (32) times ``append({"x": step})`` + ``create_item(table,
  1.0, {"x": history["x"][-1:]})``, then ``flush()`` (items in the table): the same work
  as Reprise's ``append`` + ``create_item``, and Reverb's flush cadence.
* sample, sample256: a persistent sampler stream per table and batch size,
  ``Client._client.NewSampler(table, -1, max_in_flight)`` (what ``Client.sample`` uses,
  but kept open and with more than one sample in flight: ``Client.sample`` opens a stream
  per call with one in flight), max_in_flight = REVERB_IN_FLIGHT x the batch (default 2
  batches: 512 samples in flight for sample256); one call = batch ``GetNextTrajectory``
  copied into one numpy ``[batch, 1, floats]``. It streams samples one by one, so 256 x
  400 KB needs no message above the limit. This stream is already pipelined: Reprise's
  ``iterate`` points are compared with it (Reverb does not run them).
  REVERB_SAMPLE_PATH=client: ``Client.sample(table, batch)`` per call (what a new user's
  ``client.sample(256)`` loop does); REVERB_SAMPLE_PATH=dataset: a ``TrajectoryDataset``
  stream ``.batch(batch)``.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402  (after the TF log level)

from benchmarks.common.bench import package_versions  # noqa: E402
from benchmarks.common.payload import payload  # noqa: E402
from benchmarks.common.processes import ServerProcess, serve_if_asked  # noqa: E402
from benchmarks.peers.reverb_common import serve, step_writer, x_table  # noqa: E402
from benchmarks.remote.workloads import (PIPELINED, STEP_CHUNK, WORKLOADS, batch_of,  # noqa: E402
                                         batch_rows, floats, remote_bench, run_points, table_name,
                                         table_specs, used_tables)

FLUSH_EVERY = int(os.environ.get("REVERB_FLUSH_EVERY", "32"))
WRITE_PATH = os.environ.get("REVERB_WRITE_PATH", "structured")
SAMPLE_PATH = os.environ.get("REVERB_SAMPLE_PATH", "sampler")
IN_FLIGHT = float(os.environ.get("REVERB_IN_FLIGHT", "2"))


# --- writers and samplers (in any process) -----------------------------------------------
def writer_for(client, table: str, path: str = WRITE_PATH):
    """(append(step), flush(**kw), close) of a write path ("structured" or "trajectory")."""
    return step_writer(client, table, path)


def insert_call(client, table: str, rows: np.ndarray):
    """One call: len(rows) one-step items, flushed every FLUSH_EVERY and at the end."""
    append, flush, close = writer_for(client, table)
    steps = [{"x": r} for r in rows]    # float32[floats]: an item (x[-1:]) is [1, floats]

    def call() -> None:
        for i, s in enumerate(steps, 1):
            append(s)
            if i % FLUSH_EVERY == 0 and i < len(steps):
                flush(block_until_num_items=0)
        flush()
    return call, close


def step_insert_call(client, table: str, rows: np.ndarray):
    """One call: len(rows) steps, each ``append`` + ``create_item`` of a TrajectoryWriter
    kept open, then ``flush()``."""
    append, flush, close = writer_for(client, table, "trajectory")
    steps = [{"x": r} for r in rows]

    def call() -> None:
        for s in steps:
            append(s)
        flush()
    return call, close


def sample_call(client, address: str, table: str, label: str, n: int):
    k = floats(label)
    if SAMPLE_PATH == "client":
        def call() -> np.ndarray:
            return np.stack([s[0].data[0] for s in client.sample(table, num_samples=n)])
        return call, lambda: None
    if SAMPLE_PATH == "dataset":
        import reverb
        import tensorflow as tf
        ds = reverb.TrajectoryDataset(server_address=address, table=table,
                                      dtypes={"x": tf.float32},
                                      shapes={"x": tf.TensorShape([1, k])},
                                      max_in_flight_samples_per_worker=int(IN_FLIGHT * n))
        it = iter(ds.batch(n, drop_remainder=True))
        return (lambda: next(it).data["x"].numpy()), lambda: None
    sampler = client._client.NewSampler(table, -1, int(IN_FLIGHT * n))
    n_info = sampler.NUM_INFO_TENSORS

    def call() -> np.ndarray:
        data = np.empty((n, 1, k), np.float32)
        for i in range(n):
            data[i] = sampler.GetNextTrajectory()[n_info]
        return data
    return call, sampler.Close if hasattr(sampler, "Close") else (lambda: None)


def path_of(op: str, label: str) -> str:
    n = batch_of(op, label)
    if op == "insert":
        how = ("TrajectoryWriter.append + create_item(x[-1:])" if WRITE_PATH == "trajectory"
               else "StructuredWriter(x[-1:]).append")
        return (f"{how} x {n}, flush(block_until_num_items=0) every {FLUSH_EVERY} items and "
                "flush() at the end of each call")
    if op == "step_insert":
        return (f"trajectory_writer(num_keep_alive_refs=1) kept open: {n} x (append(step) + "
                "create_item(table, 1.0, x[-1:])) + flush() per call")
    if SAMPLE_PATH == "client":
        return f"Client.sample(table, {n}) per call (a new stream, 1 sample in flight)"
    if SAMPLE_PATH == "dataset":
        return (f"TrajectoryDataset(max_in_flight_samples_per_worker={int(IN_FLIGHT * n)})"
                f".batch({n}), .numpy()")
    return (f"persistent Client._client.NewSampler(table, -1, max_in_flight={int(IN_FLIGHT * n)}); "
            f"{n} GetNextTrajectory per call into one numpy [{n}, 1, floats]")


# --- client processes --------------------------------------------------------------------
def client_setup(index: int, address: str):
    import reverb

    client = reverb.Client(address)

    def make(op: str, label: str):
        table = table_name(op, label)
        if op == "insert":
            return insert_call(client, table, batch_rows(label, 100 + index))
        if op == "step_insert":
            return step_insert_call(client, table, batch_rows(label, 200 + index, STEP_CHUNK))
        return sample_call(client, address, table, label, batch_of(op, label))
    return make


def fill(client, spec: dict) -> float:
    """Fill a table to max_size with one-step items (random rows used over and over)."""
    t0 = time.monotonic()
    append, flush, close = writer_for(client, spec["name"])
    rows = payload(min(spec["items"], 256), spec["floats"], seed=7)
    steps = [{"x": r} for r in rows]
    for i in range(spec["items"]):
        append(steps[i % len(steps)])
        if (i + 1) % FLUSH_EVERY == 0:
            flush(block_until_num_items=0)
    flush()
    close()
    size = client.server_info()[spec["name"]].current_size
    if size != spec["items"]:
        raise RuntimeError(f"{spec['name']}: filled to {size} items, expected {spec['items']}")
    return time.monotonic() - t0


def main() -> None:
    if serve_if_asked(serve):
        return
    bench = remote_bench("reverb")
    bench.versions.update(package_versions("dm-reverb", "tensorflow"))
    import reverb
    specs = used_tables(bench.cfg, table_specs(bench.cfg))
    server = ServerProcess(__spec__.name,
                           [x_table(s["name"], s["floats"], s["items"]) for s in specs])
    clients = max(bench.cfg.clients)
    bench.notes.append(f"reverb.Server in its own process at {server.address}; "
                       f"{clients} client processes with reverb.Client(address)")
    bench.notes.append("Reprise's pipelined points (" + ", ".join(PIPELINED) + ") are compared "
                       "with Reverb's " + ", ".join(sorted(set(PIPELINED.values())))
                       + " points: its sampler is already a stream with "
                       f"{IN_FLIGHT:g} batches in flight")
    try:
        client = reverb.Client(server.address)
        for s in specs:
            bench.log(f"filled {s['name']} ({s['items']} items) in {fill(client, s):.1f}s")
        run_points(bench, server, client_setup, path_of,
                   ops=[op for op, *_ in WORKLOADS if op not in PIPELINED])
    finally:
        server.stop()
    bench.finish()


if __name__ == "__main__":
    main()

"""Reverb side of the core comparison; run with benchmarks/.venvs/reverb/bin/python:
``benchmarks/.venvs/reverb/bin/python -m benchmarks.peers.reverb_core [--quick]`` (from the
repository root).

As Reverb's users run it: the server lives in its own process (this module started
with ``--serve``) and the benchmark talks to it over loopback gRPC. Paths, chosen as
the fastest Reverb documents (override with the environment variables below):

* writes: ``StructuredWriter`` (items created in C++ from a ``x[-1:]`` pattern), one
  ``append`` per step, ``flush()`` every 32 items to bound run-ahead (more than ~40
  pending items make Reverb warn and slow down; REVERB_FLUSH_EVERY / REVERB_FLUSH_KEEP
  change the interval and ``block_until_num_items``). Reverb has no batched insert, so
  ``insert_batched`` appends the 256 rows one by one. ``REVERB_WRITE_PATH=trajectory``
  switches to ``TrajectoryWriter.append`` + ``create_item``.
* samples: one persistent ``TrajectoryDataset`` stream per table (tf.data batches 256
  in C++), ``max_in_flight_samples_per_worker=256``. ``REVERB_SAMPLE_PATH=sampler``
  switches to a persistent low-level sampler stream (``Client.sample`` opens a new
  stream per call and holds one sample in flight; far slower).
* priorities: ``Client.mutate_priorities`` with the 256 sampled keys. The dataset
  stream samples ahead of the updates (up to 256 in flight), as it does in training.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402  (after the TF log level)

from benchmarks.common.bench import Bench, package_versions  # noqa: E402
from benchmarks.common.payload import (PriorityStream, check_batch, fill_rows,  # noqa: E402
                                       floats_for, payload, random_priorities)
from benchmarks.common.processes import serve_if_asked  # noqa: E402
from benchmarks.core.workloads import (PRIO_ITEM_BYTES, SIZES, Workload,  # noqa: E402
                                       core_bench, standard_suite)
from benchmarks.peers.reverb_common import ServerProcess, serve, step_writer, x_table  # noqa: E402

FLUSH_EVERY = int(os.environ.get("REVERB_FLUSH_EVERY", "32"))
FLUSH_KEEP = int(os.environ.get("REVERB_FLUSH_KEEP", "0"))  # block_until_num_items
PRIO_LEVELS = 16  # StructuredWriter priorities are per config: one config per level


# --- benchmark process ----------------------------------------------------------------
class ReverbSystem:
    def __init__(self, bench: Bench) -> None:
        import reverb
        import tensorflow as tf

        self.reverb, self.tf = reverb, tf
        self.bench = bench
        self.write_path = os.environ.get("REVERB_WRITE_PATH", "structured")
        self.sample_path = os.environ.get("REVERB_SAMPLE_PATH", "dataset")
        cfg = bench.cfg
        specs = []
        for label, size in SIZES:
            k = floats_for(size)
            cap = cfg.insert_capacity_items[label]
            specs.append(x_table(f"batched_{k}", k, cap))
            specs.append(x_table(f"step_{k}", k, cap))
            specs.append(x_table(f"uniform_{k}", k, cfg.sample_table_items_by_size[label]))
        specs.append(dict(x_table("prio", floats_for(PRIO_ITEM_BYTES), cfg.prio_table_items),
                          sampler="prioritized", exponent=0.6))
        self.server = ServerProcess(__spec__.name, specs, stop_timeout=30)
        self.client = reverb.Client(self.server.address)

    def close(self) -> None:
        self.server.stop()

    def table_size(self, table: str) -> int:
        return self.client.server_info()[table].current_size

    # -- writers -------------------------------------------------------------------
    def _writer(self, table: str, priorities: list[float] | None = None):
        """Return (append_fn, flush_fn) for one-step items into table."""
        return step_writer(self.client, table, self.write_path, priorities, keep_alive=FLUSH_EVERY)

    def _fill(self, table: str, floats: int, n_items: int, priorities=None,
              time_limit: float | None = None) -> int:
        append, flush, close = self._writer(table, priorities)
        rows = payload(fill_rows(n_items, floats, 1024), floats)  # [n,k]; each row is a [k] step
        steps = [{"x": r} for r in rows]
        t_end = None if time_limit is None else time.perf_counter() + time_limit
        done = 0
        while done < n_items:
            for s in steps[: min(len(steps), n_items - done)]:
                append(s)
                done += 1
                if done % FLUSH_EVERY == 0:
                    flush(block_until_num_items=FLUSH_KEEP)
            if t_end is not None and time.perf_counter() > t_end:
                break
        flush()
        close()
        return done

    def _insert(self, table: str, floats: int, capacity: int, steps_per_call: int,
                path: str) -> Workload:
        self._fill(table, floats, capacity)  # wrap once, as the other systems do
        append, flush, close = self._writer(table)
        rows = payload(steps_per_call, floats)
        steps = [{"x": r} for r in rows]

        def call() -> None:
            for i, s in enumerate(steps, 1):
                append(s)
                if i % FLUSH_EVERY == 0:
                    flush(block_until_num_items=FLUSH_KEEP)

        def done() -> None:
            flush()
            close()
            self.client.reset(table)

        return Workload(call=call, units_per_call=steps_per_call, path=path, close=done)

    def insert_batched(self, floats: int, capacity: int, batch: int) -> Workload:
        return self._insert(f"batched_{floats}", floats, capacity, batch,
                            path=f"{self._write_desc()}: 256 appends per call "
                                 "(Reverb has no batched insert)")

    def insert_step(self, floats: int, capacity: int) -> Workload:
        return self._insert(f"step_{floats}", floats, capacity, 256,
                            path=f"{self._write_desc()}: one append per item")

    def _write_desc(self) -> str:
        if self.write_path == "trajectory":
            return ("TrajectoryWriter.append+create_item, "
                    f"flush(block_until_num_items={FLUSH_KEEP}) every {FLUSH_EVERY} items")
        return (f"StructuredWriter(x[-1:]).append, flush(block_until_num_items={FLUSH_KEEP}) "
                f"every {FLUSH_EVERY} items")

    # -- samplers ------------------------------------------------------------------
    def _stream(self, table: str, floats: int, batch: int):
        """Return (next_batch() -> (keys, data[batch,1,k]), close, description)."""
        if self.sample_path == "sampler":
            sampler = self.client._client.NewSampler(table, -1, batch)  # persistent stream
            n_info = sampler.NUM_INFO_TENSORS

            def next_batch():
                keys = np.empty(batch, np.uint64)
                data = np.empty((batch, 1, floats), np.float32)
                for i in range(batch):
                    t = sampler.GetNextTrajectory()
                    keys[i] = t[0]
                    data[i] = t[n_info]
                return keys, data

            return next_batch, lambda: None, ("persistent pybind Sampler stream "
                                              f"(max_in_flight={batch}), 256 GetNextTrajectory")
        tf = self.tf
        ds = self.reverb.TrajectoryDataset(
            server_address=self.server.address, table=table,
            dtypes={"x": tf.float32}, shapes={"x": tf.TensorShape([1, floats])},
            max_in_flight_samples_per_worker=batch)
        it = iter(ds.batch(batch, drop_remainder=True))

        def next_batch():
            s = next(it)
            return s.info.key.numpy(), s.data["x"].numpy()

        return next_batch, lambda: None, (f"TrajectoryDataset(max_in_flight_samples_per_worker="
                                          f"{batch}).batch(256), .numpy()")

    def sample_uniform(self, floats: int, n_items: int, batch: int) -> Workload:
        table = f"uniform_{floats}"
        self._fill(table, floats, n_items)
        size = self.table_size(table)
        assert size == n_items, (size, n_items)
        next_batch, close, desc = self._stream(table, floats, batch)
        check_batch(next_batch()[1], batch, floats)

        def done() -> None:
            close()
            self.client.reset(table)

        return Workload(call=lambda: next_batch()[1], units_per_call=batch, path=desc,
                        close=done, extra={"server_rss_mib": self.server.rss_mib()})

    def prioritized(self, floats: int, n_items: int, batch: int, exponent: float) -> Workload:
        table = "prio"
        levels = random_priorities(PRIO_LEVELS).tolist()
        limit = 60.0 if self.bench.cfg.quick else 150.0
        t0 = time.perf_counter()
        self._fill(table, floats, n_items,
                   priorities=None if self.write_path == "trajectory" else levels,
                   time_limit=limit)
        fill_s = time.perf_counter() - t0
        size = self.table_size(table)
        note = None
        if size < n_items:
            note = (f"table filled to {size:,} of {n_items:,} items: Reverb's fill ran "
                    f"{fill_s:.0f}s (limit {limit:.0f}s) at {size / fill_s:,.0f} items/s")
        next_batch, close, desc = self._stream(table, floats, batch)
        new = PriorityStream(batch)
        mutate = self.client.mutate_priorities

        def call() -> None:
            keys, _ = next_batch()
            mutate(table, updates=dict(zip(keys.tolist(), new.next().tolist())))

        def done() -> None:
            close()
            self.client.reset(table)

        fill = (f"{PRIO_LEVELS} StructuredWriter configs with constant priorities, round-robin"
                if self.write_path != "trajectory" else "TrajectoryWriter, priority 1.0")
        return Workload(call=call, units_per_call=1,
                        path=f"{desc} + Client.mutate_priorities(256); fill: {fill}",
                        close=done, note=note,
                        extra={"table_items": size, "fill_s": round(fill_s, 1),
                               "server_rss_mib": self.server.rss_mib()})


def main() -> None:
    if serve_if_asked(serve):
        return
    bench = core_bench("reverb")
    bench.versions.update(package_versions("dm-reverb", "tensorflow"))
    system = ReverbSystem(bench)
    bench.notes.append(f"server in its own process, client over gRPC at {system.server.address}")
    try:
        standard_suite(bench, system.insert_batched, system.insert_step, system.sample_uniform,
                       system.prioritized)
    finally:
        system.close()
    bench.finish()


if __name__ == "__main__":
    main()

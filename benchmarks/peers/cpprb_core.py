"""cpprb side of the core comparison; run with benchmarks/.venvs/cpprb/bin/python:
``benchmarks/.venvs/cpprb/bin/python -m benchmarks.peers.cpprb_core [--quick]`` (from the
repository root).

Paths: ``ReplayBuffer.add`` of 256 rows / of one row, ``ReplayBuffer.sample``,
``PrioritizedReplayBuffer.sample`` + ``update_priorities``. All in-process numpy
storage: cpprb's inserts are memcpy-speed and it is the bar on CPU.
"""

from __future__ import annotations

import cpprb
import numpy as np

from benchmarks.common.bench import package_versions
from benchmarks.common.payload import (PriorityStream, check_batch, fill_batches, fill_rows,
                                       payload, random_priorities)
from benchmarks.core.workloads import IMPORTANCE_BETA, Workload, core_bench, standard_suite

FILL_CHUNK = 4096


def env(floats: int) -> dict:
    return {"x": {"shape": floats, "dtype": np.float32}}


def insert_batched(floats: int, capacity: int, batch: int) -> Workload:
    rb = cpprb.ReplayBuffer(capacity, env(floats))
    src = payload(batch, floats)
    for _ in range(-(-capacity // batch)):  # wrap the ring once: pages touched
        rb.add(x=src)
    return Workload(call=lambda: rb.add(x=src), units_per_call=batch,
                    path="ReplayBuffer.add(x=float32[256,k])", close=rb.clear)


def insert_step(floats: int, capacity: int) -> Workload:
    rb = cpprb.ReplayBuffer(capacity, env(floats))
    steps = 256
    rows = list(payload(steps, floats))

    def call() -> None:
        add = rb.add
        for a in rows:
            add(x=a)

    for _ in range(-(-capacity // steps)):
        call()
    return Workload(call=call, units_per_call=steps, path="ReplayBuffer.add(x=float32[k])",
                    close=rb.clear)


def sample_uniform(floats: int, n_items: int, batch: int) -> Workload:
    rb = cpprb.ReplayBuffer(n_items, env(floats))
    src = payload(fill_rows(n_items, floats, FILL_CHUNK), floats)
    for start, stop in fill_batches(n_items, len(src)):
        rb.add(x=src[: stop - start])
    assert rb.get_stored_size() == n_items
    check_batch(rb.sample(batch)["x"], batch, floats)
    return Workload(call=lambda: rb.sample(batch)["x"], units_per_call=batch,
                    path="ReplayBuffer.sample(256)['x']", close=rb.clear)


def prioritized(floats: int, n_items: int, batch: int, exponent: float) -> Workload:
    rb = cpprb.PrioritizedReplayBuffer(n_items, env(floats), alpha=exponent)
    src = payload(FILL_CHUNK, floats)
    prios = random_priorities(n_items)
    for start, stop in fill_batches(n_items, FILL_CHUNK):
        rb.add(x=src[: stop - start], priorities=prios[start:stop])
    assert rb.get_stored_size() == n_items
    new = PriorityStream(batch)
    check_batch(rb.sample(batch, beta=IMPORTANCE_BETA)["x"], batch, floats)

    def call() -> None:
        s = rb.sample(batch, beta=IMPORTANCE_BETA)
        _ = s["x"]
        rb.update_priorities(s["indexes"], new.next())

    return Workload(call=call, units_per_call=1,
                    path="PrioritizedReplayBuffer(alpha=0.6).sample(256) + update_priorities",
                    close=rb.clear)


def main() -> None:
    bench = core_bench("cpprb")
    bench.versions.update(package_versions("cpprb"))
    standard_suite(bench, insert_batched, insert_step, sample_uniform, prioritized)
    bench.finish()


if __name__ == "__main__":
    main()

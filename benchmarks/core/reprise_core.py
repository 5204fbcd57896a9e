"""Reprise side of the core comparison; run with the python that has reprise installed:
``python -m benchmarks.core.reprise_core [--quick] [--only KEYS] [--budget S]``.

Paths (docs: shared API.md): ``Table.insert`` of ``[256, 1, k]`` with priorities for
batched inserts; ``store.writer()`` with ``append`` + ``create_item(num_steps=1)`` per
step for step inserts; ``Table.sample(256).data["x"]`` for sampling; and
``Table.sample`` + ``Table.update_priorities`` on a ``Prioritized(0.6)`` table for the
prioritized round. Everything in-process, as for cpprb and TorchRL.

The store is sized for the table plus a margin (a FIFO eviction frees rows a block at
a time, and a batch in flight needs room before the oldest items go).
"""

from __future__ import annotations

import os

import numpy as np
import reprise as rp

from benchmarks.common.bench import package_versions
from benchmarks.common.payload import (PriorityStream, check_batch, fill_batches, fill_rows,
                                       payload, random_priorities, step_payload)
from benchmarks.core.workloads import Workload, core_bench, standard_suite

BLOCK_STEPS = 64
FILL_CHUNK = 4096
STEPS_PER_CALL = 256


def fifo_table(name: str, sig: dict, items: int, margin_steps: int, sampler=None, extensions=None):
    """A store of ``items + margin_steps`` steps and a FIFO-evicting table of at most
    ``items`` items over it (``sampler`` default Uniform, ``MinSize(1)``), with
    ``extensions`` (None: every built-in, the default; ``[]``: none)."""
    store = rp.Store(sig, capacity=items + margin_steps, block_steps=BLOCK_STEPS)
    table = rp.Table(name, store,
                     sampler=sampler if sampler is not None else rp.selectors.Uniform(),
                     remover=rp.selectors.Fifo(), max_size=items,
                     rate_limiter=rp.rate_limiters.MinSize(1), extensions=extensions)
    return store, table


def make_table(name: str, floats: int, items: int, max_batch: int, sampler=None, extensions=None):
    """:func:`fifo_table` of one-step items of one float32 field; the store also holds two
    batches of ``max_batch`` items and a few blocks, so an insert into a full table always
    finds free rows."""
    return fifo_table(name, {"x": rp.Field((floats,), "float32")}, items,
                      2 * max_batch + 4 * BLOCK_STEPS, sampler, extensions)


def closer(store, table):
    def close() -> None:
        table.reset()
        store.close()
    return close


def insert_batched(floats: int, capacity: int, batch: int, extensions=None) -> Workload:
    store, table = make_table("insert_batched", floats, capacity, batch, extensions=extensions)
    src = step_payload(batch, floats)  # [256, 1, k]
    prios = np.ones(batch, np.float64)
    for _ in range(-(-store.capacity // batch) + 1):  # cycle the whole store: pages touched
        table.insert({"x": src}, priorities=prios)
    assert table.size == capacity, (table.size, capacity)
    return Workload(call=lambda: table.insert({"x": src}, priorities=prios),
                    units_per_call=batch,
                    path="Table.insert({'x': float32[256,1,k]}, priorities)",
                    close=closer(store, table))


def open_writer(store):
    """An actor's writer that keeps only the last step alive if the API allows it;
    otherwise episodes end every STEPS_PER_CALL steps so history stays bounded."""
    try:
        return store.writer(max_sequence_length=1), False
    except TypeError:
        return store.writer(), True


def insert_step(floats: int, capacity: int, extensions=None) -> Workload:
    store, table = make_table("insert_step", floats, capacity, STEPS_PER_CALL, extensions=extensions)
    rows = [{"x": r} for r in payload(STEPS_PER_CALL, floats)]  # each x: float32[k]
    w_cm, end_episodes = open_writer(store)
    w = w_cm.__enter__()

    def call() -> None:
        append, create = w.append, w.create_item
        for step in rows:
            append(step)
            create(table, num_steps=1, priority=1.0)
        if end_episodes:
            w.end_episode()

    for _ in range(-(-store.capacity // STEPS_PER_CALL) + 1):  # cycle the whole store
        call()
    w.flush()
    assert table.size == capacity, (table.size, capacity)

    def close() -> None:
        w_cm.__exit__(None, None, None)
        closer(store, table)()

    how = ("end_episode() every 256 steps" if end_episodes
           else "writer(max_sequence_length=1)")
    return Workload(call=call, units_per_call=STEPS_PER_CALL,
                    path=f"with store.writer(): append + create_item(num_steps=1) per step; {how}",
                    close=close)


def sample_uniform(floats: int, n_items: int, batch: int, extensions=None) -> Workload:
    src = step_payload(fill_rows(n_items, floats, FILL_CHUNK), floats)
    store, table = make_table("sample_uniform", floats, n_items, len(src), extensions=extensions)
    for start, stop in fill_batches(n_items, len(src)):
        table.insert({"x": src[: stop - start]}, priorities=np.ones(stop - start))
    assert table.size == n_items, (table.size, n_items)
    check_batch(table.sample(batch).data["x"], batch, floats)
    return Workload(call=lambda: table.sample(batch).data["x"], units_per_call=batch,
                    path="Table(sampler=Uniform()).sample(256).data['x']",
                    close=closer(store, table))


def prioritized(floats: int, n_items: int, batch: int, exponent: float, extensions=None) -> Workload:
    store, table = make_table("prioritized", floats, n_items, FILL_CHUNK,
                              sampler=rp.selectors.Prioritized(priority_exponent=exponent),
                              extensions=extensions)
    src = step_payload(FILL_CHUNK, floats)
    prios = random_priorities(n_items)
    for start, stop in fill_batches(n_items, FILL_CHUNK):
        table.insert({"x": src[: stop - start]}, priorities=prios[start:stop])
    assert table.size == n_items, (table.size, n_items)
    new = PriorityStream(batch)
    check_batch(table.sample(batch).data["x"], batch, floats)

    def call() -> None:
        s = table.sample(batch)
        _ = s.data["x"]
        table.update_priorities(s.keys, new.next())

    return Workload(call=call, units_per_call=1,
                    path="Table(sampler=Prioritized(0.6)).sample(256) + update_priorities",
                    close=closer(store, table))


def main() -> None:
    bench = core_bench("reprise")
    bench.versions.update(package_versions("reprise") or {"reprise": rp.__version__})
    bench.notes.append(f"block_steps={BLOCK_STEPS}; reprise from {os.path.dirname(rp.__file__)}")
    standard_suite(bench, insert_batched, insert_step, sample_uniform, prioritized)
    bench.finish()


if __name__ == "__main__":
    main()

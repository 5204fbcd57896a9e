"""Reprise side of the serving comparison; run with the python that has reprise installed:
``python -m benchmarks.serving.reprise_serving [--quick] [--only KEYS] [--budget S]``.

This process owns the stores and tables and serves them with ``rp.Server`` (the server
runs on threads of this process, which otherwise only waits); writers, actors,
samplers and the learner are spawned processes that connect with
``rp.Client(server.local_address)``. Paths:

* writer1 step:  ``client.writer(table, max_sequence_length=1)``; per step ``append``
  + ``create_item(table, 1, 1.0)``; ``flush()`` ends every timed round.
* writer1 batch: ``extend`` of 256 steps + ``create_items(table, 1, priorities[256])``:
  one item per step of the ``extend``, queued as one batch.
* writer1 step-inproc: the step loop with an in-process ``store.writer()`` (no server),
  for reference: the difference is what serving costs.
* mixed: 4 step writers + ``client.sample(table, 256)`` with ``.data['x']``.
* apex: per push ``extend({state, next_state, action, reward})`` of 200 transitions +
  ``create_items('apex', 1, priorities[200])`` + ``flush()``; learner
  ``client.sample('apex', 512)`` (all four fields) + ``client.update_priorities``.

``--extensions all`` (the default, as for any ``rp.Table``) attaches every built-in table
extension to the served tables, ``--extensions none`` none: the A/B of their cost
(``benchmarks/extensions_overhead.py --apex-pairs N`` runs both, alternating).
"""

from __future__ import annotations

import os

import numpy as np
import reprise as rp

from benchmarks.common.bench import Bench, package_versions
from benchmarks.common.payload import PriorityStream, payload, random_priorities
from benchmarks.common.processes import Group
from benchmarks.common.timing import Window, count_in_window, timed_rounds
from benchmarks.core.reprise_core import BLOCK_STEPS, fifo_table
from benchmarks.serving.workloads import (APEX_ACTORS, APEX_FRAME, APEX_POOL, APEX_PUSH,
                                          APEX_SAMPLE, N_WRITERS, PRIORITY_EXPONENT, SAMPLE_BATCH,
                                          STEPS_PER_CALL, apex_entry, apex_pool, apex_timing,
                                          latency_run, make_config, mixed_entry, serving_bench,
                                          serving_suite, writer1_entry, writer_capacity)

TABLE = "t"


def x_sig(floats: int) -> dict:
    return {"x": rp.Field((floats,), "float32")}


# --- writer loops (shared by client and in-process writers) ----------------------------------
def step_loop(w, table, rows):
    steps = [{"x": r} for r in rows]

    def call() -> None:
        append, create = w.append, w.create_item
        for s in steps:
            append(s)
            create(table, 1, 1.0)
    return call


def batch_loop(w, table, rows):
    block = {"x": rows}
    ones = np.ones(len(rows))

    def call() -> None:
        w.extend(block)
        w.create_items(table, 1, ones)
    return call


# --- child processes -----------------------------------------------------------------------
def writer1_child(addr: str, floats: int, variant: str, store_steps: int, quick: bool):
    cfg = make_config(quick, None)
    client = rp.Client(addr)
    w = client.writer(TABLE, max_sequence_length=STEPS_PER_CALL if variant == "batch" else 1)
    rows = payload(STEPS_PER_CALL, floats)
    call = (step_loop if variant == "step" else batch_loop)(w, TABLE, rows)
    for _ in range(-(-store_steps // STEPS_PER_CALL) + 1):  # wrap the store once: pages touched
        call()
    w.flush()

    def run(_start):
        rates = timed_rounds(call, STEPS_PER_CALL, cfg, flush=w.flush)
        w.close()
        return {"rates": rates}
    return run


def mixed_writer_child(addr: str, variant: str, seed: int, warmup: float, seconds: float):
    w = rp.Client(addr).writer(TABLE, max_sequence_length=STEPS_PER_CALL if variant == "batch" else 1)
    call = (step_loop if variant == "step" else batch_loop)(w, TABLE, payload(STEPS_PER_CALL, 100, seed))

    def run(start):
        out = count_in_window(Window(start, warmup, seconds), call, STEPS_PER_CALL)
        w.flush()
        w.close()
        return out
    return run


def mixed_sampler_child(addr: str, warmup: float, seconds: float):
    client = rp.Client(addr)
    client.sample(TABLE, SAMPLE_BATCH).data["x"]

    def run(start):
        return count_in_window(Window(start, warmup, seconds),
                               lambda: client.sample(TABLE, SAMPLE_BATCH).data["x"],
                               SAMPLE_BATCH)
    return run


def apex_actor_child(addr: str, seed: int, warmup: float, seconds: float, timing: tuple):
    w = rp.Client(addr).writer("apex", max_sequence_length=APEX_PUSH)
    pool = apex_pool(APEX_POOL, seed)
    prios = np.asarray(random_priorities(APEX_POOL, seed), dtype=np.float64)
    state = {"i": 0}

    def push() -> None:
        i = state["i"]
        w.extend({k: v[i:i + APEX_PUSH] for k, v in pool.items()})
        w.create_items("apex", 1, prios[i:i + APEX_PUSH])
        w.flush()
        state["i"] = (i + APEX_PUSH) % (APEX_POOL - APEX_PUSH)

    push()

    return latency_run(push, warmup, seconds, timing, after=w.close)


def apex_learner_child(addr: str, warmup: float, seconds: float, timing: tuple):
    client = rp.Client(addr)
    new = PriorityStream(APEX_SAMPLE)

    def round_() -> None:
        s = client.sample("apex", APEX_SAMPLE)
        d = s.data
        assert d["state"].shape == (APEX_SAMPLE, 1, *APEX_FRAME), d["state"].shape
        client.update_priorities("apex", s.keys, new.next())

    round_()

    return latency_run(round_, warmup, seconds, timing)


# --- workloads (in the server process) ----------------------------------------------------
class Reprise:
    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.cfg = bench.cfg
        self.extensions = None if bench.args.extensions == "all" else []

    def _serve(self, tables):
        return rp.Server(tables)

    def writer1(self, size: int, variant: str) -> dict:
        cfg = self.cfg
        floats = size // 4
        cap = writer_capacity(cfg, size)
        store, table = fifo_table(TABLE, x_sig(floats), cap, STEPS_PER_CALL + 2 * BLOCK_STEPS,
                                  extensions=self.extensions)
        try:
            if variant == "step-inproc":
                with store.writer(max_sequence_length=1) as w:
                    call = step_loop(w, table, payload(STEPS_PER_CALL, floats))
                    for _ in range(-(-store.capacity // STEPS_PER_CALL) + 1):
                        call()
                    rates = timed_rounds(call, STEPS_PER_CALL, cfg, flush=w.flush)
                return writer1_entry(rates, size, "in-process store.writer(max_sequence_length=1): "
                                     "append + create_item(table, 1, 1.0) per step (no server)")
            with rp.Server([table]) as server:
                g = Group(cfg)
                g.add("writer", writer1_child, server.local_address, floats, variant,
                      store.capacity, cfg.quick)
                res = g.run()
                info = table.info()
        finally:
            table.reset()
            store.close()
        path = ("Client.writer(max_sequence_length=1): append + create_item(name, 1, 1.0) per "
                "step; flush() ends each round" if variant == "step" else
                "Client.writer(max_sequence_length=256): extend(256 steps) + create_items(name, 1, "
                "256 priorities), one item per step; flush() ends each round")
        return writer1_entry(res["writer"]["rates"], size, path,
                             table_items=info["size"], store_evictions=info["num_store_evictions"])

    def mixed(self, variant: str) -> dict:
        cfg = self.cfg
        n = cfg.mixed_table_items
        store, table = fifo_table(TABLE, x_sig(100), n,
                                  (N_WRITERS + 2) * (STEPS_PER_CALL + 2 * BLOCK_STEPS),
                                  extensions=self.extensions)
        try:
            src = payload(4096, 100)[:, None, :]
            for start in range(0, n, 4096):
                k = min(4096, n - start)
                table.insert({"x": src[:k]}, priorities=np.ones(k))
            with self._serve([table]) as server:
                g = Group(cfg)
                for i in range(N_WRITERS):
                    g.add(f"writer{i}", mixed_writer_child, server.local_address, variant, 10 + i,
                          cfg.mixed_warmup_seconds, cfg.mixed_seconds)
                g.add("sampler", mixed_sampler_child, server.local_address,
                      cfg.mixed_warmup_seconds, cfg.mixed_seconds)
                res = g.run()
                info = table.info()
        finally:
            table.reset()
            store.close()
        how = ("step loop (append + create_item per step)" if variant == "step" else
               "extend(256) + create_items(1, 256 priorities): one item per step")
        return mixed_entry(res, f"4 x Client.writer {how}; sampler "
                                "Client.sample(name, 256).data['x'] (Uniform)",
                           table_items=info["size"], store_evictions=info["num_store_evictions"])

    def apex(self, variant: str) -> dict:
        cfg = self.cfg
        n = cfg.apex_table_items
        sig = {"state": rp.Field(APEX_FRAME, "uint8"), "next_state": rp.Field(APEX_FRAME, "uint8"),
               "action": rp.Field((), "int64"), "reward": rp.Field((), "float32")}
        margin = APEX_ACTORS * (APEX_PUSH + 2 * BLOCK_STEPS) + 2 * APEX_SAMPLE + 4 * BLOCK_STEPS
        store, table = fifo_table("apex", sig, n, margin,
                                  sampler=rp.selectors.Prioritized(PRIORITY_EXPONENT),
                                  extensions=self.extensions)
        try:
            pool = apex_pool(1024, 99)
            prios = random_priorities(n, 98)
            for start in range(0, n, 1024):
                k = min(1024, n - start)
                table.insert({f: v[:k, None] for f, v in pool.items()},
                             priorities=prios[start:start + k])
            del pool
            assert table.size == n
            with self._serve([table]) as server:
                g = Group(cfg)
                for i in range(APEX_ACTORS):
                    g.add(f"actor{i}", apex_actor_child, server.local_address, 20 + i,
                          cfg.apex_warmup_seconds, cfg.apex_seconds, apex_timing(variant, "actor", i))
                g.add("learner", apex_learner_child, server.local_address,
                      cfg.apex_warmup_seconds, cfg.apex_seconds, apex_timing(variant, "learner"))
                res = g.run()
                info = table.info()
        finally:
            table.reset()
            store.close()
        return apex_entry(res, "actor: Client.writer(max_sequence_length=200), extend(200) + "
                               "create_items('apex', 1, 200 priorities) + flush(); learner: "
                               "Client.sample('apex', 512) + Client.update_priorities",
                          table_items=info["size"], store_steps=store.capacity,
                          store_evictions=info["num_store_evictions"])


def add_arguments(ap) -> None:
    ap.add_argument("--extensions", choices=("all", "none"), default="all",
                    help="table extensions on the served tables: every built-in (the default) "
                         "or none")


def main() -> None:
    bench = serving_bench("reprise", add_arguments)
    bench.versions.update(package_versions("reprise") or {"reprise": rp.__version__})
    bench.notes.append(f"server: rp.Server in the benchmark's main process; block_steps={BLOCK_STEPS}; "
                       f"reprise from {os.path.dirname(rp.__file__)}; "
                       f"table extensions: {bench.args.extensions}")
    serving_suite(bench, Reprise(bench), writer_variants=("step", "batch", "step-inproc"))
    bench.finish()


if __name__ == "__main__":
    main()

"""cpprb side of the serving comparison; run with benchmarks/.venvs/cpprb/bin/python:
``benchmarks/.venvs/cpprb/bin/python -m benchmarks.peers.cpprb_serving [--quick]`` (from
the repository root).

cpprb has no server: its multi-process buffers (``MPReplayBuffer``,
``MPPrioritizedReplayBuffer``, ``backend="SharedMemory"``, ``ctx=spawn``) live in
shared memory created by this process and are handed to the spawned writer/actor
and sampler/learner processes, which write into and read from it directly (cpprb's
documented Ape-X layout: many explorers ``add``, one learner ``sample`` and
``update_priorities``). ``add`` returns once the rows are in the buffer, so there is
nothing to flush.

* writer1 step:  ``rb.add(x=float32[k])`` per step;  batch: ``rb.add(x=float32[256,k])``.
* mixed: 4 writers as above + learner ``rb.sample(256)['x']``.
* apex: ``rb.add(state=..., next_state=..., action=..., reward=..., priorities=p[200])``;
  learner ``rb.sample(512, beta=0.4)`` + ``rb.update_priorities(indexes, p)``.
"""

from __future__ import annotations

import numpy as np

from benchmarks.common.bench import Bench, package_versions
from benchmarks.common.payload import PriorityStream, payload, random_priorities
from benchmarks.common.processes import Group, mp_context
from benchmarks.common.timing import Window, count_in_window, timed_rounds
from benchmarks.serving.workloads import (APEX_ACTORS, APEX_FRAME, APEX_POOL, APEX_SAMPLE,
                                          IMPORTANCE_BETA, N_WRITERS, PRIORITY_EXPONENT,
                                          SAMPLE_BATCH, STEPS_PER_CALL, apex_batches, apex_entry,
                                          apex_pool, apex_timing, latency_run, make_config,
                                          mixed_entry, serving_bench, serving_suite, writer1_entry,
                                          writer_capacity)


def x_env(floats: int) -> dict:
    return {"x": {"shape": floats, "dtype": np.float32}}


def apex_env() -> dict:
    return {"state": {"shape": APEX_FRAME, "dtype": np.uint8},
            "next_state": {"shape": APEX_FRAME, "dtype": np.uint8},
            "action": {"shape": 1, "dtype": np.int64},
            "reward": {"shape": 1, "dtype": np.float32}}


def add_loop(rb, rows: np.ndarray, variant: str):
    if variant == "step":
        steps = list(rows)

        def call() -> None:
            add = rb.add
            for a in steps:
                add(x=a)
    else:
        def call() -> None:
            rb.add(x=rows)
    return call


# --- child processes -----------------------------------------------------------------------
def writer1_child(rb, floats: int, variant: str, capacity: int, quick: bool):
    cfg = make_config(quick, None)
    call = add_loop(rb, payload(STEPS_PER_CALL, floats), variant)
    for _ in range(-(-capacity // STEPS_PER_CALL) + 1):
        call()

    def run(_start):
        return {"rates": timed_rounds(call, STEPS_PER_CALL, cfg)}
    return run


def mixed_writer_child(rb, variant: str, seed: int, warmup: float, seconds: float):
    call = add_loop(rb, payload(STEPS_PER_CALL, 100, seed), variant)

    def run(start):
        return count_in_window(Window(start, warmup, seconds), call, STEPS_PER_CALL)
    return run


def mixed_sampler_child(rb, warmup: float, seconds: float):
    rb.sample(SAMPLE_BATCH)["x"]

    def run(start):
        return count_in_window(Window(start, warmup, seconds),
                               lambda: rb.sample(SAMPLE_BATCH)["x"], SAMPLE_BATCH)
    return run


def apex_actor_child(rb, seed: int, warmup: float, seconds: float, timing: tuple):
    batches = apex_batches(apex_pool(APEX_POOL, seed), seed)

    def push() -> None:
        cols, prios = next(batches)
        rb.add(state=cols["state"], next_state=cols["next_state"], action=cols["action"],
               reward=cols["reward"], priorities=prios)

    push()

    return latency_run(push, warmup, seconds, timing)


def apex_learner_child(rb, warmup: float, seconds: float, timing: tuple):
    new = PriorityStream(APEX_SAMPLE)

    def round_() -> None:
        s = rb.sample(APEX_SAMPLE, beta=IMPORTANCE_BETA)
        assert s["state"].shape == (APEX_SAMPLE, *APEX_FRAME), s["state"].shape
        rb.update_priorities(s["indexes"], new.next())

    round_()

    return latency_run(round_, warmup, seconds, timing)


# --- workloads ----------------------------------------------------------------------------
class Cpprb:
    def __init__(self, bench: Bench) -> None:
        import cpprb
        self.cpprb = cpprb
        self.bench = bench
        self.cfg = bench.cfg
        self.ctx = mp_context()

    def _mp(self, n: int, env: dict, prioritized: bool = False):
        kw = dict(ctx=self.ctx, backend="SharedMemory")
        if prioritized:
            return self.cpprb.MPPrioritizedReplayBuffer(n, env, alpha=PRIORITY_EXPONENT, **kw)
        return self.cpprb.MPReplayBuffer(n, env, **kw)

    def writer1(self, size: int, variant: str) -> dict:
        cfg = self.cfg
        floats = size // 4
        cap = writer_capacity(cfg, size)
        rb = self._mp(cap, x_env(floats))
        g = Group(cfg)
        g.add("writer", writer1_child, rb, floats, variant, cap, cfg.quick)
        res = g.run()
        stored = rb.get_stored_size()
        del rb
        path = ("MPReplayBuffer.add(x=float32[k]) per step" if variant == "step"
                else "MPReplayBuffer.add(x=float32[256,k])")
        return writer1_entry(res["writer"]["rates"], size, path + " from a spawned process "
                             "(shared memory, no server)", table_items=stored)

    def mixed(self, variant: str) -> dict:
        cfg = self.cfg
        n = cfg.mixed_table_items
        rb = self._mp(n, x_env(100))
        src = payload(4096, 100)
        for start in range(0, n, 4096):
            rb.add(x=src[:min(4096, n - start)])
        g = Group(cfg)
        for i in range(N_WRITERS):
            g.add(f"writer{i}", mixed_writer_child, rb, variant, 10 + i,
                  cfg.mixed_warmup_seconds, cfg.mixed_seconds)
        g.add("sampler", mixed_sampler_child, rb, cfg.mixed_warmup_seconds, cfg.mixed_seconds)
        res = g.run()
        stored = rb.get_stored_size()
        del rb
        how = "add(x=float32[k]) per step" if variant == "step" else "add(x=float32[256,k])"
        return mixed_entry(res, f"4 x MPReplayBuffer.{how}; learner MPReplayBuffer.sample(256)['x']",
                           table_items=stored)

    def apex(self, variant: str) -> dict:
        cfg = self.cfg
        n = cfg.apex_table_items
        rb = self._mp(n, apex_env(), prioritized=True)
        pool = apex_pool(1024, 99)
        prios = random_priorities(n, 98)
        for start in range(0, n, 1024):
            k = min(1024, n - start)
            rb.add(**{f: v[:k] for f, v in pool.items()}, priorities=prios[start:start + k])
        del pool
        assert rb.get_stored_size() == n
        g = Group(cfg)
        for i in range(APEX_ACTORS):
            g.add(f"actor{i}", apex_actor_child, rb, 20 + i, cfg.apex_warmup_seconds,
                  cfg.apex_seconds, apex_timing(variant, "actor", i))
        g.add("learner", apex_learner_child, rb, cfg.apex_warmup_seconds, cfg.apex_seconds,
              apex_timing(variant, "learner"))
        res = g.run()
        stored = rb.get_stored_size()
        del rb
        return apex_entry(res, "actor: MPPrioritizedReplayBuffer.add(200 transitions, "
                               "priorities); learner: sample(512, beta=0.4) + update_priorities",
                          table_items=stored)


def main() -> None:
    bench = serving_bench("cpprb")
    bench.versions.update(package_versions("cpprb"))
    bench.notes.append("no server: MP buffers in shared memory (backend='SharedMemory', "
                       "ctx=spawn) used directly by the spawned processes")
    serving_suite(bench, Cpprb(bench))
    bench.finish()


if __name__ == "__main__":
    main()

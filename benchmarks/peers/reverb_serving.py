"""dm-reverb side of the serving comparison; run with benchmarks/.venvs/reverb/bin/python:
``benchmarks/.venvs/reverb/bin/python -m benchmarks.peers.reverb_serving [--quick]`` (from
the repository root).

As Reverb's users run it: one ``reverb.Server`` in its own process (this module with
``--serve``) holding every table, and every writer/actor/sampler/learner a spawned
process with its own ``reverb.Client`` over loopback gRPC. Paths (the fastest Reverb
documents for each job):

* writer1 step / mixed writers: ``StructuredWriter`` (items made in C++ from an
  ``x[-1:]`` pattern, constant priority), one ``append`` per step, ``flush()`` every
  32 items (Reverb warns and slows past ~40 pending items; REVERB_FLUSH_EVERY /
  REVERB_FLUSH_KEEP change the interval and ``block_until_num_items``) and at the end
  of every timed round. Reverb has no batched insert: the batch rows say so.
* mixed sampler: one persistent ``TrajectoryDataset`` stream, ``.batch(256)``,
  ``max_in_flight_samples_per_worker=256``.
* apex actors: ``TrajectoryWriter(num_keep_alive_refs=1, validate_items=False)``, per
  transition ``append`` + ``create_item(table, priority, {f: history[f][-1]})``
  (per-item priorities need ``TrajectoryWriter``; ``StructuredWriter`` priorities are
  per config), ``flush`` every 32 items and ``flush()`` after 200: the items are then
  in the table. Learner: persistent ``TrajectoryDataset.from_table_signature(...,
  max_in_flight_samples_per_worker=512).batch(512)`` + ``Client.mutate_priorities`` of
  the 512 keys. The stream samples up to 512 items ahead of the priority updates (as
  in training with Reverb); REVERB_SAMPLE_PATH=client uses ``Client.sample(table, 512)``
  instead (a new stream per call, no sampling ahead).
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402  (after the TF log level)

from benchmarks.common.bench import Bench, Unsupported, package_versions  # noqa: E402
from benchmarks.common.payload import PriorityStream, payload, random_priorities  # noqa: E402
from benchmarks.common.processes import Group, serve_if_asked  # noqa: E402
from benchmarks.common.timing import Window, count_in_window, timed_rounds  # noqa: E402
from benchmarks.peers.reverb_common import ServerProcess, serve, structured_writer, x_table  # noqa: E402
from benchmarks.serving.workloads import (APEX_ACTORS, APEX_FRAME, APEX_POOL,  # noqa: E402
                                          APEX_PUSH, APEX_SAMPLE, APEX_VARIANTS, N_WRITERS,
                                          PRIORITY_EXPONENT, SAMPLE_BATCH, STEPS_PER_CALL,
                                          WRITER_SIZES, apex_entry, apex_pool, apex_timing,
                                          latency_run, make_config, mixed_entry, serving_bench,
                                          serving_suite, writer1_entry, writer_capacity)

FLUSH_EVERY = int(os.environ.get("REVERB_FLUSH_EVERY", "32"))
FLUSH_KEEP = int(os.environ.get("REVERB_FLUSH_KEEP", "0"))   # block_until_num_items
SAMPLE_PATH = os.environ.get("REVERB_SAMPLE_PATH", "dataset")
NO_BATCH = "Reverb has no batched insert (one append per step)"


# --- writers (in any process) ----------------------------------------------------------------
def step_loop(w, rows: np.ndarray):
    steps = [{"x": r} for r in rows]

    def call() -> None:
        append, flush = w.append, w.flush
        for i, s in enumerate(steps, 1):
            append(s)
            if i % FLUSH_EVERY == 0:
                flush(block_until_num_items=FLUSH_KEEP)
    return call


# --- child processes -------------------------------------------------------------------------
def writer1_child(address: str, table: str, floats: int, capacity: int, quick: bool):
    import reverb
    cfg = make_config(quick, None)
    w = structured_writer(reverb.Client(address), table)
    call = step_loop(w, payload(STEPS_PER_CALL, floats))
    t_end = time.monotonic() + (20 if not quick else 5)   # wrap the table once (time-capped)
    for _ in range(-(-capacity // STEPS_PER_CALL) + 1):
        call()
        if time.monotonic() > t_end:
            break
    w.flush()

    def run(_start):
        return {"rates": timed_rounds(call, STEPS_PER_CALL, cfg, flush=w.flush)}
    return run


def mixed_writer_child(address: str, table: str, seed: int, warmup: float, seconds: float):
    import reverb
    w = structured_writer(reverb.Client(address), table)
    call = step_loop(w, payload(STEPS_PER_CALL, 100, seed))
    call()
    w.flush()

    def run(start):
        out = count_in_window(Window(start, warmup, seconds), call, STEPS_PER_CALL)
        w.flush()
        return out
    return run


def dataset_iter(address: str, table: str, batch: int):
    import reverb
    ds = reverb.TrajectoryDataset.from_table_signature(
        server_address=address, table=table, max_in_flight_samples_per_worker=batch)
    return iter(ds.batch(batch, drop_remainder=True))


def mixed_sampler_child(address: str, table: str, warmup: float, seconds: float):
    it = dataset_iter(address, table, SAMPLE_BATCH)
    next(it).data["x"].numpy()

    def run(start):
        return count_in_window(Window(start, warmup, seconds),
                               lambda: next(it).data["x"].numpy(), SAMPLE_BATCH)
    return run


def apex_writer_steps(pool: dict) -> list[dict]:
    return [{k: v[i] for k, v in pool.items()} for i in range(len(pool["action"]))]


def apex_push_fn(client, table: str, steps: list[dict], prios: np.ndarray):
    w = client.trajectory_writer(num_keep_alive_refs=1, validate_items=False)
    state = {"i": 0}
    n_pool = len(steps)

    def push() -> None:
        i = state["i"]
        append, create = w.append, w.create_item
        hist = None
        for j in range(i, i + APEX_PUSH):
            append(steps[j])
            if hist is None:  # column histories update in place; fetch them once per push
                hist = w.history
            create(table, priority=float(prios[j]),
                   trajectory={f: hist[f][-1] for f in ("state", "next_state", "action", "reward")})
            if (j - i + 1) % FLUSH_EVERY == 0:
                w.flush(block_until_num_items=FLUSH_KEEP)
        w.flush()
        state["i"] = (i + APEX_PUSH) % (n_pool - APEX_PUSH)
    return push, w


def apex_actor_child(address: str, seed: int, warmup: float, seconds: float, timing: tuple):
    import reverb
    pool = apex_pool(APEX_POOL, seed)
    push, w = apex_push_fn(reverb.Client(address), "apex", apex_writer_steps(pool),
                           random_priorities(APEX_POOL, seed))
    push()

    return latency_run(push, warmup, seconds, timing, after=w.close)


def apex_learner_child(address: str, warmup: float, seconds: float, timing: tuple):
    import reverb
    client = reverb.Client(address)
    new = PriorityStream(APEX_SAMPLE)
    if SAMPLE_PATH == "client":
        def get():
            samples = list(client.sample("apex", num_samples=APEX_SAMPLE))
            keys = [s[0].info.key for s in samples]
            _ = np.stack([s[0].data["state"] for s in samples])
            return keys
    else:
        it = dataset_iter(address, "apex", APEX_SAMPLE)

        def get():
            s = next(it)
            st = s.data["state"].numpy()
            assert st.shape == (APEX_SAMPLE, *APEX_FRAME), st.shape
            for f in ("next_state", "action", "reward"):
                s.data[f].numpy()
            return s.info.key.numpy().tolist()

    def round_() -> None:
        keys = get()
        client.mutate_priorities("apex", updates=dict(zip(keys, new.next().tolist())))

    round_()

    return latency_run(round_, warmup, seconds, timing)


# --- workloads ---------------------------------------------------------------------------------
class Reverb:
    def __init__(self, bench: Bench) -> None:
        import reverb
        self.reverb = reverb
        self.bench = bench
        self.cfg = cfg = bench.cfg
        specs = [x_table(f"w1_{size}", size // 4, writer_capacity(cfg, size))
                 for _, size in WRITER_SIZES]
        specs.append(x_table("mixed", 100, cfg.mixed_table_items))
        specs.append({"name": "apex", "sampler": "prioritized", "exponent": PRIORITY_EXPONENT,
                      "max_size": cfg.apex_table_items,
                      "fields": {"state": [list(APEX_FRAME), "uint8"],
                                 "next_state": [list(APEX_FRAME), "uint8"],
                                 "action": [[], "int64"], "reward": [[], "float32"]}})
        self.server = ServerProcess(__spec__.name, specs, stop_timeout=60)
        self.client = reverb.Client(self.server.address)

    def close(self) -> None:
        self.server.stop()

    def size(self, table: str) -> int:
        return self.client.server_info()[table].current_size

    def writer1(self, size: int, variant: str) -> dict:
        if variant != "step":
            raise Unsupported(NO_BATCH)
        cfg = self.cfg
        table = f"w1_{size}"
        g = Group(cfg)
        g.add("writer", writer1_child, self.server.address, table, size // 4,
              writer_capacity(cfg, size), cfg.quick)
        res = g.run()
        n = self.size(table)
        rss = self.server.rss_mib()
        self.client.reset(table)
        return writer1_entry(res["writer"]["rates"], size,
                             f"StructuredWriter(x[-1:]).append per step, flush(block_until_num_items="
                             f"{FLUSH_KEEP}) every {FLUSH_EVERY} items; flush() ends each round",
                             table_items=n, server_rss_mib=rss)

    def mixed(self, variant: str) -> dict:
        if variant != "step":
            raise Unsupported(NO_BATCH)
        cfg = self.cfg
        n = cfg.mixed_table_items
        w = structured_writer(self.client, "mixed")
        call = step_loop(w, payload(STEPS_PER_CALL, 100))
        t0 = time.monotonic()
        for _ in range(-(-n // STEPS_PER_CALL)):
            call()
            if time.monotonic() - t0 > (60 if not cfg.quick else 10):
                break
        w.flush()
        filled = self.size("mixed")
        g = Group(cfg)
        for i in range(N_WRITERS):
            g.add(f"writer{i}", mixed_writer_child, self.server.address, "mixed", 10 + i,
                  cfg.mixed_warmup_seconds, cfg.mixed_seconds)
        g.add("sampler", mixed_sampler_child, self.server.address, "mixed",
              cfg.mixed_warmup_seconds, cfg.mixed_seconds)
        res = g.run()
        rss = self.server.rss_mib()
        self.client.reset("mixed")
        return mixed_entry(res, "4 x StructuredWriter step loop (flush every 32); sampler "
                                "TrajectoryDataset(max_in_flight=256).batch(256)",
                           table_items_at_start=filled, server_rss_mib=rss)

    def apex(self, variant: str) -> dict:
        cfg = self.cfg
        n = cfg.apex_table_items
        pool = apex_pool(1024, 99)
        steps = apex_writer_steps(pool)
        prios = random_priorities(1024, 98)
        push, w = apex_push_fn(self.client, "apex", steps, prios)
        t0 = time.monotonic()
        limit = 90 if not cfg.quick else 15
        while self.size("apex") < n and time.monotonic() - t0 < limit:
            for _ in range(10):
                push()
        w.close()
        fill_s = time.monotonic() - t0
        filled = self.size("apex")
        del pool, steps
        g = Group(cfg)
        for i in range(APEX_ACTORS):
            g.add(f"actor{i}", apex_actor_child, self.server.address, 20 + i,
                  cfg.apex_warmup_seconds, cfg.apex_seconds, apex_timing(variant, "actor", i))
        g.add("learner", apex_learner_child, self.server.address, cfg.apex_warmup_seconds,
              cfg.apex_seconds, apex_timing(variant, "learner"))
        res = g.run()
        rss = self.server.rss_mib()
        n_end = self.size("apex")
        self.client.reset("apex")
        sample = ("Client.sample('apex', 512) (new stream per call)" if SAMPLE_PATH == "client"
                  else "TrajectoryDataset.from_table_signature(max_in_flight_samples_per_worker=512)"
                       ".batch(512), all 4 fields .numpy()")
        note = None
        if filled < n:
            note = f"table prefilled to {filled:,} of {n:,} items in {fill_s:.0f}s (limit {limit}s)"
        e = apex_entry(res, "actor: TrajectoryWriter(num_keep_alive_refs=1, validate_items=False), "
                            "200 x (append + create_item(priority)), flush every "
                            f"{FLUSH_EVERY}, flush() at the end; learner: {sample} + "
                            "Client.mutate_priorities(512)",
                       table_items_at_start=filled, table_items_at_end=n_end,
                       prefill_s=round(fill_s, 1), server_rss_mib=rss)
        if note:
            e["note"] = note
        return e


def main() -> None:
    if serve_if_asked(serve):
        return
    bench = serving_bench("reverb")
    bench.versions.update(package_versions("dm-reverb", "tensorflow"))
    s = Reverb(bench)
    bench.notes.append(f"reverb.Server in its own process; every client over gRPC at {s.server.address}")
    try:
        serving_suite(bench, s)
    finally:
        s.close()
    bench.finish()


if __name__ == "__main__":
    main()

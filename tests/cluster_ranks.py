"""Running a function on N spawned gloo ranks (cluster-mode tests).

``run_ranks(world, fn, *args)`` starts ``world`` processes (spawn) joined through
a TCPStore on port 0, runs ``fn(rank, world, *args)`` in each with a 30 s
collective timeout and ``OMP_NUM_THREADS=1``, and returns the ranks' results in
rank order. A rank that raises fails the call with its traceback; a rank still
running at ``deadline`` seconds is killed and the call fails: nothing hangs."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback
from datetime import timedelta


def _child(rank, world, port, fn, args, results, env):
    os.environ.update(env)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=30))
        out = fn(rank, world, *args)
        results.put((rank, "ok", pickle.dumps(out)))
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_ranks(world: int, fn, *args, deadline: float = 55.0, env: dict | None = None, allow_missing=()):
    """Results of ``fn(rank, world, *args)`` per rank. ``env``: per-rank extra
    environment, a function ``rank -> dict``. Ranks in ``allow_missing`` may end
    without a result (killed on purpose)."""
    import torch.distributed as dist
    master = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = []
    for r in range(world):
        e = env(r) if callable(env) else dict(env or {})
        p = ctx.Process(target=_child, args=(r, world, master.port, fn, args, results, e), daemon=True)
        p.start()
        procs.append(p)
    got, errors = {}, {}
    end = time.monotonic() + deadline
    try:
        while len(got) + len(errors) < world - len(allow_missing) or (
                any(p.is_alive() for p in procs) and len(got) + len(errors) < world):
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                rank, status, payload = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break
                continue
            if status == "ok":
                got[rank] = pickle.loads(payload)
            else:
                errors[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=max(0.1, min(5.0, end - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("ranks failed:\n" + "\n".join(f"--- rank {r}:\n{t}" for r, t in sorted(errors.items())))
    missing = [r for r in range(world) if r not in got and r not in allow_missing]
    if missing:
        raise AssertionError(f"ranks {missing} gave no result within {deadline} s")
    return [got.get(r) for r in range(world)]

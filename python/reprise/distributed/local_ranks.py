"""Running one function on N gloo ranks of this machine: how tests, benchmarks
and single-machine experiments emulate a cluster.

``run_ranks(world, fn, *args)`` starts ``world`` processes (spawn: fresh
interpreters) joined through a TCPStore on port 0 of 127.0.0.1, runs
``fn(rank, world, *args)`` in each with ``OMP_NUM_THREADS=1``, one torch thread and a
``timeout`` on every collective, and returns the ranks' results in rank order. A
rank that raises fails the call with its traceback; a rank still running at
``deadline`` seconds is killed and the call fails: nothing hangs (it is first sent
SIGABRT, on which ``faulthandler`` prints every thread's Python stack to its stderr,
so a hang says where it was). ``fn`` must be importable by name (a module-level
function)."""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import queue
import signal
import time
import traceback
from datetime import timedelta

from ..errors import CollectiveError


def _child(rank, world, port, timeout, fn, args, results, env):
    faulthandler.enable()  # SIGABRT from run_ranks at its deadline: every thread's stack on stderr
    os.environ.update(env)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        limit = timedelta(seconds=timeout)
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=limit)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=limit)
        out = fn(rank, world, *args)
        results.put((rank, "ok", pickle.dumps(out)))
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_ranks(world: int, fn, *args, deadline: float = 300.0, timeout: float = 60.0, env=None,
              allow_missing=()) -> list:
    """Results of ``fn(rank, world, *args)`` per rank (see the module docstring).
    ``env``: extra environment for every rank, or a function ``rank -> dict``.
    Ranks in ``allow_missing`` may end without a result (killed on purpose); their
    entry is None. Raises ``CollectiveError`` naming failed or missing ranks."""
    import torch.distributed as dist
    master = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=timeout))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = []
    for r in range(world):
        e = env(r) if callable(env) else dict(env or {})
        p = ctx.Process(target=_child, args=(r, world, master.port, timeout, fn, args, results, e), daemon=True)
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
                os.kill(p.pid, signal.SIGABRT)  # its stacks first (faulthandler), then it ends
                p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise CollectiveError("ranks failed:\n" + "\n".join(f"--- rank {r}:\n{t}" for r, t in sorted(errors.items())))
    missing = [r for r in range(world) if r not in got and r not in allow_missing]
    if missing:
        raise CollectiveError(f"ranks {missing} gave no result within {deadline:.0f} s")
    return [got.get(r) for r in range(world)]

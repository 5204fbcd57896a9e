"""Cluster mode against TorchRL's remote replay buffers, in the same run, on this machine:
"2 ranks each writing and each sampling 4 KB rows; report ReplayBuffer items/s for both;
goal >= 3x TorchRL's".

    python -m benchmarks.cluster.peer            # ~1.5 minutes on 2 cores (torch, torchrl, ray)
    python -m benchmarks.cluster.peer --quick    # few rounds: a smoke test (~35 s), numbers are noise
    python -m benchmarks.cluster.peer --systems reprise,torchrl-rpc

Run it from the repository root with the Python that has ``reprise``, torch, TorchRL and Ray.

The workload, the same for every system (:func:`drive`): 2 worker processes, rows of one
float32[1024] field (4 KB of random floats, so nothing can compress). Each worker

1. prefills its share, ``items_per_worker`` rows in inserts of ``chunk`` rows (untimed), then
   takes ``warmup_steps`` samples;
2. then per round inserts ``insert_chunks`` x ``chunk`` rows (timed), then takes ``steps``
   samples of B/2 rows (timed); a barrier starts each phase on both workers at once.

B (rows per step over both workers) is 256 and 1024, uniform draws with replacement, a fresh
table or buffer for each B (of capacity 2 x ``items_per_worker`` rows). A round's items/s are
the rows both workers inserted (sampled) over the slower worker's time; the tables give the
median over rounds.

Systems (each the path its documentation shows for several processes):

- ``reprise``: ``rp.distributed.ShardedTable`` on 2 gloo ranks (``local_ranks.run_ranks``),
  ``shards="rank"``, ``Uniform``, ``assignment="iid"``, ``verify_rows=True`` (the default CRC
  check). A rank inserts into its own shard (local, not a collective); ``sample(B/2)`` on every
  rank is one collective global draw, and half of the rows cross ranks.
- ``torchrl-ray``: ``RayReplayBuffer`` (``LazyTensorStorage``, ``RandomSampler``): the buffer
  is a Ray actor, every call and its data go through Ray (``transport="ray"``). Each worker is
  a spawned process that joins the Ray instance and uses ``rb.client()``.
- ``torchrl-distributed``: the same buffer with ``transport="distributed"``: per client, gloo
  point-to-point channels to the actor (rendezvoused through a TCPStore the actor owns),
  payload layouts bound on first use; TorchRL's torch.distributed replay service.
- ``torchrl-rpc``: ``RemoteTensorDictReplayBuffer`` on an owner process, called over
  ``torch.distributed.rpc`` (TensorPipe), ``rpc_sync(owner, RemoteTensorDictReplayBuffer.extend
  / .sample, args=(rref, ...))`` as TorchRL's ``examples/distributed/replay_buffers`` does.

TorchRL's buffers are central: their rows live in a third process (the actor or the owner),
and every insert and sample crosses to it. Reprise's shards live in the two ranks.

The two Ray transports share one Ray instance (its start-up is most of a run's time). Each
TorchRL group runs in a child process leading a session of its own, killed with everything it
started past its deadline; Reprise's ranks are bounded by ``run_ranks``'s deadline, every
barrier and call by a timeout. A system that fails is recorded with its error (the markdown
lists it) and the others still run. Writes ``benchmarks/out/cluster-peer-<date>.json`` and
``.md`` (``--out-dir`` elsewhere) and prints the markdown.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import wait as wait_ready

import numpy as np

from benchmarks.common.config import Config
from benchmarks.common.driver import OUT, command_line, start_report, write_outputs
from benchmarks.common.report import busy_lines, machine_lines, md_row, md_table, si

FULL = dict(batches=[256, 1024], row_floats=1024, items_per_worker=4096, chunk=256, insert_chunks=8,
            warmup_steps=5, rounds=9, steps=40, deadline_s=150.0, barrier_timeout_s=60.0)
QUICK = dict(items_per_worker=1024, insert_chunks=4, warmup_steps=2, rounds=3, steps=5, deadline_s=90.0)
WORKERS = 2
GOAL = 3.0  # Reprise's sampled items/s >= 3x TorchRL's
BUSY_LOAD = 1.0  # 1-minute load average above which a system's numbers are flagged
SPAWN = mp.get_context("spawn")
clock = time.perf_counter

SYSTEMS = {
    "reprise": "ShardedTable, shards=\"rank\", Uniform, assignment=\"iid\", CRC on; 2 gloo ranks",
    "torchrl-ray": "RayReplayBuffer(transport=\"ray\"), LazyTensorStorage + RandomSampler; a Ray actor",
    "torchrl-distributed": "RayReplayBuffer(transport=\"distributed\"), LazyTensorStorage + RandomSampler; "
                           "gloo point-to-point channels to a Ray actor",
    "torchrl-rpc": "RemoteTensorDictReplayBuffer, LazyTensorStorage + RandomSampler; torch.distributed.rpc "
                   "(TensorPipe) to an owner process",
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- one worker's run on one table (every system) --------------------------------------------
def drive(insert, sample, sync, cfg: dict, rows: int) -> dict:
    """Prefill, warm up, then ``rounds`` x (timed inserts, timed samples) on one table.
    ``insert()`` writes one chunk; ``sample(rows)`` returns the drawn rows' array (rows first);
    ``sync()`` waits for the other worker."""
    for _ in range(cfg["items_per_worker"] // cfg["chunk"]):
        insert()
    sync()
    for _ in range(cfg["warmup_steps"]):
        sample(rows)
    out = {"insert_s": [], "sample_s": []}
    last = None
    for _ in range(cfg["rounds"]):
        sync()
        t0 = clock()
        for _ in range(cfg["insert_chunks"]):
            insert()
        out["insert_s"].append(clock() - t0)
        sync()
        t0 = clock()
        for _ in range(cfg["steps"]):
            last = sample(rows)
        out["sample_s"].append(clock() - t0)
    x = np.asarray(last).reshape(rows, -1)
    if x.shape[1] != cfg["row_floats"] or not np.isfinite(x).all():
        raise AssertionError(f"a sample of {rows} rows came back as {np.asarray(last).shape}, "
                             f"expected {rows} rows of {cfg['row_floats']} finite floats")
    return out


def chunk_rows(cfg: dict, seed: int) -> np.ndarray:
    """The rows one worker inserts, ``[chunk, row_floats]`` float32 (made once, outside the timing)."""
    return np.random.default_rng(seed).standard_normal((cfg["chunk"], cfg["row_floats"]), dtype=np.float32)


def versions() -> dict:
    """The imported reprise's version and the installed peers' (None: not installed)."""
    import importlib.metadata as md

    import reprise
    out = {"reprise": getattr(reprise, "__version__", "?")}
    for name in ("torch", "torchrl", "tensordict", "ray"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


# --- reprise ---------------------------------------------------------------------------------
def reprise_rank(rank: int, world: int, cfg: dict) -> dict:
    """One gloo rank (``run_ranks``): a fresh ShardedTable per batch size, :func:`drive` on it."""
    import reprise as rp
    import torch.distributed as dist
    from reprise.distributed import ShardedTable

    rows = chunk_rows(cfg, seed=rank)[:, None, :]  # one-step items: [n, steps=1, floats]
    out = {}
    for batch in cfg["batches"]:
        table = ShardedTable(f"peer-b{batch}", {"x": rp.Field((cfg["row_floats"],), "float32")},
                             capacity_per_shard=cfg["items_per_worker"], sampler=rp.selectors.Uniform(),
                             shards="rank", assignment="iid", verify_rows=True, seed=7, timeout=60.0)
        try:
            out[f"b{batch}"] = drive(lambda: table.insert({"x": rows}, 1.0),
                                     lambda n: table.sample(n).data["x"], dist.barrier, cfg, batch // world)
        finally:
            table.close()
    return out


def run_reprise(cfg: dict) -> list[dict]:
    from reprise.distributed.local_ranks import run_ranks
    return run_ranks(WORKERS, reprise_rank, cfg, deadline=cfg["deadline_s"], timeout=60.0)


# --- processes -------------------------------------------------------------------------------
def _job(index: int, fn, args, results) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        import torch
        torch.set_num_threads(1)
        results.put((index, "ok", fn(*args)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put((index, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_processes(jobs: list[tuple], deadline: float) -> list:
    """Runs each ``(fn, args)`` of ``jobs`` in a spawned process (one torch thread) and returns
    their results in order. A job that raises fails the call with its traceback; past
    ``deadline`` seconds the ones still running are killed and the call fails."""
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=_job, args=(i, fn, args, results), daemon=True) for i, (fn, args) in enumerate(jobs)]
    for p in procs:
        p.start()
    got, end = {}, time.monotonic() + deadline
    try:
        while len(got) < len(jobs):
            try:
                index, status, payload = results.get(timeout=max(0.01, min(0.5, end - time.monotonic())))
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if i not in got and not p.is_alive()]
                if dead:
                    time.sleep(0.5)  # a result put just before the exit may still be in the pipe
                    if results.empty():
                        raise RuntimeError(f"process(es) {dead} died without a result "
                                           f"(exit codes {[procs[i].exitcode for i in dead]})")
                if time.monotonic() > end:
                    raise RuntimeError(f"process(es) {sorted(set(range(len(jobs))) - set(got))} gave no result "
                                       f"within {deadline:.0f} s")
                continue
            if status == "error":
                raise RuntimeError(f"process {index} failed: {payload}")
            got[index] = payload
    finally:
        for p in procs:
            p.join(timeout=max(0.1, min(10.0, end - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join()
    return [got[i] for i in range(len(jobs))]


def _session_main(fn, cfg: dict, results) -> None:
    os.setsid()  # this child and all it starts form one process group, killed together
    try:
        results.put(("ok", fn(cfg)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        results.put(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def in_session(fn, cfg: dict, deadline: float):
    """``fn(cfg)`` in a spawned child leading a session of its own; past ``deadline`` seconds the
    child and everything it started (Ray's daemons, worker processes) are killed. The child is
    reaped only after its group is killed, so the group id cannot name anyone else's."""
    results = SPAWN.Queue()
    p = SPAWN.Process(target=_session_main, args=(fn, cfg, results))  # not daemonic: it starts processes
    p.start()
    end = time.monotonic() + deadline
    try:
        while True:
            try:
                status, payload = results.get(timeout=0.5)
                break
            except queue.Empty:
                if wait_ready([p.sentinel], 0) and results.empty():
                    raise RuntimeError("the child died without a result")
                if time.monotonic() > end:
                    raise RuntimeError(f"no result within {deadline:.0f} s; killed")
        if status == "error":
            raise RuntimeError(payload)
        wait_ready([p.sentinel], max(1.0, end - time.monotonic()))  # its own clean exit
        return payload
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # stragglers; none when everything ended cleanly
        except (ProcessLookupError, PermissionError):
            pass
        p.join(timeout=10)


# --- torchrl over Ray ------------------------------------------------------------------------
def ray_worker(index: int, address: str, clients: dict, cfg: dict, barriers: dict) -> dict:
    """One worker: joins the Ray instance, then :func:`drive` on each buffer of each transport
    through its client. A transport that fails is recorded (``{"error": ...}``) and its barrier
    broken, so the other worker stops waiting on it; the next transport still runs."""
    import ray
    import torch
    from tensordict import TensorDict

    data = TensorDict({"x": torch.from_numpy(chunk_rows(cfg, seed=index))}, batch_size=[cfg["chunk"]])
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        out = {}
        for transport, blobs in clients.items():
            barrier = barriers[transport]
            try:
                out[transport] = {}
                for key, blob in blobs.items():
                    client = pickle.loads(blob)  # rb.client(): picklable, no lifecycle rights
                    out[transport][key] = drive(lambda: client.extend(data), lambda n: client.sample(n)["x"],
                                                lambda: barrier.wait(cfg["barrier_timeout_s"]), cfg,
                                                int(key[1:]) // WORKERS)
            except Exception as e:  # noqa: BLE001 - recorded, the next transport still runs
                barrier.abort()
                out[transport] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        return out
    finally:
        ray.shutdown()


def first_error(errors: list[str]) -> str:
    """The error that caused the others (a worker left waiting reports a broken barrier)."""
    real = [e for e in errors if not e.startswith("BrokenBarrierError")]
    return (real or errors)[0]


def run_torchrl_ray(cfg: dict) -> dict:
    """One Ray instance on this machine (2 CPUs) for every transport in ``cfg["transports"]``:
    one RayReplayBuffer per transport and batch size, 2 spawned workers. Returns, per
    transport, the workers' results or ``{"error": ...}``."""
    from functools import partial

    import ray
    from torchrl.data import LazyTensorStorage, RandomSampler
    from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

    scratch = tempfile.mkdtemp(prefix="reprise-peer-ray-")
    ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _temp_dir=scratch)
    buffers, out = {}, {}
    try:
        for transport in cfg["transports"]:
            options = {"transport_options": {"backend": "gloo", "timeout": 60.0}} if transport == "distributed" else {}
            buffers[transport] = {}
            try:
                for batch in cfg["batches"]:
                    buffers[transport][f"b{batch}"] = RayReplayBuffer(
                        storage=partial(LazyTensorStorage, WORKERS * cfg["items_per_worker"]), sampler=RandomSampler,
                        remote_config={"num_cpus": 0}, transport=transport, **options)
            except Exception as e:  # noqa: BLE001 - recorded, the other transport still runs
                out[transport] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        clients = {t: {k: pickle.dumps(rb.client()) for k, rb in bs.items()} for t, bs in buffers.items()
                   if t not in out}
        if clients:
            address = ray.get_runtime_context().gcs_address
            barriers = {t: SPAWN.Barrier(WORKERS) for t in clients}
            workers = run_processes([(ray_worker, (i, address, clients, cfg, barriers)) for i in range(WORKERS)],
                                    cfg["deadline_s"])
            for t in clients:
                errors = [w[t]["error"] for w in workers if "error" in w[t]]
                out[t] = {"error": first_error(errors)} if errors else [w[t] for w in workers]
        return out
    finally:
        try:
            for bs in buffers.values():
                for rb in bs.values():
                    rb.close()
        finally:
            ray.shutdown()
            shutil.rmtree(scratch, ignore_errors=True)


# --- torchrl over torch.distributed.rpc --------------------------------------------------------
OWNER = "owner"
_buffers: dict = {}
_buffers_lock = threading.Lock()


def _owned_buffer(key: str, capacity: int):
    """On the owner: the buffer for ``key`` (made on the first call), as an RRef."""
    import torch.distributed.rpc as rpc
    from torchrl.data import LazyTensorStorage, RandomSampler, RemoteTensorDictReplayBuffer
    with _buffers_lock:
        if key not in _buffers:
            _buffers[key] = RemoteTensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=RandomSampler())
        return rpc.RRef(_buffers[key])


def rpc_node(rank: int, init_method: str, cfg: dict, barrier):
    """Rank 0 owns the buffers and serves until every node shuts down; ranks 1 and 2 are the
    workers, :func:`drive` on each buffer through ``rpc_sync``."""
    import torch
    import torch.distributed.rpc as rpc
    from tensordict import TensorDict
    from torchrl.data import RemoteTensorDictReplayBuffer as Remote

    options = rpc.TensorPipeRpcBackendOptions(init_method=init_method, rpc_timeout=60.0, num_worker_threads=8)
    rpc.init_rpc(OWNER if rank == 0 else f"worker{rank}", rank=rank, world_size=WORKERS + 1,
                 rpc_backend_options=options)
    try:
        if rank == 0:
            return None
        data = TensorDict({"x": torch.from_numpy(chunk_rows(cfg, seed=rank - 1))}, batch_size=[cfg["chunk"]])
        out = {}
        for batch in cfg["batches"]:
            rb = rpc.rpc_sync(OWNER, _owned_buffer, args=(f"b{batch}", WORKERS * cfg["items_per_worker"]))
            out[f"b{batch}"] = drive(lambda: rpc.rpc_sync(OWNER, Remote.extend, args=(rb, data)),
                                     lambda n: rpc.rpc_sync(OWNER, Remote.sample, args=(rb, n))["x"],
                                     lambda: barrier.wait(cfg["barrier_timeout_s"]), cfg, batch // WORKERS)
        return out
    finally:
        rpc.shutdown()


def run_torchrl_rpc(cfg: dict) -> list[dict]:
    scratch = tempfile.mkdtemp(prefix="reprise-peer-rpc-")
    try:
        barrier = SPAWN.Barrier(WORKERS)
        init = f"file://{os.path.join(scratch, 'rendezvous')}"
        return run_processes([(rpc_node, (r, init, cfg, barrier)) for r in range(WORKERS + 1)],
                             cfg["deadline_s"])[1:]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --- summaries -------------------------------------------------------------------------------
def summarize(workers: list[dict], cfg: Config) -> dict:
    """Per batch size: each round's items/s (rows of both workers / the slower worker's time)
    and their median, for inserts and samples."""
    out = {}
    for batch in cfg.batches:
        key = f"b{batch}"
        insert = np.max([w[key]["insert_s"] for w in workers], axis=0)
        sample = np.max([w[key]["sample_s"] for w in workers], axis=0)
        ins = len(workers) * cfg.insert_chunks * cfg.chunk / insert
        smp = cfg.steps * batch / sample
        out[key] = {"batch": batch, "rows_per_worker_step": batch // len(workers),
                    "sample_items_per_s": float(np.median(smp)), "sample_items_per_s_rounds": smp.tolist(),
                    "sample_step_ms": float(np.median(sample)) / cfg.steps * 1e3,
                    "sample_gb_per_s": float(np.median(smp)) * cfg.row_floats * 4 / 1e9,
                    "insert_items_per_s": float(np.median(ins)), "insert_items_per_s_rounds": ins.tolist()}
    return out


def run_reprise_group(cfg: dict, names: list[str]) -> dict:
    return {"reprise": run_reprise(cfg)}


def run_ray_group(cfg: dict, names: list[str]) -> dict:
    got = in_session(run_torchrl_ray, dict(cfg, transports=[n.removeprefix("torchrl-") for n in names]),
                     cfg["deadline_s"] + 60.0)
    return {f"torchrl-{t}": v for t, v in got.items()}


def run_rpc_group(cfg: dict, names: list[str]) -> dict:
    return {"torchrl-rpc": in_session(run_torchrl_rpc, cfg, cfg["deadline_s"] + 30.0)}


# Systems run one group after another; the two Ray transports share one Ray instance.
GROUPS = [(("reprise",), run_reprise_group), (("torchrl-ray", "torchrl-distributed"), run_ray_group),
          (("torchrl-rpc",), run_rpc_group)]


def run_group(names: list[str], runner, cfg: Config) -> dict:
    """Each system's entry: its summary (or error), the load before and after, the group's wall time."""
    load = os.getloadavg()[0]
    if load > BUSY_LOAD:
        log(f"WARNING: 1-minute load average {load:.2f} before {', '.join(names)}: the machine is busy")
    for n in names:
        log(f"{n}: {SYSTEMS[n]} ...")
    t0 = clock()
    try:
        got = runner(cfg.as_dict(), names)
    except Exception as e:  # noqa: BLE001 - recorded, the other systems still run
        got = {n: {"error": str(e)[-6000:]} for n in names}
    wall = round(clock() - t0, 1)
    entries = {}
    for n in names:
        entry = {"what": SYSTEMS[n], "loadavg_1m_before": round(load, 2), "wall_s": wall,
                 "loadavg_1m_after": round(os.getloadavg()[0], 2)}
        if len(names) > 1:
            entry["wall_s_shared_with"] = [m for m in names if m != n]
        workers = got.get(n, {"error": "no result"})
        if isinstance(workers, dict):
            entry["error"] = str(workers["error"])[-6000:]
            log(f"{n}: ERROR: {entry['error']}")
        else:
            entry["results"] = summarize(workers, cfg)
            log(f"{n}: done ({wall} s); sampled items/s " +
                ", ".join(f"B={e['batch']}: {si(e['sample_items_per_s'])}" for e in entry["results"].values()))
        entries[n] = entry
    return entries


def best_torchrl(report: dict, key: str) -> tuple[str, dict] | None:
    """The TorchRL variant with the most sampled items/s at ``key``, or None if none ran."""
    ran = [(n, s["results"][key]) for n, s in report["systems"].items()
           if n.startswith("torchrl") and key in s.get("results", {})]
    return max(ran, key=lambda r: r[1]["sample_items_per_s"]) if ran else None


def add_ratios(report: dict) -> None:
    """``report["ratios"][b{B}]``: Reprise's items/s over each TorchRL variant's and the best's."""
    reprise = report["systems"].get("reprise", {}).get("results", {})
    report["ratios"] = {}
    for key, r in reprise.items():
        best = best_torchrl(report, key)
        if best is None:
            continue
        each = {n: {"sample": r["sample_items_per_s"] / s["results"][key]["sample_items_per_s"],
                    "insert": r["insert_items_per_s"] / s["results"][key]["insert_items_per_s"]}
                for n, s in report["systems"].items() if n.startswith("torchrl") and key in s.get("results", {})}
        report["ratios"][key] = {"best_torchrl": best[0], "sample": each[best[0]]["sample"],
                                 "insert": each[best[0]]["insert"], "each": each,
                                 "goal_met": each[best[0]]["sample"] >= GOAL}


# --- markdown --------------------------------------------------------------------------------
def results_table(report: dict) -> list[str]:
    head = ["system", "B (rows/step, both workers)", "rows per worker step", "sampled items/s (median)",
            "rounds min-max", "sample step ms", "sampled GB/s", "inserted items/s (median)",
            "Reprise / this: sample", "Reprise / this: insert"]
    lines = md_table(head)
    for name, s in report["systems"].items():
        for key, e in s.get("results", {}).items():
            ratio = report["ratios"].get(key, {}).get("each", {}).get(name)
            rounds = e["sample_items_per_s_rounds"]
            lines.append(md_row([
                name, str(e["batch"]), str(e["rows_per_worker_step"]), f"**{si(e['sample_items_per_s'])}**",
                f"{si(min(rounds))}-{si(max(rounds))}", f"{e['sample_step_ms']:.2f}",
                f"{e['sample_gb_per_s']:.2f}", si(e["insert_items_per_s"]),
                f"{ratio['sample']:.2f}x" if ratio else "", f"{ratio['insert']:.2f}x" if ratio else ""]))
    return lines


def goal_lines(report: dict) -> list[str]:
    out = []
    for key, r in report["ratios"].items():
        batch = key[1:]
        out.append(f"- B={batch}: Reprise samples **{r['sample']:.2f}x** the items/s of TorchRL's fastest buffer "
                   f"here ({r['best_torchrl']}): {'met' if r['goal_met'] else '**missed**'}; inserts "
                   f"{r['insert']:.2f}x.")
    if not out:
        out.append("- not judged: Reprise or every TorchRL buffer failed (see Errors).")
    return out


def build_markdown(report: dict) -> str:
    cfg = report["config"]
    out = [f"# Cluster mode vs TorchRL's remote replay buffers, {report['date']}"
           + (" (QUICK: few rounds, noisy)" if report["quick"] else ""), "",
           *machine_lines(report), "",
           f"Command: `{report['command']}`. Versions: " +
           ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".", "",
           f"Workload: {WORKERS} worker processes, rows of one float32[{cfg['row_floats']}] field "
           f"({cfg['row_floats'] * 4} B, random). Each worker prefills {cfg['items_per_worker']:,} rows "
           f"(inserts of {cfg['chunk']} rows) and takes {cfg['warmup_steps']} warm-up samples; then "
           f"{cfg['rounds']} rounds of {cfg['insert_chunks']} timed inserts of {cfg['chunk']} rows and "
           f"{cfg['steps']} timed samples of B/2 rows, both workers at once (a barrier before each phase). "
           "Uniform draws with replacement; a fresh table or buffer per B, of "
           f"{WORKERS * cfg['items_per_worker']:,} rows in all. Items/s of a round = rows of both workers / "
           "the slower worker's time; medians over rounds. One torch thread per process.", "",
           "Systems:", *[f"- `{n}`: {SYSTEMS[n]}." for n in report["systems"]],
           "- TorchRL's buffers are central: their rows live in a third process (the Ray actor or the rpc "
           "owner) and every insert and sample crosses to it; Reprise's shards live in the two ranks, each "
           "insert is local and each sample is one collective draw over both shards (half the rows cross "
           "ranks over gloo).", ""]
    walls = "; ".join(f"{n} {s['wall_s']} s" + (" (one Ray instance with " + ", ".join(s["wall_s_shared_with"]) + ")"
                                               if s.get("wall_s_shared_with") else "")
                      for n, s in report["systems"].items())
    out += [f"Wall time, start-up and clean-up included: {walls}.", ""]
    out += busy_lines(report, BUSY_LOAD)
    errors = [f"- `{n}`: {s['error'].strip().splitlines()[-1] if s['error'].strip() else s['error']}"
              for n, s in report["systems"].items() if "error" in s]
    if errors:
        out += ["**Errors** (the full message is in the JSON):", *errors, ""]
    out += ["## Items/s", "", *results_table(report), "",
            f"## Against the goal (Reprise's sampled items/s >= {GOAL:.0f}x TorchRL's)", "",
            *goal_lines(report), ""]
    return "\n".join(out)


# --- main ------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few rounds: a smoke test, numbers are noise")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ",".join(SYSTEMS))
    ap.add_argument("--out-dir", default=OUT, help="where the .json and .md files go (default benchmarks/out)")
    args = ap.parse_args()
    wanted = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(wanted) - set(SYSTEMS))
    if unknown:
        ap.error(f"unknown systems {unknown}; expected some of {','.join(SYSTEMS)}")
    cfg = Config.choose(args.quick, None, FULL, QUICK)
    stem, report = start_report("cluster-peer", args.quick, args.out_dir, command=command_line(__spec__.name))
    report["config"] = cfg.as_dict()
    report["goal"] = {"sample_ratio_min": GOAL}
    report["versions"] = versions()
    t0 = clock()
    for names, runner in GROUPS:
        names = [n for n in names if n in wanted]
        if names:
            report["systems"].update(run_group(names, runner, cfg))
    add_ratios(report)
    report["wall_s"] = round(clock() - t0, 1)
    write_outputs(args.out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()

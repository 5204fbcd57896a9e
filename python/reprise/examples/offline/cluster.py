"""The offline demo in cluster mode: ``reprise demo offline --nproc N``, or the
demo started by ``torchrun``.

1. The dataset is generated (or read) once, exactly as by the single-process
   demo: by the parent before it spawns the ranks, or by rank 0 under torchrun,
   which broadcasts it. Its episodes are read back from the file.
2. N ranks join a gloo process group: spawned here with
   ``torch.multiprocessing`` and a TCPStore on port 0, or set up by torchrun
   (``init_process_group`` from ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``).
   Each runs one thread (``OMP_NUM_THREADS=1``); every collective has a timeout.
3. Every rank makes the same ``rp.distributed.ShardedTable`` (one shard per
   rank, Uniform sampler, the config's seed, the dataset's signature) and
   ``rp.distributed.load_dataset`` places the episodes over the shards, each
   owner inserting every K-step window of its episodes (an episode shorter
   than K as one item of its own length, as the single-process demo does).
4. The Decision Transformer (``model``) trains under
   ``DistributedDataParallel``: each step every rank calls
   ``table.sample(batch_size)``, one global draw of ``batch_size * N``, and
   trains on its own ``batch_size`` windows; DDP averages the gradients.
5. Rank 0 evaluates and writes ``summary.json`` and ``offline.png`` as the
   single-process demo does, with ``nproc``, each rank's throughput and the
   shards' sizes added.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

import reprise as rp

from .. import rundirs, stopping
from ..stopping import Interrupted, StopSignals, block_sigint
from .config import Config
from .dataset import check_signature, dataset_file, is_checkpoint, open_dataset
from .model import make_model
from .summary import Record, finish, write_interrupted
from .training import PROBE, device_of, normalisation, to_torch, train, valid_states

TABLE_TIMEOUT_S = 60.0    # every collective of the sharded table
GROUP_TIMEOUT_S = 300.0   # the process group's (DDP's all-reduces; under torchrun the wait for rank 0's dataset)


class RankFailed(RuntimeError):
    """A rank of ``--nproc N`` failed; the message holds its traceback."""


def under_torchrun() -> bool:
    """Whether this process was started by torchrun (or another launcher that
    sets ``RANK`` and ``WORLD_SIZE``)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run(cfg: Config, stop: StopSignals | None = None) -> dict | None:
    """The demo on ``cfg.nproc`` spawned ranks, or on torchrun's ranks. Returns
    the summary (None on the ranks other than 0 under torchrun). ``stop``: the
    parent's signal handlers (spawned ranks); a signal stops the ranks and
    writes a summary of how far the run got. Under torchrun it is not used:
    torchrun stops its ranks."""
    if under_torchrun():
        return _torchrun(cfg)
    if stop is None:
        with StopSignals() as own:
            return _spawn(cfg, own)
    return _spawn(cfg, stop)


# ------------------------------------------------------------------ dataset

def read_episodes(source: str, format: str, fields) -> list[dict]:
    """Every episode of a dataset file as ``{field: array[T, ...]}``, in file order."""
    from reprise.datasets.detect import open_reader
    src = open_reader(source, format)
    try:
        lengths = np.asarray(src.lengths(), dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        data = {f: src.read(f, 0, int(starts[-1])) for f in fields}
    finally:
        src.close()
    return [{f: a[starts[i]:starts[i + 1]] for f, a in data.items()} for i in range(len(lengths))]


def check_dataset(cfg: Config) -> None:
    if cfg.dataset and is_checkpoint(Path(cfg.dataset)):
        raise rp.errors.InvalidArgument(
            f"--nproc: {cfg.dataset} is a checkpoint; cluster mode reads the episodes from a dataset file "
            "(D4RL/Minari/npz, the input of reprise import), not from a checkpoint's tables")


def prepare(cfg: Config, started: float, out: Path, rec: Record | None = None) -> dict:
    """What every rank needs: the dataset made or read into ``out`` as the
    single-process demo does (its description printed), its episodes,
    statistics and signature. ``rec`` follows the phases."""
    check_dataset(cfg)
    rec = rec or Record(started)
    rec.phase = "making the dataset" if not cfg.dataset else "importing the dataset"
    path = dataset_file(cfg, out)
    rec.phase = "importing the dataset"
    windows, stats, close = open_dataset(cfg, path)
    rec.stats = stats
    try:
        signature = windows.store.signature
        check_signature(signature, state_dim=4)
    finally:
        close()
    episodes = read_episodes(stats["source"], stats["format"], list(signature))
    if not any(len(e["observations"]) >= cfg.context for e in episodes):
        raise rp.errors.InvalidArgument(f"--context {cfg.context}: no episode of {stats['source']} has that many "
                                        "steps, so cluster mode has no window to train on")
    return {"out": str(out), "stats": stats, "started": started, "episodes": episodes,
            "signature": {k: (tuple(f.shape), f.dtype) for k, f in signature.items()},
            "times": {"dataset_s": time.time() - started}}


def shard_capacity(lengths: np.ndarray, k: int, shards: int) -> int:
    """Steps per shard that hold every K-step window ``load_dataset`` may place on
    one shard: it gives each episode to the shard furthest below an even share of
    the steps, so no shard gets more than that share plus one episode."""
    return int(k * (np.ceil(lengths.sum() / shards) + lengths.max())) + 2 * 64


# ---------------------------------------------------------------- launchers

def _spawn(cfg: Config, stop: StopSignals) -> dict:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as tmp
    rec = Record(time.time())
    device_of(cfg, torch)  # an unusable --device fails here, not in every rank
    check_dataset(cfg)
    run_dir, ranks, pids = None, None, []
    try:
        try:
            with stop.hold():  # a signal waits until the directory is claimed: the summary goes there
                run_dir = rundirs.claim("offline", cfg.out)
                cfg = dataclasses.replace(cfg, out=str(run_dir.path))
            payload = prepare(cfg, rec.started, run_dir.path, rec)
            rec.times.update(payload["times"])
            master = dist.TCPStore("127.0.0.1", 0, cfg.nproc + 1, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=GROUP_TIMEOUT_S))
            print(f"cluster: spawning {cfg.nproc} ranks (gloo, one thread each)", flush=True)
            rec.phase = f"training on {cfg.nproc} ranks"
            threads = os.environ.get("OMP_NUM_THREADS")
            os.environ["OMP_NUM_THREADS"] = "1"  # read by the children's torch at import
            try:
                # The ranks start with SIGINT blocked and then ignore it (stopping.child_setup):
                # the terminal's Ctrl-C is for this process, which stops them.
                with stop.hold(), block_sigint():
                    ranks = tmp.spawn(_spawned, args=(cfg.nproc, master.port, cfg, {**payload, "parent": os.getpid()}),
                                      nprocs=cfg.nproc, join=False)
                    pids = [p.pid for p in ranks.processes]
            finally:
                if threads is None:
                    os.environ.pop("OMP_NUM_THREADS", None)
                else:
                    os.environ["OMP_NUM_THREADS"] = threads
            try:
                while not ranks.join(timeout=0.5):
                    pass
            except tmp.ProcessRaisedException as e:
                raise RankFailed(f"a rank failed (the others were stopped):\n{e}") from None
            except tmp.ProcessExitedException as e:
                raise RankFailed(f"a rank exited early (the others were stopped): {e}") from None
            stop.stopping()
            return json.loads((run_dir.path / "summary.json").read_text())
        except Interrupted:
            if run_dir is None:
                raise  # before the run directory: main says that nothing was written
            stop.stopping()
            _stop_ranks(ranks)
            return write_interrupted(cfg, stop, rec, cfg.device, run_dir.path,
                                          extra={"cluster": {"launcher": "spawn", "ranks": cfg.nproc}})
    finally:
        stop.stopping()
        _stop_ranks(ranks)
        # A rank killed (by us, or by torch when another failed) could not close its shard.
        stopping.remove_shared_memory_of(pids)
        if run_dir is not None:
            run_dir.release()


def _stop_ranks(ranks, grace: float = 5.0) -> None:
    """SIGTERM to the ranks still running, SIGKILL after ``grace`` seconds; joined."""
    if ranks is None:
        return
    for p in ranks.processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in ranks.processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _spawned(rank: int, world: int, port: int, cfg: Config, payload: dict):
    stopping.child_setup(payload["parent"])
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    try:
        train_rank(cfg, payload, launcher="spawn", local_rank=rank)
    finally:
        dist.destroy_process_group()


def _torchrun(cfg: Config) -> dict | None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        if rank == 0 and cfg.nproc not in (1, world):
            print(f"cluster: --nproc {cfg.nproc} ignored: torchrun started {world} ranks", flush=True)
        box, error = [None], None
        if rank == 0:
            try:
                box[0] = prepare(cfg, time.time(), rundirs.claim("offline", cfg.out).path)
            except Exception as e:  # noqa: BLE001 - the other ranks must hear of it, not wait
                error, box[0] = e, {"error": f"rank 0 could not prepare the dataset: {type(e).__name__}: {e}"}
        dist.broadcast_object_list(box, src=0)
        if error is not None:
            raise error
        if "error" in box[0]:
            raise RankFailed(box[0]["error"])
        return train_rank(cfg, box[0], launcher="torchrun", local_rank=int(os.environ.get("LOCAL_RANK", rank)))
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------- one rank

def train_rank(cfg: Config, payload: dict, launcher: str, local_rank: int) -> dict | None:
    """One rank's part: the sharded table, its share of the dataset, DDP training
    on its sub-batch of every global draw; rank 0 then evaluates and writes the
    summary (returned; None on other ranks)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = dataclasses.replace(cfg, nproc=world)
    dev = device_of(cfg, torch, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    k = cfg.context
    signature = {name: rp.Field(shape, dtype) for name, (shape, dtype) in payload["signature"].items()}
    episodes = payload["episodes"]
    lengths = np.array([len(next(iter(e.values()))) for e in episodes], dtype=np.int64)
    expected = int(np.where(lengths >= k, lengths - k + 1, 1).sum())  # a short episode is one item

    table = rp.distributed.ShardedTable("windows", signature, capacity_per_shard=shard_capacity(lengths, k, world),
                                        sampler=rp.selectors.Uniform(), shards="rank", seed=cfg.seed,
                                        timeout=TABLE_TIMEOUT_S)
    try:
        inserted = rp.distributed.load_dataset(table, episodes, priority=1.0, window=k)
        info = table.info()
        if info["size"] != expected:
            raise RuntimeError(f"the sharded table holds {info['size']} windows after load_dataset, expected "
                               f"{expected} (every {k}-step window, and each of the {int((lengths < k).sum())} shorter "
                               f"episodes whole)")
        if rank == 0:
            sizes = ", ".join(f"{s['size']:,}" for s in info["shards"])
            print(f"cluster: {world} ranks ({launcher}, gloo), {table.num_shards} shards of K={k} windows "
                  f"({sizes}; {expected:,} in all); each step draws {cfg.batch_size * world} windows "
                  f"globally, {cfg.batch_size} per rank, on {dev}", flush=True)
        sample_device = None if dev.type == "cpu" else dev

        def batch(per_rank: int):
            return to_torch(table.sample(per_rank, device=sample_device), torch, dev)

        # The state normalisation from one global draw of about PROBE windows,
        # every rank's share gathered so that every rank normalises alike.
        states, top = valid_states(*batch(-(-PROBE // world)), torch, dev)
        shares = [None] * world
        dist.all_gather_object(shares, (states.cpu().numpy(), top))
        states = torch.from_numpy(np.concatenate([s for s, _ in shares])).to(dev)
        state_mean, state_std, max_timestep = normalisation(states, max(t for _, t in shares), cfg)

        model = make_model(4, 2, max_timestep, cfg).to(dev)
        ddp = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
        setup_s = time.time() - t0
        losses, train_s, sample_s = train(cfg, ddp, lambda: batch(cfg.batch_size), state_mean, state_std,
                                               torch, dev, show=rank == 0, unit="samples/s per rank")
        samples = cfg.steps * cfg.batch_size
        mine = {"rank": rank, "shard": table.shard, "device": str(dev), "windows": inserted, "samples": samples,
                "train_s": train_s, "sample_s": sample_s, "samples_per_s": samples / max(train_s, 1e-9),
                "losses": losses}
        info = table.info()
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
    finally:
        table.close()
    if rank != 0:
        return None

    losses = np.mean([r.pop("losses") for r in everyone], axis=0).tolist()  # the mean over ranks, per step
    times = {**payload["times"], "setup_s": setup_s, "train_s": max(r["train_s"] for r in everyone)}
    train_extra = {"nproc": world, "global_batch_size": cfg.batch_size * world, "per_rank": everyone,
                   "loss_of_a_step": "the mean over the ranks"}
    extra = {"cluster": {
        "launcher": launcher, "ranks": world, "backend": "gloo", "shards": "rank", "sampler": "Uniform",
        "windows": info["size"], "episodes_shorter_than_context": int((lengths < k).sum()),
        "table": {key: info[key] for key in ("num_shards", "step", "size", "num_inserts", "num_samples")},
        "shard_sizes": [s["size"] for s in info["shards"]],
        "collective_timeout_s": TABLE_TIMEOUT_S}}
    return finish(cfg, dev, Path(payload["out"]), payload["stats"], model, state_mean, state_std, max_timestep,
                       losses, times, payload["started"], train_extra, extra, where=f"{world} ranks ({dev})")

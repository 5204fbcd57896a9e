"""The run: one process (``run``), or cluster mode (``cluster``) with ``--nproc N`` or under
torchrun; ``main`` is ``reprise demo offline``."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
import time

import reprise as rp

from .. import rundirs
from ..devices import device_problem
from ..stopping import Interrupted, StopSignals
from . import cluster
from .cluster import RankFailed, under_torchrun
from .config import Config, parse_args
from .dataset import check_signature, dataset_file, open_dataset
from .model import make_model
from .summary import Record, finish, write_interrupted
from .training import PROBE, TRAIN_FIELDS, device_of, normalisation, to_torch, train, valid_states


def run(cfg: Config, stop: StopSignals | None = None) -> dict | None:
    """Runs the demo; returns the summary (also written to ``<out>/summary.json``).
    With ``cfg.nproc > 1`` or under torchrun, runs it on several ranks
    (``cluster.run``; None on ranks other than 0 under torchrun).
    ``stop``: the signal handlers ``main`` installed; without them ``run`` installs
    its own for its duration. A signal ends the run early, with a summary
    (``ended: interrupted``, ``signal``, ``phase``)."""
    if under_torchrun():
        return cluster.run(cfg, stop)
    if stop is None:
        with StopSignals() as own:
            return run(cfg, own)
    if cfg.nproc > 1:
        return cluster.run(cfg, stop)
    import torch
    dev = device_of(cfg, torch)
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        # Half the cores at most: a small model gains little from more threads, and
        # oversubscribed OpenMP threads slow to a crawl when the machine is busy.
        torch.set_num_threads(max(1, min(4, (os.cpu_count() or 1) // 2)))
    try:
        return _run(cfg, torch, dev, stop)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: Config, torch, dev, stop: StopSignals) -> dict:
    rec = Record(time.time())
    run_dir = close = None
    try:
        try:
            with stop.hold():  # a signal waits until the directory is claimed: the summary goes there
                run_dir = rundirs.claim("offline", cfg.out)
                cfg = dataclasses.replace(cfg, out=str(run_dir.path))
            out = run_dir.path
            torch.manual_seed(cfg.seed)
            rec.phase = "making the dataset" if not cfg.dataset else "importing the dataset"
            path = dataset_file(cfg, out)
            rec.phase = "importing the dataset"
            with stop.hold():  # its stores exist, and will be closed, or not at all
                windows, rec.stats, close = open_dataset(cfg, path)
            rec.times["dataset_s"] = time.time() - rec.started
            check_signature(windows.store.signature, state_dim=4)
            sample_device = None if dev.type == "cpu" else dev

            def batch(n):
                return to_torch(windows.sample(n, fields=list(TRAIN_FIELDS), device=sample_device), torch, dev)

            # State normalisation and the timestep range, from a large draw.
            state_mean, state_std, max_timestep = normalisation(*valid_states(*batch(PROBE), torch, dev), cfg)
            model = make_model(4, 2, max_timestep, cfg).to(dev)
            rec.phase = "training"
            _, rec.times["train_s"], _ = train(cfg, model, lambda: batch(cfg.batch_size), state_mean, state_std,
                                               torch, dev, losses=rec.losses)
            rec.phase = "evaluating"
            summary = finish(cfg, dev, out, rec.stats, model, state_mean, state_std, max_timestep, rec.losses,
                             dict(rec.times), rec.started, stop=stop)
            stop.stopping()
            return summary
        except Interrupted:
            if run_dir is None:
                raise  # before the run directory: main says that nothing was written
            stop.stopping()
            return write_interrupted(cfg, stop, rec, dev, run_dir.path)
    finally:
        stop.stopping()
        if close is not None:
            close()
        if run_dir is not None:
            run_dir.release()


def main(argv=None) -> int:
    """``reprise demo offline``. Exit status: 0 done, 1 a rank failed, 2 refused (options,
    missing packages, dataset, device, output directory in use), 128 + the signal's number
    when stopped by SIGINT (130) or SIGTERM (143). Under torchrun, torchrun handles the
    signals (it stops the ranks), and the demo installs no handlers of its own."""
    handlers = contextlib.nullcontext(None) if under_torchrun() else StopSignals(quiet_after=True)
    with handlers as stop:
        try:
            cfg = parse_args(sys.argv[1:] if argv is None else argv)
            missing = [m for m in ("torch", "gymnasium", "matplotlib", "h5py") if importlib.util.find_spec(m) is None]
            if missing:
                print(f"reprise demo offline: needs {', '.join(missing)}: pip install 'reprise[demo]'", file=sys.stderr)
                return 2
            problem = device_problem(cfg.device)
            if problem is not None:
                print(f"reprise demo offline: {problem}", file=sys.stderr)
                return 2
            run(cfg, stop)
        except Interrupted as e:
            print(f"reprise demo offline: stopped by {e.name} before the run began; nothing was written",
                  file=sys.stderr)
            return e.exit_code
        except (rp.errors.RepriseError, rundirs.DirectoryInUse) as e:
            print(f"reprise demo offline: {e}", file=sys.stderr)
            return 2
        except RankFailed as e:
            print(f"reprise demo offline: {e}", file=sys.stderr)
            return 1
    if stop is not None and stop.interrupted:
        return stop.exit_code
    return 0

"""How a run ends: ``summary.json`` (and ``offline.png``) of a completed run, after its
evaluation, or of one a signal stopped, from what it had done (``Record``)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from ..stopping import StopSignals, signal_name
from .config import Config
from .evaluation import evaluate, random_returns
from .plots import plot
from ..rundirs import write_json


def finish(cfg: Config, dev, out: Path, stats: dict, model, state_mean, state_std, max_timestep, losses: list,
           times: dict, started: float, train_extra: dict | None = None, extra: dict | None = None,
           where: str | None = None, stop: StopSignals | None = None) -> dict:
    """Evaluates ``model`` (and a random policy), writes ``summary.json`` and
    ``offline.png`` into ``out``, prints the result; returns the summary.
    ``times`` holds ``train_s``; ``train_extra`` and ``extra`` go into the
    summary's ``train`` and top level. With ``stop``, a signal during the plot
    skips it (the summary says so)."""
    import torch
    t1 = time.time()
    eval_returns = evaluate(model, torch, dev, cfg, cfg.eval_episodes, state_mean, state_std,
                            max_timestep, seed=cfg.seed + 10_000)
    times["eval_s"] = time.time() - t1
    baseline = random_returns(cfg.random_episodes, seed=cfg.seed + 20_000)
    if stop is not None:
        stop.stopping()  # from here a signal only skips the plot
    times["total_s"] = time.time() - started
    samples = cfg.steps * cfg.batch_size * cfg.nproc
    summary = {
        "ended": "completed",
        "interrupted": False,
        "signal": None,
        "phase": None,
        "config": dataclasses.asdict(cfg),
        "device": str(dev),
        "dataset": stats,
        "train": {"steps": cfg.steps, "steps_done": len(losses), "samples": samples,
                  "first_loss": float(np.mean(losses[:20])), "final_loss": float(np.mean(losses[-20:])),
                  "samples_per_s": samples / max(times["train_s"], 1e-9), **(train_extra or {})},
        "eval": {"target_return": cfg.target_return, "returns": eval_returns,
                 "mean_return": float(np.mean(eval_returns)), "std_return": float(np.std(eval_returns))},
        "random_policy": {"returns": baseline, "mean_return": float(np.mean(baseline))},
        **(extra or {}),
        "times": times,
        "plot": None,
    }
    write_json(out / "summary.json", summary)
    if stop is None:
        plot(out / "offline.png", losses, summary)
        drawn = True
    else:
        drawn, _ = stop.optional(plot, out / "offline.png", losses, summary)
    summary.update(plot="offline.png" if drawn else None, interrupted=stop is not None and stop.interrupted,
                   signal=signal_name(stop.first) if stop is not None else None)
    write_json(out / "summary.json", summary)
    print(f"Decision Transformer, target return {cfg.target_return:g}: mean return "
          f"{summary['eval']['mean_return']:.1f} over {len(eval_returns)} episodes "
          f"(dataset mean {stats.get('return_mean', float('nan')):.1f}, random policy "
          f"{summary['random_policy']['mean_return']:.1f}); loss {summary['train']['first_loss']:.3f} -> "
          f"{summary['train']['final_loss']:.3f} in {cfg.steps} steps on {where or dev}; {times['total_s']:.0f} s")
    print(f"wrote {out / 'summary.json'}" + (f" and {out / 'offline.png'}" if drawn else
                                             f" (plot skipped: stopped by {summary['signal']})"), flush=True)
    return summary


class Record:
    """What a run has done so far, for the summary of one that a signal stopped."""

    def __init__(self, started: float):
        self.started = started
        self.phase = "starting"     # starting, making the dataset, importing, training, evaluating, ...
        self.stats: dict | None = None
        self.losses: list = []
        self.times: dict = {}


def write_interrupted(cfg: Config, stop: StopSignals, rec: Record, dev, out: Path, extra: dict | None = None) -> dict:
    """``summary.json`` of a run a signal stopped: how far it got. No plot."""
    losses = rec.losses
    summary = {
        "ended": "interrupted",
        "interrupted": True,
        "signal": signal_name(stop.first),
        "phase": rec.phase,
        "config": dataclasses.asdict(cfg),
        "device": None if dev is None else str(dev),
        "dataset": rec.stats,
        "train": {"steps": cfg.steps, "steps_done": len(losses),
                  "first_loss": float(np.mean(losses[:20])) if losses else None,
                  "last_loss": float(np.mean(losses[-20:])) if losses else None},
        **(extra or {}),
        "times": {**rec.times, "total_s": time.time() - rec.started},
        "plot": None,
    }
    write_json(out / "summary.json", summary)
    print(f"stopped by {summary['signal']} while {rec.phase}, after {summary['times']['total_s']:.0f} s and "
          f"{len(losses)} of {cfg.steps} training steps; wrote {out / 'summary.json'}", flush=True)
    return summary

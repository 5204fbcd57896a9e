"""Offline RL on Reprise: a Decision Transformer trained on windows of an imported dataset.

    reprise demo offline                   # CartPole-v1, a few minutes on a CPU; close to 500
    reprise demo offline --smoke           # well under a minute; shows learning
    reprise demo offline --dataset D       # an existing dataset file or checkpoint instead
    reprise demo offline --nproc 2         # cluster mode: 2 ranks, a sharded table, DDP
    torchrun --nproc-per-node 2 -m reprise.examples.offline   # the same under torchrun
    python -m reprise.examples.offline --help

What it does:

1. **Dataset.** Unless ``--dataset`` is given, it plays CartPole-v1 with a scripted
   controller (push the cart toward the pole's lean, from angle and angular velocity)
   that takes a random action with a per-episode probability drawn from [0, 1], so
   returns span ~10 to 500. Each step gets its ``returns_to_go`` (the rewards from
   that step to the episode's end) and ``timesteps`` (its index in the episode), and
   the episodes are written as an HDF5 file in the D4RL layout in the run directory.
2. **Import.** ``rp.datasets.load(file, window=K)``: one store holding every step, a
   ``windows`` table with one item per K-step window inside an episode.
3. **Training.** A Decision Transformer (Chen et al., 2021): a causal transformer over
   (return-to-go, state, action) tokens with timestep embeddings, predicting each action
   from the tokens up to its state, cross-entropy on the dataset's actions. Batches are
   ``windows.sample(B, device=dev)``: ``[B, K]`` windows gathered on the GPU when there is
   one; items of episodes shorter than K are zero-padded past ``lengths`` and masked out
   of the loss.
4. **Evaluation.** Online in CartPole-v1, conditioned on ``--target-return`` (500): the
   mean return over ``--eval-episodes``, beside a uniformly random policy (~22) and the
   dataset's mean return. ``summary.json`` and ``offline.png`` go into ``--out``.

With ``--nproc N`` (or under ``torchrun``) the same model trains on N ranks with
DistributedDataParallel, its windows drawn from an ``rp.distributed.ShardedTable``
with one shard per rank: ``offline_cluster.py``. Everything else is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import reprise as rp

from . import rundirs
from .devices import device_problem
from .helpformat import default_note, demo_parser, parsed_values
from .progress import ProgressLine
from .stopping import Interrupted, StopSignals, signal_name

ENV = "CartPole-v1"
FIELDS = ("observations", "actions", "rewards", "returns_to_go", "timesteps")
TRAIN_FIELDS = ("observations", "actions", "returns_to_go", "timesteps")  # what a training batch reads
PROBE = 2048  # windows drawn once for the state normalisation
RTG_SCALE = 100.0  # returns-to-go are fed to the model divided by this
LINE_EVERY_S = 10.0  # a progress line this often without a terminal


@dataclass
class Config:
    episodes: int = 200              # generated episodes
    steps: int = 1_000               # training steps
    batch_size: int = 64
    context: int = 20                # K: steps per window
    dim: int = 64
    layers: int = 2
    heads: int = 2
    lr: float = 1e-3
    target_return: float = 500.0
    eval_episodes: int = 10
    random_episodes: int = 20
    dataset: str | None = None       # a dataset file or checkpoint; default: generate one
    device: str | None = None        # default: cuda when available
    seed: int = 0
    out: str | None = None           # default: a new ./reprise-runs/offline-<time>-<pid> (rundirs.py)
    smoke: bool = False
    nproc: int = 1                   # ranks (cluster mode when > 1, or under torchrun)


SMOKE = {"episodes": 40, "steps": 300, "batch_size": 32, "context": 10, "eval_episodes": 5}


def controller(obs: np.ndarray) -> int:
    """Push toward the pole's lean: 1 (right) when it leans or falls to the right."""
    x, x_dot, theta, theta_dot = obs
    return int(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0)


def generate(episodes: int, seed: int) -> dict:
    """Per-step arrays of ``episodes`` CartPole episodes played by ``controller`` with a
    per-episode random-action rate: D4RL names plus returns_to_go and timesteps."""
    import gymnasium as gym
    env = gym.make(ENV)
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("observations", "actions", "rewards", "terminals", "timeouts",
                            "returns_to_go", "timesteps")}
    for _ in range(episodes):
        random_rate = rng.uniform(0.0, 1.0)
        obs, _ = env.reset(seed=int(rng.integers(2**31)))
        steps = []
        done = False
        while not done:
            a = int(rng.integers(2)) if rng.random() < random_rate else controller(obs)
            nxt, r, terminated, truncated, _ = env.step(a)
            steps.append((obs, a, r, terminated, truncated))
            obs, done = nxt, terminated or truncated
        rewards = np.array([s[2] for s in steps], np.float32)
        cols["observations"].append(np.array([s[0] for s in steps], np.float32))
        cols["actions"].append(np.array([s[1] for s in steps], np.int64))
        cols["rewards"].append(rewards)
        cols["terminals"].append(np.array([s[3] for s in steps], bool))
        cols["timeouts"].append(np.array([s[4] for s in steps], bool))
        cols["returns_to_go"].append(np.cumsum(rewards[::-1])[::-1].astype(np.float32))
        cols["timesteps"].append(np.arange(len(steps), dtype=np.int64))
    env.close()
    return {k: np.concatenate(v) for k, v in cols.items()}


def make_model(state_dim: int, num_actions: int, max_timestep: int, cfg: Config):
    import torch
    from torch import nn

    class DecisionTransformer(nn.Module):
        """Tokens r_0, s_0, a_0, r_1, ... (each plus its timestep's embedding) through a
        causal transformer; the output at s_t's token predicts a_t."""

        def __init__(self):
            super().__init__()
            self.timestep = nn.Embedding(max_timestep + 1, cfg.dim)
            self.rtg = nn.Linear(1, cfg.dim)
            self.state = nn.Linear(state_dim, cfg.dim)
            self.action = nn.Embedding(num_actions, cfg.dim)
            self.norm = nn.LayerNorm(cfg.dim)
            # No dropout: data is plentiful for a model this small, and dropout is slow on CPUs.
            layer = nn.TransformerEncoderLayer(cfg.dim, cfg.heads, 4 * cfg.dim, dropout=0.0,
                                               batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
            self.head = nn.Linear(cfg.dim, num_actions)

        def forward(self, rtg, states, actions, timesteps):
            b, t = actions.shape
            time_emb = self.timestep(timesteps.clamp(0, max_timestep))
            tokens = torch.stack([self.rtg(rtg.unsqueeze(-1)) + time_emb, self.state(states) + time_emb,
                                  self.action(actions) + time_emb], dim=2).reshape(b, 3 * t, -1)
            mask = nn.Transformer.generate_square_subsequent_mask(3 * t, device=tokens.device)
            h = self.blocks(self.norm(tokens), mask=mask, is_causal=True)
            return self.head(h[:, 1::3])

    return DecisionTransformer()


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint directory (or holds checkpoints)."""
    return path.is_dir() and ((path / "MANIFEST.json").exists() or bool(rp.checkpoint.checkpoints(path)))


def dataset_file(cfg: Config, out: Path) -> Path:
    """``--dataset``, or a dataset generated into ``out`` (``cartpole-scripted.hdf5``)."""
    if cfg.dataset:
        return Path(cfg.dataset)
    path = out / "cartpole-scripted.hdf5"
    rp.datasets.write_d4rl(path, generate(cfg.episodes, cfg.seed),
                           metadata={"policy": "scripted controller, per-episode random-action rate U(0, 1)"})
    return path


def open_dataset(cfg: Config, path: Path):
    """``(windows table, stats, closer)``: the dataset file at ``path`` imported with
    ``window=K``, or the tables of the checkpoint there. Closed again if it fails."""
    if is_checkpoint(path):
        tables = rp.checkpoint.load(path)
        stores = {id(t.store): t.store for t in tables.values()}.values()

        def close():
            for store in stores:
                store.close()
        try:
            if "windows" not in tables:
                raise rp.errors.InvalidArgument(f"{path}: the checkpoint has no 'windows' table; "
                                                "make it with reprise import --window K")
            windows = tables["windows"]
            stats = {"source": str(path), "format": "reprise checkpoint", "windows": windows.size}
            if "episodes" in tables and "rewards" in windows.store.signature:
                s = tables["episodes"].sample(min(4 * tables["episodes"].size, 4096), fields=["rewards"])
                keys, first = np.unique(s.keys, return_index=True)
                returns = s.data["rewards"][first].sum(axis=1)
                stats.update(episodes=tables["episodes"].size, return_mean=float(returns.mean()),
                             return_min=float(returns.min()), return_max=float(returns.max()),
                             returns_from=f"{keys.size} episodes drawn")
        except BaseException:
            close()
            raise
        return windows, stats, close
    sig = rp.datasets.infer_signature(path)
    missing = [f for f in FIELDS if f not in sig]
    if missing:
        raise rp.errors.InvalidArgument(f"{path}: the demo needs per-step {', '.join(FIELDS)}; missing {missing}")
    ds = rp.datasets.load(path, window=cfg.context, fields=list(FIELDS), seed=cfg.seed)
    try:
        print(ds.describe())
        r = ds.episode_returns
        stats = {"source": ds.source, "format": ds.format, "steps": ds.num_steps, "episodes": ds.num_episodes,
                 "windows": ds.windows.size, "return_mean": float(r.mean()), "return_min": float(r.min()),
                 "return_max": float(r.max()), "episode_length_mean": float(ds.episode_lengths.mean())}
    except BaseException:
        ds.close()
        raise
    return ds.windows, stats, ds.close


def check_signature(sig: dict, state_dim: int):
    obs, act = sig.get("observations"), sig.get("actions")
    missing = [f for f in FIELDS if f not in sig]
    if missing or obs.shape != (state_dim,) or not act.dtype.startswith(("int", "uint")) or act.shape != ():
        raise rp.errors.InvalidArgument(f"the demo needs {ENV} steps: observations [{state_dim}], integer actions, "
                                        f"rewards, returns_to_go, timesteps; got {sig}")


def evaluate(model, torch, dev, cfg: Config, episodes: int, state_mean, state_std, max_timestep, seed: int) -> list:
    """Returns of ``episodes`` episodes acting greedily, conditioned on ``cfg.target_return``."""
    import gymnasium as gym
    env = gym.make(ENV)
    k = cfg.context
    model.eval()
    returns = []
    with torch.no_grad():
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            limit = env.spec.max_episode_steps or 10_000
            states = torch.zeros(limit, obs.shape[0], device=dev)
            actions = torch.zeros(limit, dtype=torch.long, device=dev)
            rtg = torch.zeros(limit, device=dev)
            timesteps = torch.arange(limit, device=dev).clamp(max=max_timestep)
            remaining, total, done, t = cfg.target_return, 0.0, False, 0
            while not done:
                states[t] = (torch.as_tensor(obs, device=dev) - state_mean) / state_std
                rtg[t] = remaining / RTG_SCALE
                lo = max(0, t + 1 - k)
                logits = model(rtg[None, lo:t + 1], states[None, lo:t + 1], actions[None, lo:t + 1],
                               timesteps[None, lo:t + 1])
                a = int(logits[0, -1].argmax())
                actions[t] = a
                obs, r, terminated, truncated, _ = env.step(a)
                remaining -= r
                total += r
                done, t = terminated or truncated, t + 1
            returns.append(total)
    env.close()
    model.train()
    return returns


def random_returns(episodes: int, seed: int) -> list:
    import gymnasium as gym
    env = gym.make(ENV)
    env.action_space.seed(seed)
    out = []
    for i in range(episodes):
        env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            _, r, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done = total + r, terminated or truncated
        out.append(total)
    env.close()
    return out


def plot(path: Path, losses: list, summary: dict):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    steps = np.arange(1, len(losses) + 1)
    left.plot(steps, losses, color="tab:blue", alpha=0.3, linewidth=0.8, label="batch loss")
    w = max(1, min(50, len(losses) // 10))
    left.plot(steps[w - 1:], np.convolve(losses, np.ones(w) / w, mode="valid"), color="tab:blue",
              label=f"mean of {w}")
    left.set_xlabel("training step")
    left.set_ylabel("action cross-entropy")
    ranks = summary["config"].get("nproc", 1)
    left.set_title(f"training on [{summary['config']['batch_size']}, {summary['config']['context']}] windows"
                   + (f" on each of {ranks} ranks" if ranks > 1 else ""))
    left.legend(fontsize=8)
    bars = {"random policy": summary["random_policy"]["mean_return"],
            "dataset (mean)": summary["dataset"].get("return_mean", float("nan")),
            "Decision Transformer": summary["eval"]["mean_return"]}
    right.bar(list(bars), list(bars.values()), color=["tab:gray", "tab:green", "tab:blue"])
    right.errorbar([2], [bars["Decision Transformer"]], yerr=[summary["eval"]["std_return"]], color="black",
                   capsize=4)
    right.axhline(summary["config"]["target_return"], color="tab:red", linestyle="--", linewidth=1,
                  label=f"target return {summary['config']['target_return']:g}")
    right.set_ylabel(f"{ENV} episode return")
    right.set_title(f"evaluation over {len(summary['eval']['returns'])} episodes")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def to_torch(sample, torch, dev):
    """``(data, lengths)``: a sample's training fields and lengths as tensors on ``dev``."""
    data = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v).to(dev)
            for k, v in sample.data.items() if k in TRAIN_FIELDS}
    return data, torch.from_numpy(sample.lengths).to(dev)


def valid_states(data, lengths, torch, dev):
    """``(states, top)``: the states of a batch's steps inside its items (not the
    padding) and its largest timestep."""
    valid = torch.arange(data["observations"].shape[1], device=dev)[None] < lengths[:, None]
    return data["observations"][valid].float(), int(data["timesteps"].max())


def normalisation(states, top: int, cfg: Config):
    """``(state_mean, state_std, max_timestep)`` from a probe's valid states and largest timestep."""
    return states.mean(0), states.std(0) + 1e-6, max(500, top + cfg.context)


def train(cfg: Config, model, next_batch, state_mean, state_std, torch, dev, show: bool = True,
          unit: str = "samples/s", losses: list | None = None):
    """``cfg.steps`` steps of AdamW (linear warm-up over the first 10%, gradients
    clipped to norm 1) on ``next_batch() -> (data, lengths)``, the loss masked past
    each item's length. Returns ``(losses, seconds, seconds inside next_batch)``;
    ``losses`` (if given) is filled as it goes, so a caller stopped midway has them.
    ``show``: the progress line (one rank of several shows it)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    warmup = max(1, cfg.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup))
    progress = ProgressLine("train", every=LINE_EVERY_S, enabled=show)
    losses = [] if losses is None else losses
    t0, waited = time.time(), 0.0
    try:
        for step in range(cfg.steps):
            t = time.time()
            data, lengths = next_batch()
            waited += time.time() - t
            k = data["actions"].shape[1]
            logits = model(data["returns_to_go"].float() / RTG_SCALE,
                           (data["observations"].float() - state_mean) / state_std,
                           data["actions"].long(), data["timesteps"].long())
            mask = torch.arange(k, device=dev)[None] < lengths[:, None]
            loss = torch.nn.functional.cross_entropy(logits[mask], data["actions"].long()[mask])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            elapsed = time.time() - t0
            rate = (step + 1) * cfg.batch_size / max(elapsed, 1e-9)
            progress.update((step + 1) / cfg.steps, f"step {step + 1}/{cfg.steps} loss {np.mean(losses[-20:]):.4f} "
                                                    f"{rate:,.0f} {unit} {elapsed:.0f} s")
    finally:
        progress.close()
    return losses, time.time() - t0, waited


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


def write_json(path: Path, value) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)


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


def run(cfg: Config, stop: StopSignals | None = None) -> dict | None:
    """Runs the demo; returns the summary (also written to ``<out>/summary.json``).
    With ``cfg.nproc > 1`` or under torchrun, runs it on several ranks
    (``offline_cluster.run``; None on ranks other than 0 under torchrun).
    ``stop``: the signal handlers ``main`` installed; without them ``run`` installs
    its own for its duration. A signal ends the run early, with a summary
    (``ended: interrupted``, ``signal``, ``phase``)."""
    from . import offline_cluster
    if offline_cluster.under_torchrun():
        return offline_cluster.run(cfg, stop)
    if stop is None:
        with StopSignals() as own:
            return run(cfg, own)
    if cfg.nproc > 1:
        return offline_cluster.run(cfg, stop)
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


def device_of(cfg: Config, torch, index: int | None = None):
    """``--device``, else cuda when available (``cuda:index`` when given), else cpu."""
    dev = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise rp.errors.InvalidArgument(f"--device {cfg.device}: CUDA is not available here")
    if dev.type == "cuda" and index is not None and dev.index is None:
        dev = torch.device("cuda", index % torch.cuda.device_count())
    return dev


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


EPILOG = """\
output: a new directory ./reprise-runs/offline-<time>-<pid> (or --out) with the generated
dataset, summary.json and offline.png.
exit status: 0 done, 1 a rank failed (--nproc), 2 a refused option, dataset, device or
output directory, 130 / 143 stopped by SIGINT (Ctrl-C) / SIGTERM (summary.json says how far
it got)."""


def make_parser() -> argparse.ArgumentParser:
    """The command line. Each option's help ends with its default, once (no
    ArgumentDefaultsHelpFormatter: it would add a second one, or ``None``)."""
    d = Config()

    def note(name, shown):
        return default_note(getattr(d, name) if shown is None else shown, name, [("--smoke", SMOKE)])

    p, option = demo_parser("reprise demo offline", __doc__.split("\n\n")[0], EPILOG, d, note)

    option("--dataset", "a dataset file (D4RL HDF5, Minari, npz) or a checkpoint of 'reprise import --window K'",
           shown="generate one")
    option("--episodes", "episodes to generate", type=int)
    option("--steps", "training steps", type=int)
    option("--batch-size", "windows per training step (per rank with --nproc)", type=int)
    option("--context", "K: steps per training window", type=int)
    option("--lr", "learning rate", type=float)
    option("--target-return", "the return the evaluation conditions on", type=float)
    option("--eval-episodes", "evaluation episodes", type=int)
    option("--device", "where the model trains; cuda is refused where it is not available",
           shown="cuda when available, else cpu")
    option("--seed", "dataset, model, sampling and evaluation seed", type=int)
    option("--out", "output directory", shown="a new ./reprise-runs/offline-<time>-<pid>")
    p.add_argument("--smoke", action="store_true", default=False,
                   help="a small dataset and a short run (CI): the --smoke values above (default: off)")
    option("--nproc", "ranks: > 1 trains with DDP on a sharded table (one shard per rank), each rank on "
                      "--batch-size windows of a global draw of N x --batch-size (ignored under torchrun)", type=int)
    return p


def parse_args(argv) -> Config:
    p = make_parser()
    a = p.parse_args(argv)
    values = parsed_values(a, Config, [SMOKE] if a.smoke else [])
    for name in ("episodes", "steps", "batch_size", "context", "eval_episodes", "nproc"):
        if values[name] < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {values[name]}")
    return Config(**values)


def main(argv=None) -> int:
    """``reprise demo offline``. Exit status: 0 done, 1 a rank failed, 2 refused (options,
    missing packages, dataset, device, output directory in use), 128 + the signal's number
    when stopped by SIGINT (130) or SIGTERM (143). Under torchrun, torchrun handles the
    signals (it stops the ranks), and the demo installs no handlers of its own."""
    from .offline_cluster import RankFailed, under_torchrun
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


if __name__ == "__main__":
    sys.exit(main())

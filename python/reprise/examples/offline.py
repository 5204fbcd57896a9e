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

ENV = "CartPole-v1"
FIELDS = ("observations", "actions", "rewards", "returns_to_go", "timesteps")
TRAIN_FIELDS = ("observations", "actions", "returns_to_go", "timesteps")  # what a training batch reads
PROBE = 2048  # windows drawn once for the state normalisation
RTG_SCALE = 100.0  # returns-to-go are fed to the model divided by this


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
    out: str | None = None
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


def open_dataset(cfg: Config, out: Path):
    """``(windows table, stats, closer)``: the generated dataset or ``--dataset``
    imported with ``window=K``, or the tables of a checkpoint."""
    path = Path(cfg.dataset) if cfg.dataset else None
    if path is not None and is_checkpoint(path):
        tables = rp.checkpoint.load(path)
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
        return windows, stats, windows.store.close
    if path is None:
        path = out / "cartpole-scripted.hdf5"
        rp.datasets.write_d4rl(path, generate(cfg.episodes, cfg.seed),
                               metadata={"policy": "scripted controller, per-episode random-action rate U(0, 1)"})
    sig = rp.datasets.infer_signature(path)
    missing = [f for f in FIELDS if f not in sig]
    if missing:
        raise rp.errors.InvalidArgument(f"{path}: the demo needs per-step {', '.join(FIELDS)}; missing {missing}")
    ds = rp.datasets.load(path, window=cfg.context, fields=list(FIELDS), seed=cfg.seed)
    print(ds.describe())
    r = ds.episode_returns
    stats = {"source": ds.source, "format": ds.format, "steps": ds.num_steps, "episodes": ds.num_episodes,
             "windows": ds.windows.size, "return_mean": float(r.mean()), "return_min": float(r.min()),
             "return_max": float(r.max()), "episode_length_mean": float(ds.episode_lengths.mean())}
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
          unit: str = "samples/s"):
    """``cfg.steps`` steps of AdamW (linear warm-up over the first 10%, gradients
    clipped to norm 1) on ``next_batch() -> (data, lengths)``, the loss masked past
    each item's length. Returns ``(losses, seconds, seconds inside next_batch)``.
    ``show``: the progress bar or lines (one rank of several shows them)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    warmup = max(1, cfg.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup))
    from tqdm import tqdm
    interactive = show and sys.stderr.isatty()
    bar = tqdm(range(cfg.steps), desc="train", disable=not interactive, dynamic_ncols=True)
    losses, t0, waited = [], time.time(), 0.0
    for step in bar:
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
        rate = (step + 1) * cfg.batch_size / max(time.time() - t0, 1e-9)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", samples_s=f"{rate:,.0f}")
        if show and not interactive and ((step + 1) % max(1, cfg.steps // 5) == 0 or step + 1 == cfg.steps):
            print(f"step {step + 1}/{cfg.steps}  loss {np.mean(losses[-20:]):.4f}  {rate:,.0f} {unit}", flush=True)
    bar.close()
    return losses, time.time() - t0, waited


def finish(cfg: Config, dev, out: Path, stats: dict, model, state_mean, state_std, max_timestep, losses: list,
           times: dict, started: float, train_extra: dict | None = None, extra: dict | None = None,
           where: str | None = None) -> dict:
    """Evaluates ``model`` (and a random policy), writes ``summary.json`` and
    ``offline.png`` into ``out``, prints the result; returns the summary.
    ``times`` holds ``train_s``; ``train_extra`` and ``extra`` go into the
    summary's ``train`` and top level."""
    import torch
    t1 = time.time()
    eval_returns = evaluate(model, torch, dev, cfg, cfg.eval_episodes, state_mean, state_std,
                            max_timestep, seed=cfg.seed + 10_000)
    times["eval_s"] = time.time() - t1
    baseline = random_returns(cfg.random_episodes, seed=cfg.seed + 20_000)
    times["total_s"] = time.time() - started
    samples = cfg.steps * cfg.batch_size * cfg.nproc
    summary = {
        "config": dataclasses.asdict(cfg),
        "device": str(dev),
        "dataset": stats,
        "train": {"steps": cfg.steps, "samples": samples,
                  "first_loss": float(np.mean(losses[:20])), "final_loss": float(np.mean(losses[-20:])),
                  "samples_per_s": samples / max(times["train_s"], 1e-9), **(train_extra or {})},
        "eval": {"target_return": cfg.target_return, "returns": eval_returns,
                 "mean_return": float(np.mean(eval_returns)), "std_return": float(np.std(eval_returns))},
        "random_policy": {"returns": baseline, "mean_return": float(np.mean(baseline))},
        **(extra or {}),
        "times": times,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(out / "offline.png", losses, summary)
    print(f"Decision Transformer, target return {cfg.target_return:g}: mean return "
          f"{summary['eval']['mean_return']:.1f} over {len(eval_returns)} episodes "
          f"(dataset mean {stats.get('return_mean', float('nan')):.1f}, random policy "
          f"{summary['random_policy']['mean_return']:.1f}); loss {summary['train']['first_loss']:.3f} -> "
          f"{summary['train']['final_loss']:.3f} in {cfg.steps} steps on {where or dev}; {times['total_s']:.0f} s")
    print(f"wrote {out / 'summary.json'} and {out / 'offline.png'}", flush=True)
    return summary


def run(cfg: Config) -> dict | None:
    """Runs the demo; returns the summary (also written to ``<out>/summary.json``).
    With ``cfg.nproc > 1`` or under torchrun, runs it on several ranks
    (``offline_cluster.run``; None on ranks other than 0 under torchrun)."""
    from . import offline_cluster
    if cfg.nproc > 1 or offline_cluster.under_torchrun():
        return offline_cluster.run(cfg)
    import torch
    started = time.time()
    dev = device_of(cfg, torch)
    out = out_dir(cfg)
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        # Half the cores at most: a small model gains little from more threads, and
        # oversubscribed OpenMP threads slow to a crawl when the machine is busy.
        torch.set_num_threads(max(1, min(4, (os.cpu_count() or 1) // 2)))
    try:
        return _run(cfg, torch, dev, out, started)
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


def out_dir(cfg: Config) -> Path:
    out = Path(cfg.out or f"reprise-offline-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _run(cfg: Config, torch, dev, out: Path, started: float) -> dict:
    torch.manual_seed(cfg.seed)
    windows, stats, close = open_dataset(cfg, out)
    times = {"dataset_s": time.time() - started}
    try:
        check_signature(windows.store.signature, state_dim=4)
        sample_device = None if dev.type == "cpu" else dev

        def batch(n):
            return to_torch(windows.sample(n, fields=list(TRAIN_FIELDS), device=sample_device), torch, dev)

        # State normalisation and the timestep range, from a large draw.
        state_mean, state_std, max_timestep = normalisation(*valid_states(*batch(PROBE), torch, dev), cfg)
        model = make_model(4, 2, max_timestep, cfg).to(dev)
        losses, times["train_s"], _ = train(cfg, model, lambda: batch(cfg.batch_size), state_mean, state_std,
                                            torch, dev)
        return finish(cfg, dev, out, stats, model, state_mean, state_std, max_timestep, losses, times, started)
    finally:
        close()


def parse_args(argv) -> Config:
    d = Config()
    p = argparse.ArgumentParser(prog="reprise demo offline", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default=None, help="a dataset file (D4RL HDF5, Minari, npz) or a checkpoint of "
                                                   "'reprise import --window K' (default: generate one)")
    p.add_argument("--episodes", type=int, default=d.episodes, help="episodes to generate")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--context", type=int, default=d.context, help="K: steps per training window")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--target-return", type=float, default=d.target_return)
    p.add_argument("--eval-episodes", type=int, default=d.eval_episodes)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=None, help="output directory (default: ./reprise-offline-<time>)")
    p.add_argument("--smoke", action="store_true", help="a small dataset and a short run (CI)")
    p.add_argument("--nproc", type=int, default=d.nproc,
                   help="ranks: > 1 trains with DDP on a sharded table (one shard per rank), each rank on "
                        "--batch-size windows of a global draw of N x --batch-size (ignored under torchrun)")
    a = p.parse_args(argv)
    values = {f.name: getattr(a, f.name) for f in dataclasses.fields(Config) if hasattr(a, f.name)}
    if a.smoke:
        for k, v in SMOKE.items():
            if values[k] == getattr(d, k):   # explicit options win over the smoke defaults
                values[k] = v
    for name in ("episodes", "steps", "batch_size", "context", "eval_episodes", "nproc"):
        if values[name] < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {values[name]}")
    return Config(**values)


def main(argv=None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    missing = [m for m in ("torch", "gymnasium", "matplotlib", "h5py") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"reprise demo offline: needs {', '.join(missing)}: pip install 'reprise[demo]'", file=sys.stderr)
        return 2
    from .offline_cluster import RankFailed
    try:
        run(cfg)
    except rp.errors.RepriseError as e:
        print(f"reprise demo offline: {e}", file=sys.stderr)
        return 2
    except RankFailed as e:
        print(f"reprise demo offline: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

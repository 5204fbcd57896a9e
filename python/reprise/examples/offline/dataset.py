"""The dataset: CartPole-v1 episodes played by a scripted controller with a per-episode
random-action rate, written in the D4RL layout, then imported with ``window=K`` (or the
tables of a checkpoint of ``reprise import --window K``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import reprise as rp

from .config import ENV, Config

FIELDS = ("observations", "actions", "rewards", "returns_to_go", "timesteps")


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

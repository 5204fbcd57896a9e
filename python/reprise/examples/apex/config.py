"""The demo's configuration: ``Config``, the Atari and smoke presets, and the command line."""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from dataclasses import dataclass

from .envs import is_atari

DESCRIPTION = "Distributed Ape-X DQN on Reprise."


@dataclass
class Config:
    env: str = "CartPole-v1"
    actors: int = 0                  # 0: the cores available
    envs_per_actor: int = 4
    n_step: int = 3
    gamma: float = 0.99
    hidden: int = 64
    lr: float = 1e-3
    batch_size: int = 128
    samples_per_insert: float = 16.0
    min_replay: int = 2_000
    replay_size: int = 100_000
    priority_exponent: float = 0.6
    beta: float = 0.4                # importance-weight exponent, annealed to 1 over the run
    epsilon: float = 0.4             # Ape-X: actor i of N explores with epsilon ** (1 + alpha i / (N - 1))
    epsilon_alpha: float = 7.0
    target_update: int = 250         # learner steps between target-network copies
    publish_every: int = 25          # learner steps between parameter publications
    sync_every: int = 50             # actor iterations between parameter fetches
    eval_every: float = 5.0          # seconds between the learner's quick evaluations
    quick_eval_episodes: int = 10
    eval_episodes: int = 100         # the solve check and the final evaluation
    solve_return: float | None = None  # default: the environment's reward threshold (475 for CartPole-v1)
    time_limit: float = 600.0
    device: str | None = None        # learner device; default cuda when available
    seed: int = 0
    out: str | None = None
    smoke: bool = False

    def resolved(self) -> "Config":
        c = dataclasses.replace(self)
        if c.actors <= 0:
            c.actors = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        if c.out is None:
            c.out = f"reprise-apex-{time.strftime('%Y%m%d-%H%M%S')}"
        return c


# Atari frames are 28 KB a step and each episode is thousands of steps: a smaller replay, a slower
# learning rate, rarer and shorter evaluations (Pong is solved at a mean return of 18).
ATARI = dict(replay_size=50_000, min_replay=10_000, lr=1e-4, samples_per_insert=4.0, batch_size=64,
             target_update=2_000, eval_every=120.0, quick_eval_episodes=1, eval_episodes=5, time_limit=3600.0,
             solve_return=18.0)
SMOKE = dict(time_limit=55.0, min_replay=1_000, replay_size=50_000, eval_every=4.0, eval_episodes=20)


def solve_threshold(cfg: Config, spec: dict) -> float | None:
    """The mean greedy return that ends the run: ``--solve-return``, else the environment's threshold."""
    return cfg.solve_return if cfg.solve_return is not None else spec["reward_threshold"]


def parse_args(argv) -> Config:
    d = Config()
    p = argparse.ArgumentParser(prog="reprise demo apex", description=DESCRIPTION,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--env", default=d.env, help="a gymnasium id; ALE/<Game>-v5 for Atari (needs the atari extra)")
    p.add_argument("--actors", type=int, default=d.actors, help="actor processes (0: the cores available)")
    p.add_argument("--envs-per-actor", type=int, default=d.envs_per_actor)
    p.add_argument("--n-step", type=int, default=d.n_step)
    p.add_argument("--gamma", type=float, default=d.gamma)
    p.add_argument("--hidden", type=int, default=d.hidden, help="MLP width (vector observations)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--samples-per-insert", type=float, default=d.samples_per_insert)
    p.add_argument("--min-replay", type=int, default=d.min_replay)
    p.add_argument("--replay-size", type=int, default=d.replay_size)
    p.add_argument("--priority-exponent", type=float, default=d.priority_exponent)
    p.add_argument("--target-update", type=int, default=d.target_update)
    p.add_argument("--eval-episodes", type=int, default=d.eval_episodes)
    p.add_argument("--solve-return", type=float, default=None,
                   help="mean greedy return over --eval-episodes that ends the run (default: the env's threshold)")
    p.add_argument("--time-limit", type=float, default=d.time_limit, help="seconds")
    p.add_argument("--device", default=None, help="learner device (default: cuda when available, else cpu)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=None, help="output directory (default: ./reprise-apex-<time>)")
    p.add_argument("--smoke", action="store_true", help="a short run (about a minute) for CI")
    a = p.parse_args(argv)
    values = {f.name: getattr(a, f.name) for f in dataclasses.fields(Config) if hasattr(a, f.name)}
    for k, v in ATARI.items() if is_atari(values["env"]) else ():
        if values.get(k, getattr(d, k)) == getattr(d, k):
            values[k] = v
    if a.smoke:
        for k, v in SMOKE.items():
            if values.get(k, getattr(d, k)) == getattr(d, k):   # explicit options win over the smoke defaults
                values[k] = v
    for name in ("actors", "envs_per_actor", "n_step", "batch_size", "min_replay", "replay_size", "target_update",
                 "eval_episodes", "hidden"):
        floor = 0 if name == "actors" else 1
        if values[name] < floor:
            p.error(f"--{name.replace('_', '-')} must be >= {floor}, got {values[name]}")
    if values["min_replay"] > values["replay_size"]:
        p.error(f"--min-replay ({values['min_replay']}) must be <= --replay-size ({values['replay_size']})")
    if not (0.0 < values["gamma"] <= 1.0):
        p.error(f"--gamma must be in (0, 1], got {values['gamma']}")
    if values["samples_per_insert"] <= 0 or values["time_limit"] <= 0 or values["lr"] <= 0:
        p.error("--samples-per-insert, --time-limit and --lr must be > 0")
    return Config(**values)

"""The demo's configuration: ``Config``, the Atari and smoke presets, and the command line."""

from __future__ import annotations

import argparse
import dataclasses
import os

from dataclasses import dataclass

from ..helpformat import add_dashboard_and_smoke, default_note, demo_parser, parsed_values
from .atari import is_atari

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
    out: str | None = None           # default: a new ./reprise-runs/apex-<time>-<pid> (rundirs.py)
    dashboard: str | None = None     # host:port of the replay server's live dashboard; None: off
    smoke: bool = False

    def resolved(self) -> "Config":
        c = dataclasses.replace(self)
        if c.actors <= 0:
            c.actors = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
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


EPILOG = """\
output: a new directory ./reprise-runs/apex-<time>-<pid> (or --out) with summary.json,
status.json and apex.png.
exit status: 0 the run ended (solved or at the time limit; summary.json says which),
1 a process kept failing, 2 a refused option, environment or device,
130 / 143 stopped by SIGINT (Ctrl-C) / SIGTERM (the summary is still written)."""


def _default(name: str, shown=None) -> str:
    """``(default: X; Atari: Y; --smoke: Z)`` for option ``name``: every default once."""
    return default_note(getattr(Config(), name) if shown is None else shown, name,
                        [("Atari", ATARI), ("--smoke", SMOKE)])


def make_parser() -> argparse.ArgumentParser:
    """The command line. Each option's help ends with its default, once (no
    ArgumentDefaultsHelpFormatter: it would add a second one, or ``None``)."""
    p, option = demo_parser("reprise demo apex", DESCRIPTION, EPILOG, Config(), _default)

    option("--env", "a gymnasium id with discrete actions and vector observations, or ALE/<Game>-v5 for "
                    "Atari (needs the atari extra)")
    option("--actors", "actor processes; 0: one per core available", type=int)
    option("--envs-per-actor", "environments each actor steps", type=int)
    option("--n-step", "steps of each transition's return", type=int)
    option("--gamma", "discount", type=float)
    option("--hidden", "MLP width (vector observations)", type=int)
    option("--lr", "learning rate", type=float)
    option("--batch-size", "items per learner step", type=int)
    option("--samples-per-insert", "replay ratio the rate limiter holds", type=float)
    option("--min-replay", "transitions before the learner samples", type=int)
    option("--replay-size", "transitions the replay table keeps", type=int)
    option("--priority-exponent", "prioritized sampling exponent", type=float)
    option("--target-update", "learner steps between target-network copies", type=int)
    option("--eval-every", "seconds between the learner's quick greedy evaluations", type=float)
    option("--eval-episodes", "episodes of the solve check and of the final evaluation", type=int)
    option("--solve-return", "mean greedy return over --eval-episodes that ends the run", type=float,
           shown="the environment's reward threshold, 475 for CartPole-v1")
    option("--time-limit", "seconds before the run ends unsolved", type=float)
    option("--device", "the learner's device; cuda is refused where it is not available",
           shown="cuda when available, else cpu")
    option("--seed", "seed of the environments, the network and the sampler", type=int)
    option("--out", "output directory", shown="a new ./reprise-runs/apex-<time>-<pid>")
    add_dashboard_and_smoke(p, "the replay's", "a short run (about a minute) for CI")
    return p


def parse_args(argv) -> Config:
    p = make_parser()
    a = p.parse_args(argv)
    values = parsed_values(a, Config, ([ATARI] if is_atari(a.env) else []) + ([SMOKE] if a.smoke else []))
    for name in ("actors", "envs_per_actor", "n_step", "batch_size", "min_replay", "replay_size", "target_update",
                 "eval_episodes", "hidden"):
        floor = 0 if name == "actors" else 1
        if values[name] < floor:
            p.error(f"--{name.replace('_', '-')} must be >= {floor}, got {values[name]}")
    if values["min_replay"] > values["replay_size"]:
        p.error(f"--min-replay ({values['min_replay']}) must be <= --replay-size ({values['replay_size']})")
    if not (0.0 < values["gamma"] <= 1.0):
        p.error(f"--gamma must be in (0, 1], got {values['gamma']}")
    if values["samples_per_insert"] <= 0 or values["time_limit"] <= 0 or values["lr"] <= 0 or values["eval_every"] <= 0:
        p.error("--samples-per-insert, --time-limit, --eval-every and --lr must be > 0")
    return Config(**values)

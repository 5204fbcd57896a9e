"""The demo's configuration: ``Config``, the smoke preset, and the command line."""

from __future__ import annotations

import argparse

from dataclasses import dataclass

from ..helpformat import add_dashboard_and_smoke, default_note, demo_parser, parsed_values

DESCRIPTION = "Asynchronous GRPO on Reprise: rollout workers and a trainer on different policy versions."


@dataclass
class Config:
    rollout_workers: int = 2
    group_size: int = 8              # completions per prompt (GRPO's G)
    prompts_per_round: int = 8       # prompts a worker generates for at once
    max_staleness: int = 1           # versions an item may lag the trainer's when it is drawn
    tokens: int = 2304               # the trainer's token budget per step (32 groups of 8 x 9 tokens)
    micro_batches: int = 2           # gradient-accumulation parts per step, split by tokens, groups whole
    clip: float = 0.2                # the importance ratio's clip range
    lr: float = 1e-3
    width: int = 64
    layers: int = 2
    group_timeout: float = 10.0      # a group still incomplete this long is dropped (the straggler policy); 0: off
    eval_every: float = 3.0          # seconds between the trainer's greedy evaluations
    solve_reward: float = 0.98       # mean greedy reward on the evaluation prompts that ends the run
    time_limit: float = 300.0
    device: str | None = None        # trainer device; default cuda when available
    seed: int = 0
    out: str | None = None           # default: a new ./reprise-runs/grpo-<time>-<pid> (rundirs.py)
    dashboard: str | None = None
    partial_rollouts: bool = False   # park generations a new version interrupts; any worker finishes them
    ray: bool = False                # the trainer and the rollout workers as Ray actors (a local Ray instance)
    slow_worker: float = 0.0         # tests: worker 0 waits this long before each group's last member
    smoke: bool = False


SMOKE = dict(time_limit=60.0, eval_every=2.0, solve_reward=0.9)

EPILOG = """\
output: a new directory ./reprise-runs/grpo-<time>-<pid> (or --out) with summary.json,
status.json and grpo.png.
exit status: 0 the run ended (solved or at the time limit; summary.json says which),
1 a process kept failing, 2 a refused option or device,
130 / 143 stopped by SIGINT (Ctrl-C) / SIGTERM (the summary is still written)."""


def _default(name: str, shown=None) -> str:
    return default_note(getattr(Config(), name) if shown is None else shown, name, [("--smoke", SMOKE)])


def make_parser() -> argparse.ArgumentParser:
    p, option = demo_parser("reprise demo grpo", DESCRIPTION, EPILOG, Config(), _default)
    option("--rollout-workers", "rollout worker processes", type=int)
    option("--group-size", "completions per prompt (GRPO's G)", type=int)
    option("--prompts-per-round", "prompts a worker generates for in one batch", type=int)
    option("--max-staleness", "policy versions an item may lag the trainer's when drawn", type=int)
    option("--tokens", "the trainer's token budget per step", type=int)
    option("--micro-batches", "gradient-accumulation parts of a step, balanced by tokens", type=int)
    option("--clip", "clip range of the importance ratio", type=float)
    option("--lr", "learning rate", type=float)
    option("--width", "transformer width", type=int)
    option("--layers", "transformer layers", type=int)
    option("--group-timeout", "seconds before an incomplete group is dropped (0: never)", type=float)
    option("--eval-every", "seconds between greedy evaluations", type=float)
    option("--solve-reward", "mean greedy reward on the evaluation prompts that ends the run", type=float)
    option("--time-limit", "seconds before the run ends unsolved", type=float)
    option("--device", "the trainer's device; cuda is refused where it is not available",
           shown="cuda when available, else cpu")
    option("--seed", "seed of the prompts, the policy and the sampler", type=int)
    option("--out", "output directory", shown="a new ./reprise-runs/grpo-<time>-<pid>")
    p.add_argument("--partial-rollouts", action="store_true", default=False,
                   help="a generation that sees a new policy version stops and goes into a queue table with "
                        "per-token versions; any worker finishes it with its newer policy (default: off)")
    p.add_argument("--ray", action="store_true", default=False,
                   help="run the trainer and the rollout workers as Ray actors on a local Ray instance "
                        "(pip install 'reprise[ray]') (default: off)")
    p.add_argument("--slow-worker", type=float, default=0.0, help=argparse.SUPPRESS)
    add_dashboard_and_smoke(p, "the tables'", "a short run (about a minute) for CI")
    return p


def parse_args(argv) -> Config:
    p = make_parser()
    a = p.parse_args(argv)
    values = parsed_values(a, Config, [SMOKE] if a.smoke else [])
    values["slow_worker"] = a.slow_worker
    values["partial_rollouts"] = a.partial_rollouts
    values["ray"] = a.ray
    for name in ("rollout_workers", "group_size", "prompts_per_round", "tokens", "micro_batches", "width", "layers"):
        if values[name] < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {values[name]}")
    if values["max_staleness"] < 0:
        p.error(f"--max-staleness must be >= 0, got {values['max_staleness']}")
    from .task import SEQUENCE
    if values["tokens"] < values["group_size"] * SEQUENCE:
        p.error(f"--tokens ({values['tokens']}) must hold at least one group: --group-size x {SEQUENCE} = "
                f"{values['group_size'] * SEQUENCE}")
    for name in ("time_limit", "lr", "eval_every", "clip"):
        if not values[name] > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {values[name]}")
    if values["group_timeout"] < 0:
        p.error(f"--group-timeout must be >= 0 (0: off), got {values['group_timeout']}")
    return Config(**values)

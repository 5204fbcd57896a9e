"""The demo's configuration: ``Config``, the per-device defaults, the smoke preset and the
command line."""

from __future__ import annotations

import argparse
import dataclasses

from dataclasses import dataclass

from ..helpformat import default_note, demo_parser, parsed_values

DESCRIPTION = ("GPU-born data on Reprise: vectorised CartPole stepped on the device, written into a device "
               "store, a DQN learner sampling from it on the device.")


@dataclass
class Config:
    envs: int = 0                    # 0: CUDA_DEFAULTS or CPU_DEFAULTS
    batch_size: int = 0              # 0: likewise
    samples_per_insert: float = 8.0
    replay_size: int = 0             # 0: likewise
    min_replay: int = 0              # 0: likewise
    prioritized: bool = False
    priority_exponent: float = 0.6
    beta: float = 0.4                # importance-weight exponent, annealed to 1 over the run
    gamma: float = 0.99
    lr: float = 1e-3
    hidden: int = 128
    target_update: int = 250         # learner steps between target-network copies
    sync_every: int = 10             # learner steps between copies of the network to the actor
    epsilon: float = 0.4             # Ape-X: environment i of N explores with epsilon ** (1 + alpha i / (N - 1))
    epsilon_alpha: float = 7.0
    eval_every: float = 5.0          # seconds between greedy evaluations
    eval_envs: int = 100             # environments (one episode each) per greedy evaluation
    time_limit: float = 60.0
    steps: int = 0                   # env steps before the run ends; 0: the time limit alone
    device: str | None = None        # default: cuda when available, else the CPU emulation
    seed: int = 0
    out: str | None = None           # default: a new ./reprise-runs/gpu-<time>-<pid> (rundirs.py)
    smoke: bool = False

    def for_device(self, cuda: bool) -> "Config":
        """This config with its device-dependent defaults (the zeros) filled in."""
        c = dataclasses.replace(self)
        for name, value in (CUDA_DEFAULTS if cuda else CPU_DEFAULTS).items():
            if getattr(c, name) == 0:
                setattr(c, name, value)
        return c


# A GPU steps thousands of environments in the time a CPU steps hundreds: the same demo, scaled.
CUDA_DEFAULTS = dict(envs=4096, batch_size=1024, replay_size=1_000_000, min_replay=50_000)
CPU_DEFAULTS = dict(envs=256, batch_size=256, replay_size=100_000, min_replay=5_000)
SMOKE = dict(envs=64, time_limit=10.0, eval_every=2.0, eval_envs=20, min_replay=1_000)

EPILOG = """\
output: a new directory ./reprise-runs/gpu-<time>-<pid> (or --out) with summary.json.
exit status: 0 the run ended (time limit or --steps), 1 the actor thread failed, 2 a refused
option or device, 130 / 143 stopped by SIGINT (Ctrl-C) / SIGTERM (the summary is still written)."""


def _default(name: str, shown=None) -> str:
    """``(default: X; --smoke: Y)`` for option ``name``."""
    if shown is None and name in CUDA_DEFAULTS:
        shown = f"{CUDA_DEFAULTS[name]} on CUDA, {CPU_DEFAULTS[name]} emulated on the CPU"
    return default_note(getattr(Config(), name) if shown is None else shown, name, [("--smoke", SMOKE)])


def make_parser() -> argparse.ArgumentParser:
    """The command line; each option's help ends with its default, once."""
    p, option = demo_parser("reprise demo gpu", DESCRIPTION, EPILOG, Config(), _default)

    option("--envs", "CartPole environments stepped together on the device", type=int)
    option("--batch-size", "items per learner step", type=int)
    option("--samples-per-insert", "replay ratio the rate limiter holds", type=float)
    option("--replay-size", "transitions the replay table keeps (FIFO)", type=int)
    option("--min-replay", "transitions before the learner samples", type=int)
    p.add_argument("--prioritized", action="store_true", default=False,
                   help="a Prioritized sampler with |TD| priorities and importance weights instead of Uniform "
                        "(default: off)")
    option("--gamma", "discount", type=float)
    option("--lr", "learning rate", type=float)
    option("--hidden", "width of the Q network's two hidden layers", type=int)
    option("--target-update", "learner steps between target-network copies", type=int)
    option("--eval-every", "seconds between greedy evaluations", type=float)
    option("--eval-envs", "environments (one episode each) in a greedy evaluation", type=int)
    option("--time-limit", "seconds of training before the run ends", type=float)
    option("--steps", "env steps before the run ends; 0: no limit but --time-limit", type=int)
    option("--device", "where the environments, the store and the learner live: cuda, cuda:N, or cpu (the GPU "
                       "path emulated on the CPU); cuda is refused where it is not available",
           shown="cuda when available, else cpu")
    option("--seed", "seed of the environments, the network and the sampler", type=int)
    option("--out", "output directory", shown="a new ./reprise-runs/gpu-<time>-<pid>")
    p.add_argument("--smoke", action="store_true", default=False,
                   help="a short run for CI (about 15 s on 2 cores): the --smoke values above (default: off)")
    return p


def parse_args(argv) -> Config:
    """The command line as a ``Config``; a bad value exits 2 with a message that names the
    option and what it expects."""
    p = make_parser()
    a = p.parse_args(argv)
    values = parsed_values(a, Config, [SMOKE] if a.smoke else [])
    for name in ("envs", "batch_size", "replay_size", "min_replay"):   # 0 is the device's default
        if values[name] < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 1 (or 0 for the device's default), got {values[name]}")
    for name in ("hidden", "target_update", "eval_envs"):
        if values[name] < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {values[name]}")
    if values["steps"] < 0:
        p.error(f"--steps must be >= 0 (0: no limit), got {values['steps']}")
    for name in ("samples_per_insert", "lr", "time_limit", "eval_every"):
        if not values[name] > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {values[name]:g}")
    if not 0.0 < values["gamma"] <= 1.0:
        p.error(f"--gamma must be in (0, 1], got {values['gamma']:g}")
    if values["replay_size"] and values["min_replay"] > values["replay_size"]:
        p.error(f"--min-replay ({values['min_replay']}) must be <= --replay-size ({values['replay_size']})")
    return Config(**values)


__all__ = ["CPU_DEFAULTS", "CUDA_DEFAULTS", "Config", "SMOKE", "make_parser", "parse_args"]

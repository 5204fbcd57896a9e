"""The demo's configuration: ``Config``, the smoke preset, the environment it plays and
the command line."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..helpformat import default_note, demo_parser, parsed_values

DESCRIPTION = "Offline RL on Reprise: a Decision Transformer trained on windows of an imported dataset."
ENV = "CartPole-v1"


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

    p, option = demo_parser("reprise demo offline", DESCRIPTION, EPILOG, d, note)

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

"""Asynchronous GRPO on Reprise: a small causal transformer learns to sort digits.

    reprise demo grpo                      # until solved (greedy reward 0.98) or --time-limit
    reprise demo grpo --smoke              # about a minute; shows learning
    python -m reprise.examples.grpo --help

The processes (asynchronous GRPO, as verl's fully-async mode, TRL's async GRPO or AReaL
run it, at toy scale):

- the **supervisor** (this process) owns the tables and serves them with ``rp.Server``;
  it starts the trainer and the rollout workers, restarts any that die (and gives up on one
  that keeps dying), shows progress, and at the end writes ``summary.json`` and ``grpo.png``
  into a new ``./reprise-runs/grpo-<time>-<pid>`` (or ``--out``);
- **rollout workers** (``--rollout-workers``) load the newest published policy, sample
  prompts, generate ``--group-size`` completions each, score them with the task's exact
  checker and write each group through ``rp.Client``: a token is a step (token, rollout
  log-probability, loss mask), a sequence an item with attributes ``version``, ``reward``
  and ``group``;
- the **trainer** (GPU when present) draws ``sample(tokens=...)`` from ``rollouts`` (whole
  groups, consume-once, ``max_staleness`` versions old at most), computes group-normalised
  advantages, takes a clipped importance-ratio step over ``packed()`` micro-batches split by
  tokens with groups whole, then moves the version (``set_version``: the stale items leave
  at once) and publishes its parameters as the one item of ``params``.

A group whose last member does not arrive within ``--group-timeout`` is dropped (the
straggler policy), and counted. Modules: ``task`` (prompts and the checker), ``model`` (the
policy, generation, flat parameters), ``config``, ``tables``, ``rollout``, ``trainer``,
``plots``, ``supervisor`` (``run`` and ``main``).
"""

from .config import Config, parse_args
from .supervisor import main, run
from .task import rewards
from .trainer import group_advantages

__all__ = ["Config", "group_advantages", "main", "parse_args", "rewards", "run"]

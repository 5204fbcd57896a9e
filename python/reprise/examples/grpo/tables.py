"""The tables the processes share: ``rollouts`` (one sequence per item, a token a step, with
the policy version, reward and group of each; whole groups under a staleness bound),
``params`` (the trainer's newest parameters and their version, one item), the ``metrics``
and ``evals`` report queues, and with ``--partial-rollouts`` the ``partials`` queue of
unfinished sequences."""

from __future__ import annotations

import reprise as rp

from .config import Config
from .task import SEQUENCE

ATTRIBUTES = {"version": "int64", "reward": "float32", "group": "int64"}


def make_tables(cfg: Config, num_params: int):
    # A few training steps of rollouts may wait: the rest are stale long before they are evicted.
    max_items = 16 * cfg.tokens // SEQUENCE
    block = 256
    rollouts_store = rp.Store({"token": rp.Field((), "int32"), "logprob": rp.Field((), "float32"),
                               "mask": rp.Field((), "bool"), "version": rp.Field((), "int64")},
                              capacity=(max_items + 1) * SEQUENCE + 4 * block * (cfg.rollout_workers + 1),
                              block_steps=block)
    rollouts = rp.Table("rollouts", rollouts_store, sampler=rp.selectors.Fifo(), remover=rp.selectors.Fifo(),
                        max_size=max_items, max_times_sampled=1, attributes=ATTRIBUTES,
                        max_staleness=cfg.max_staleness, group_size=cfg.group_size,
                        group_timeout=cfg.group_timeout or None, on_group_timeout="drop", seed=cfg.seed)
    params_store = rp.Store({"weights": rp.Field((num_params,), "float32"), "version": rp.Field((), "int64")},
                            capacity=16, block_steps=1)
    params = rp.Table("params", params_store, sampler=rp.selectors.Lifo(), remover=rp.selectors.Fifo(),
                      max_size=1, rate_limiter=rp.rate_limiters.MinSize(1))
    metrics_store = rp.Store({"step": rp.Field((), "int64"), "version": rp.Field((), "int64"),
                              "reward": rp.Field((), "float32"), "tokens": rp.Field((), "int64"),
                              "items": rp.Field((), "int32"), "staleness": rp.Field((), "float32")},
                             capacity=(1 << 16) + 1 + 3 * 64, block_steps=64)
    metrics = rp.Table.queue("metrics", metrics_store, max_size=1 << 16)
    evals_store = rp.Store({"step": rp.Field((), "int64"), "greedy_reward": rp.Field((), "float32")},
                           capacity=4096, block_steps=1)
    evals = rp.Table.queue("evals", evals_store, max_size=1024)
    tables = [rollouts, params, metrics, evals]
    if cfg.partial_rollouts:
        # Unfinished sequences, a token a step with the version that produced it; taken once.
        partial_items = 4 * cfg.prompts_per_round * cfg.group_size * cfg.rollout_workers
        partials_store = rp.Store({"token": rp.Field((), "int32"), "logprob": rp.Field((), "float32"),
                                   "version": rp.Field((), "int64")},
                                  capacity=(partial_items + 1) * SEQUENCE + 4 * block * (cfg.rollout_workers + 1),
                                  block_steps=block)
        tables.append(rp.Table.queue("partials", partials_store, max_size=partial_items,
                                     attributes={"group": "int64"}))
    return tables


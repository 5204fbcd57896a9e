"""The five tables the processes share: ``replay`` (n-step transitions over shared steps),
``params`` (the learner's newest parameters, one item), ``best`` (the parameters of its best
quick evaluations) and the ``episodes`` and ``evals`` report queues."""

from __future__ import annotations

import reprise as rp

from .config import Config


def stacks_frames(spec: dict) -> bool:
    """Whether the replay stores one frame per step and samples stacks (Atari: uint8
    observations of stacked frames, as gymnasium's FrameStackObservation gives them)."""
    return spec["obs_dtype"] == "uint8" and len(spec["obs_shape"]) == 3


def replay_obs_field(spec: dict) -> rp.Field:
    """The replay's ``obs`` field. Atari frames are stored once each (a step writes its
    newest frame and samples as the stack of 4 it was seen as, padded at an episode's start
    as FrameStackObservation pads) and compressed: a transition takes a few hundred bytes
    instead of 28 KB (docs/concepts.md, "Stacked fields" and "Compressed fields")."""
    shape, dtype = tuple(spec["obs_shape"]), spec["obs_dtype"]
    if stacks_frames(spec):
        return rp.Field(shape[1:], dtype, compress="zstd", stack=shape[0])
    return rp.Field(shape, dtype)


def make_tables(cfg: Config, spec: dict, num_params: int):
    """The replay table (n-step transitions over shared steps), the one-item parameter table,
    the best-parameters table and the two report queues."""
    writers = cfg.actors * cfg.envs_per_actor
    block = 64
    replay_store = rp.Store({
        "obs": replay_obs_field(spec),
        "action": rp.Field((), "int64"),
        "reward": rp.Field((), "float32"),
        "terminal": rp.Field((), "bool"),
    }, capacity=cfg.replay_size + cfg.replay_size // 4 + 4 * block * writers, block_steps=block)
    replay = rp.Table(
        "replay", replay_store,
        sampler=rp.selectors.Prioritized(cfg.priority_exponent),
        remover=rp.selectors.Fifo(),
        max_size=cfg.replay_size,
        rate_limiter=rp.rate_limiters.SampleToInsertRatio(
            cfg.samples_per_insert, cfg.min_replay, error_buffer=max(10.0 * cfg.batch_size, 0.05 * cfg.min_replay * cfg.samples_per_insert)),
        seed=cfg.seed,
    )
    params_store = rp.Store({"weights": rp.Field((num_params,), "float32"), "learner_step": rp.Field((), "int64")},
                            capacity=16, block_steps=1)
    params = rp.Table("params", params_store, sampler=rp.selectors.Lifo(), remover=rp.selectors.Fifo(),
                      max_size=1, rate_limiter=rp.rate_limiters.MinSize(1))
    # The learner inserts the parameters of every quick evaluation, priority = its mean return:
    # MaxHeap draws the best, MinHeap evicts the worst when full, so the best is always kept.
    best_store = rp.Store({"weights": rp.Field((num_params,), "float32"), "learner_step": rp.Field((), "int64")},
                          capacity=16, block_steps=1)
    best = rp.Table("best", best_store, sampler=rp.selectors.MaxHeap(), remover=rp.selectors.MinHeap(),
                    max_size=4, rate_limiter=rp.rate_limiters.MinSize(1))
    report_size = 1 << 16
    episodes_store = rp.Store({"episode_return": rp.Field((), "float32"), "episode_length": rp.Field((), "int32"),
                               "actor": rp.Field((), "int32"), "epsilon": rp.Field((), "float32")},
                              capacity=report_size + 64 * (cfg.actors + 2), block_steps=64)
    episodes = rp.Table.queue("episodes", episodes_store, max_size=report_size)
    evals_store = rp.Store({"learner_step": rp.Field((), "int64"), "mean_return": rp.Field((), "float32"),
                            "episodes": rp.Field((), "int32"), "loss": rp.Field((), "float32")},
                           capacity=4096, block_steps=1)
    evals = rp.Table.queue("evals", evals_store, max_size=1024)
    return [replay, params, episodes, evals, best]


"""The replay (a device store and one table over it) and the actor that fills it.

Every actor iteration steps all N environments once and writes the N transitions with one
``writer.extend`` of N steps (one copy kernel per field, device to device) and one
``writer.create_items(table, 1, priorities)``: N one-step items, item j over the j-th step
of the extend. The host sees row numbers and priorities, never step data.

Store sizing: the writer keeps its last N steps (``max_sequence_length=N``, what
``create_items`` of N items needs), the table ``replay_size`` one-step items in the order
they were written (FIFO remover), so the store needs ``replay_size + N`` rows plus a few
blocks of slack for blocks partly used or held by samples in flight; with that, the FIFO
remover frees whole blocks in order and the store never has to evict
(``num_store_evictions`` stays 0).
"""

from __future__ import annotations

import threading

import numpy as np

import reprise as rp

from .cartpole import OBS_DIM, VecCartPole
from .config import Config

SIGNATURE = {
    "obs": rp.Field((OBS_DIM,), "float32"),
    "action": rp.Field((), "int64"),
    "reward": rp.Field((), "float32"),
    "next_obs": rp.Field((OBS_DIM,), "float32"),
    "terminal": rp.Field((), "bool"),     # the pole fell: no bootstrap (a truncation at 500 steps is not terminal)
}
INSERT_WAIT_S = 0.25   # create_items waits this long on the rate limiter before the actor checks for a stop


def block_steps_for(envs: int) -> int:
    """Rows per block: one extend fills a few blocks, and a block is small beside the replay."""
    return max(16, min(1024, envs))


def make_replay(cfg: Config, store_device: str):
    """``(store, table)``: a device store for the transitions and the ``replay`` table
    (Uniform or Prioritized sampler, FIFO remover, ``SampleToInsertRatio`` limiter;
    device-resident draws on a real GPU)."""
    block = block_steps_for(cfg.envs)
    store = rp.Store(SIGNATURE, capacity=cfg.replay_size + 2 * cfg.envs + 4 * block, block_steps=block,
                     device=store_device)
    try:
        sampler = rp.selectors.Prioritized(cfg.priority_exponent) if cfg.prioritized else rp.selectors.Uniform()
        # The buffer lets the actor insert a whole iteration and the learner draw a whole
        # batch while the other works: neither waits on every call.
        buffer = 2.0 * (cfg.samples_per_insert * cfg.envs + cfg.batch_size)
        # On a GPU the draws are device-resident (no host work per drawn item). On the
        # CPU, where the GPU path is emulated, the host draws: there the "kernels" would
        # be CPU torch operations, slower than the host table's own selection.
        from reprise.torch import emulated
        selection = None if emulated() else store_device
        table = rp.Table("replay", store, sampler=sampler, remover=rp.selectors.Fifo(), max_size=cfg.replay_size,
                         rate_limiter=rp.rate_limiters.SampleToInsertRatio(cfg.samples_per_insert, cfg.min_replay,
                                                                           error_buffer=buffer),
                         seed=cfg.seed, selection_device=selection)
    except BaseException:
        store.close()
        raise
    return store, table


def epsilons(cfg: Config, device):
    """Ape-X's exploration rates: environment i of N acts at random with probability
    ``epsilon ** (1 + alpha i / (N - 1))`` (0.4 down to 0.4^8)."""
    import torch
    i = torch.arange(cfg.envs, dtype=torch.float64, device=device)
    return (cfg.epsilon ** (1.0 + cfg.epsilon_alpha * i / max(1, cfg.envs - 1))).to(torch.float32)


class Actor:
    """Steps the environments with an epsilon-greedy copy of the learner's network and
    writes every transition into the replay. ``iteration()`` is one step of all N
    environments; ``run`` loops until ``stop`` is set (the actor thread)."""

    def __init__(self, cfg: Config, table, policy, lock: threading.Lock, device, seed: int):
        import torch
        self.cfg, self.table, self.policy, self.lock, self.device = cfg, table, policy, lock, device
        self.env = VecCartPole(cfg.envs, device, seed)
        self.writer = table.store.writer(max_sequence_length=cfg.envs)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed + 1)
        self.epsilon = epsilons(cfg, device)
        self.priorities = np.ones(cfg.envs)      # Prioritized: the largest priority seen so far
        self.iterations = 0
        self.dropped = 0                          # items not inserted because the run stopped
        self.error: BaseException | None = None
        self._env_lock = threading.Lock()           # a step and take_returns never interleave

    def act(self, obs):
        import torch
        with torch.no_grad(), self.lock:
            greedy = self.policy(obs).argmax(dim=1)
        n = self.cfg.envs
        explore = torch.rand(n, generator=self.generator, device=self.device) < self.epsilon
        random = torch.randint(0, 2, (n,), generator=self.generator, device=self.device)
        return torch.where(explore, random, greedy)

    def iteration(self, stop: threading.Event | None = None) -> None:
        obs = self.env.obs
        action = self.act(obs)
        with self._env_lock:
            next_obs, reward, terminated, _ = self.env.step(action)
        self.writer.extend({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                            "terminal": terminated})
        self.insert(stop)
        self.iterations += 1

    def insert(self, stop: threading.Event | None) -> None:
        """One item per step of the extend. The rate limiter may let part of them in and hold
        the rest: those are the newest steps, so ``create_items`` over the remaining
        priorities makes exactly the items still missing."""
        left = self.priorities
        while len(left):
            try:
                self.writer.create_items(self.table, 1, left, timeout=None if stop is None else INSERT_WAIT_S)
                return
            except rp.errors.Timeout as e:
                done = 0 if e.partial is None else len(e.partial)
                left = left[done:]
                if stop.is_set():
                    self.dropped += len(left)
                    return

    def run(self, stop: threading.Event) -> None:
        """The actor thread: iterations until ``stop``; an error is kept in ``error``."""
        try:
            while not stop.is_set():
                self.iteration(stop)
        except BaseException as e:  # noqa: BLE001 - reported by the learner's loop, which ends the run
            self.error = e

    def take_returns(self) -> tuple[int, float]:
        """``(episodes, sum of their returns)`` finished since the last call (any thread)."""
        with self._env_lock:
            return self.env.take_returns()

    def close(self) -> None:
        self.writer.close()


__all__ = ["Actor", "SIGNATURE", "block_steps_for", "epsilons", "make_replay"]

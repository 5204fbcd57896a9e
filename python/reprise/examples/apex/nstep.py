"""n-step transitions: the actor side (steps written once, one item per transition over the
steps it spans, initial priorities) and the learner side (targets of a sampled batch)."""

from __future__ import annotations

from collections import deque

import numpy as np


class NStepTransitions:
    """One environment's episode stream: every step is written once, and each n-step
    transition is an item over the steps it spans.

    Step t holds ``obs`` s_t, the ``action`` taken there, the ``reward`` it earned and
    ``terminal`` False; an episode ends with a step holding the final observation (``terminal``
    True when the environment terminated, False when a time limit cut it). The item of
    transition t covers steps t .. t + k with k = min(n, steps left): its return is
    ``sum_i gamma^i reward[i] for i < k``, bootstrapped from ``obs[k]`` unless ``terminal[k]``.
    Transitions overlap, so their items share steps. The initial priority is |TD error|
    with the actor's own Q values, as in Ape-X.

    With ``newest_frame`` (a replay whose ``obs`` is a stacked field, ``rp.Field(stack=k)``)
    each step writes only the newest frame of its observation (``obs[-1]``); samples give
    the stacks back."""

    def __init__(self, writer, table: str, n: int, gamma: float, newest_frame: bool = False):
        self.writer, self.table, self.n = writer, table, n
        self.newest_frame = newest_frame
        self.discounts = gamma ** np.arange(n + 1)
        self.history = deque(maxlen=n)   # (Q(s_t, a_t), r_t) of the last n transitions

    def _priority(self, k: int, bootstrap: float) -> float:
        """|TD error| of the transition k steps back."""
        recent = list(self.history)[-k:]
        target = float(np.dot(self.discounts[:k], [r for _, r in recent])) + self.discounts[k] * bootstrap
        return abs(target - recent[0][0]) + 1e-3

    def step(self, obs, q_values, action: int, reward: float) -> None:
        """Writes step t; ``q_values`` = Q(s_t, .). The step completes transition t - n."""
        self.writer.append({"obs": obs[-1] if self.newest_frame else obs, "action": action, "reward": reward,
                            "terminal": False})
        if len(self.history) == self.n:
            self.writer.create_item(self.table, self.n + 1, self._priority(self.n, float(np.max(q_values))))
        self.history.append((float(q_values[action]), float(reward)))

    def end(self, final_obs, q_values, terminated: bool) -> None:
        """Writes the final observation and the items of every transition still open."""
        self.writer.append({"obs": final_obs[-1] if self.newest_frame else final_obs, "action": 0, "reward": 0.0,
                            "terminal": bool(terminated)})
        bootstrap = 0.0 if terminated else float(np.max(q_values))
        for k in range(len(self.history), 0, -1):
            self.writer.create_item(self.table, k + 1, self._priority(k, bootstrap))
        self.writer.end_episode()
        self.history.clear()


def n_step_targets(reward, terminal, lengths, gamma: float, q_bootstrap):
    """Targets ``y`` of a batch of n-step items (torch tensors): ``reward`` [B, n+1], ``terminal``
    [B, n+1], ``lengths`` [B] (k + 1 steps each), ``q_bootstrap`` [B] = Q(obs[k]) by the target net."""
    import torch
    B, width = reward.shape
    n = width - 1
    k = lengths - 1
    rows = torch.arange(B, device=reward.device)
    powers = gamma ** torch.arange(n + 1, device=reward.device, dtype=torch.float64)
    taken = torch.arange(n, device=reward.device) < k[:, None]
    returns = (reward[:, :n].double() * taken * powers[:n]).sum(dim=1)
    alive = ~terminal[rows, k]
    return (returns + powers[k] * alive * q_bootstrap.double()).float()

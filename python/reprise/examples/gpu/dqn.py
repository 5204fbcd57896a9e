"""The learner: double DQN with a target network on one-step transitions sampled on the
device.

``Learner.update(sample)`` takes a ``Sample`` whose tensors are already on the device
(``table.sample(B, device=...)``) and runs one gradient step; nothing is read back to the
host except, with ``--prioritized``, the new priorities (|TD error|) that
``table.update_priorities`` needs. The loss is summed on the device and read once per
evaluation.
"""

from __future__ import annotations

import threading

from .cartpole import NUM_ACTIONS, OBS_DIM
from .config import Config

PRIORITY_FLOOR = 1e-3   # |TD| + this: no item's priority reaches 0


def make_q_network(hidden: int):
    from torch import nn
    return nn.Sequential(nn.Linear(OBS_DIM, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, NUM_ACTIONS))


class Learner:
    """The online network, its target and the actor's copy (``policy``, copied under
    ``lock`` every ``sync_every`` steps: the actor thread reads it meanwhile)."""

    def __init__(self, cfg: Config, device, seed: int):
        import torch
        torch.manual_seed(seed)
        self.cfg, self.device = cfg, device
        self.net = make_q_network(cfg.hidden).to(device)
        self.target = make_q_network(cfg.hidden).to(device)
        self.policy = make_q_network(cfg.hidden).to(device)
        self.target.load_state_dict(self.net.state_dict())
        self.policy.load_state_dict(self.net.state_dict())
        self.lock = threading.Lock()
        try:
            self.optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.lr, fused=device.type == "cuda")
        except (RuntimeError, TypeError):  # a torch without fused Adam for this device
            self.optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.lr)
        self.steps = 0
        self.loss_sum = torch.zeros((), device=device)
        self.loss_count = 0
        self.max_priority = 1.0

    def update(self, sample, beta: float = 1.0):
        """One gradient step on ``sample``; returns the new priorities (numpy) with
        ``--prioritized``, else None."""
        import torch
        import torch.nn.functional as F
        d = sample.data
        obs, next_obs = d["obs"][:, 0], d["next_obs"][:, 0]
        action, reward, terminal = d["action"][:, 0], d["reward"][:, 0], d["terminal"][:, 0]
        b = obs.shape[0]
        q_all = self.net(torch.cat([obs, next_obs]))
        q_taken = q_all[:b].gather(1, action.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            best = q_all[b:].argmax(dim=1, keepdim=True)                  # double DQN: the online net picks,
            q_next = self.target(next_obs).gather(1, best).squeeze(1)    # the target evaluates
            y = reward + self.cfg.gamma * (~terminal).to(q_next.dtype) * q_next
        losses = F.smooth_l1_loss(q_taken, y, reduction="none")
        priorities = None
        if self.cfg.prioritized:
            weights = torch.as_tensor(sample.importance_weights(beta), dtype=torch.float32, device=self.device)
            losses = losses * weights
            priorities = (q_taken.detach() - y).abs().double().cpu().numpy() + PRIORITY_FLOOR
            self.max_priority = max(self.max_priority, float(priorities.max()))
        loss = losses.mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 10.0)
        self.optimizer.step()
        self.loss_sum += loss.detach()
        self.loss_count += 1
        self.steps += 1
        if self.steps % self.cfg.target_update == 0:
            self.target.load_state_dict(self.net.state_dict())
        if self.steps % self.cfg.sync_every == 0:
            self.sync()
        return priorities

    def sync(self) -> None:
        """Copies the online network to the actor's."""
        with self.lock:
            self.policy.load_state_dict(self.net.state_dict())

    def take_loss(self) -> float | None:
        """The mean loss since the last call (reads the device); None when no step ran."""
        if self.loss_count == 0:
            return None
        mean = float(self.loss_sum) / self.loss_count
        self.loss_sum.zero_()
        self.loss_count = 0
        return mean


__all__ = ["Learner", "make_q_network"]

"""The dueling Q network, and its parameters as one flat float32 vector (what the ``params``
table holds)."""

from __future__ import annotations

import numpy as np


def make_network(spec: dict, hidden: int):
    """A dueling Q network: an MLP for vector observations, the Nature CNN for Atari frames."""
    from torch import nn

    class Dueling(nn.Module):
        def __init__(self):
            super().__init__()
            shape = spec["obs_shape"]
            if len(shape) == 3:
                self.body = nn.Sequential(
                    nn.Conv2d(shape[0], 32, 8, stride=4), nn.ReLU(),
                    nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                    nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
                    nn.Linear(64 * 7 * 7, 512), nn.ReLU())
                width, self.scale = 512, 1.0 / 255.0
            else:
                self.body = nn.Sequential(nn.Linear(int(np.prod(shape)), hidden), nn.ReLU(),
                                          nn.Linear(hidden, hidden), nn.ReLU())
                width, self.scale = hidden, 1.0
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, spec["num_actions"])

        def forward(self, obs):
            h = self.body(obs.float() * self.scale)
            a = self.advantage(h)
            return self.value(h) + a - a.mean(dim=1, keepdim=True)

    return Dueling()


def flat_parameters(net) -> np.ndarray:
    import torch
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).float().cpu() for p in net.parameters()]).numpy()


def load_flat_parameters(net, flat) -> None:
    import torch
    flat = torch.as_tensor(np.asarray(flat), dtype=torch.float32)
    offset = 0
    with torch.no_grad():
        for p in net.parameters():
            n = p.numel()
            p.copy_(flat[offset:offset + n].view_as(p))
            offset += n


def num_parameters(spec: dict, hidden: int) -> int:
    return sum(p.numel() for p in make_network(spec, hidden).parameters())

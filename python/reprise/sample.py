"""Samples: the result of one draw of n items."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sample:
    """n drawn items.

    ``data[field]`` has shape ``[n, T, *field.shape]`` where T is the longest item;
    rows past ``lengths[i]`` are zeros. ``probabilities[i]`` is the probability that
    this draw picked item i and ``table_size`` the table's size when the draw began,
    so prioritized-replay importance weights are ``(table_size * probabilities) ** -beta``.
    """

    keys: np.ndarray
    probabilities: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    table_size: int
    lengths: np.ndarray
    data: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def importance_weights(self, beta: float = 1.0) -> np.ndarray:
        """``(N * P(i)) ** -beta`` normalised by its maximum, as in prioritized replay."""
        w = (self.table_size * self.probabilities) ** (-float(beta))
        return w / w.max() if len(w) else w

    def __repr__(self):
        fields = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.data.items())
        return f"Sample(n={len(self)}, table_size={self.table_size}, data={{{fields}}})"

"""Selectors: how a table picks items to sample (sampler) or to evict (remover).

Every selector can serve as either. Probabilities reported with each sample are the
probability of that draw: 1 for the deterministic ones."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._convert import as_float
from .errors import InvalidArgument


class Selector:
    """Base class. ``_spec()`` is what the native table is built from."""

    def _spec(self) -> tuple[str, float]:
        return (type(self).__name__, 0.0)

    def __repr__(self):
        return f"{type(self).__name__}()"


class Fifo(Selector):
    """The oldest item."""


class Lifo(Selector):
    """The newest item."""


class Uniform(Selector):
    """Every item with the same probability, 1/size."""


class MaxHeap(Selector):
    """The item with the highest priority (ties: oldest first)."""


class MinHeap(Selector):
    """The item with the lowest priority (ties: oldest first)."""


class TopK(Selector):
    """A draw of n is the n items with the highest priorities, best first (ties:
    oldest first); past the table's size the ranking repeats. As a remover it
    evicts the highest priority (like MaxHeap)."""


@dataclass(frozen=True, repr=False)
class Prioritized(Selector):
    """Item i with probability p_i^a / sum_k p_k^a, a = ``priority_exponent``.

    An f64 sum tree: O(log n) per draw and per priority update. When every
    priority is zero the draw is uniform."""

    priority_exponent: float = 1.0

    def __post_init__(self):
        a = as_float("priority_exponent", self.priority_exponent)
        if not (math.isfinite(a) and a >= 0):
            raise InvalidArgument(f"Prioritized priority_exponent must be finite and >= 0, got {a}")
        object.__setattr__(self, "priority_exponent", a)

    def _spec(self):
        return ("Prioritized", self.priority_exponent)

    def __repr__(self):
        return f"Prioritized(priority_exponent={self.priority_exponent})"


__all__ = ["Selector", "Fifo", "Lifo", "Uniform", "Prioritized", "MaxHeap", "MinHeap", "TopK"]

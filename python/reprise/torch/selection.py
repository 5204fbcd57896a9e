"""GPU selection (``Table(..., selection_device="cuda")``).

The table keeps its items, remover, rate limiter and ``max_times_sampled`` on the
host; its sampler's picks are made here, on the device, from a mirror of the
items: per slot its insertion sequence and priority, plus a device sum tree of
sampling weights. Before each draw the mirror applies the slots that changed
since the last one (``drain_changes``: O(changes), batched); the picks go back to
the table as candidates, which it checks and applies under its lock (see
crates/core/src/selectors/external.rs). A candidate whose item left in the
meantime is skipped and, if the batch is short, the mirror is refreshed and
picks again — so draws follow the same distribution as the host selectors:

* Uniform: each present item with probability 1/size (sum tree of ones);
* Prioritized: p^a / sum p^a (sum tree of weights; uniform when all are zero);
* Fifo / Lifo: the oldest / newest items, in order;
* MaxHeap / MinHeap / TopK: the highest / lowest / highest priorities in order,
  equal priorities oldest first.

Random draws use a ``torch.Generator`` on the device seeded from the table's seed,
so a seeded table gives the same draws run after run.
"""

from __future__ import annotations

import threading

import numpy as np

from ._device import host_to_device, torch_module
from .sum_tree import SumTree

RANDOM = ("Uniform", "Prioritized")


class DeviceSelection:
    def __init__(self, native, kind: str, exponent: float, device, seed: int | None, max_size: int,
                 max_times_sampled: int = 0):
        torch = torch_module()
        self.native, self.kind, self.exponent, self.device = native, kind, float(exponent), device
        # With max_times_sampled the table draws one at a time: TopK repeats its best.
        self.tile = kind == "TopK" and max_times_sampled == 0
        self.lock = threading.Lock()
        self.capacity = 0
        self.seq = torch.empty(0, dtype=torch.int64, device=device)
        self.priority = torch.empty(0, dtype=torch.float64, device=device)
        self.tree = SumTree(1, device) if kind in RANDOM else None
        self._grow(max_size + 1)
        self.generator = seeded_generator(device, seed)

    def _grow(self, capacity: int):
        torch = torch_module()
        if capacity <= self.capacity:
            return
        new = max(capacity, 2 * self.capacity)
        seq = torch.full((new,), -1, dtype=torch.int64, device=self.device)
        priority = torch.zeros(new, dtype=torch.float64, device=self.device)
        seq[: self.capacity] = self.seq
        priority[: self.capacity] = self.priority
        self.seq, self.priority, self.capacity = seq, priority, new
        if self.tree is not None and self.tree.capacity < new:
            self.tree = self.tree.grow(new)

    def sync(self):
        """Applies the table's changes since the last sync."""
        torch = torch_module()
        slots, seqs, priorities = self.native.drain_changes()
        if slots.size == 0:
            return
        self._grow(int(slots.max()) + 1)
        weights = sampling_weights(self.kind, self.exponent, seqs, priorities)
        host = np.stack([slots, seqs, priorities.view(np.int64), weights.view(np.int64)])
        s, q, p, w = host_to_device(host, self.device).unbind(0)
        self.seq[s] = q
        self.priority[s] = p.view(torch.float64)
        if self.tree is not None:
            self.tree.set(s, w.view(torch.float64))

    def draw(self, n: int):
        """``(slots, seqs, probabilities)`` as host int64/int64/float64 arrays: n
        random draws (Uniform, Prioritized, TopK) or up to n items in the sampler's
        order (the others; the table repeats the first until it leaves)."""
        torch = torch_module()
        if self.kind in RANDOM:
            total = float(self.tree.total())
            if total > 0:
                u = torch.rand(n, dtype=torch.float64, device=self.device, generator=self.generator) * total
                slots = self.tree.find(u)
                probs = self.tree.get(slots) / total
            else:
                present = torch.nonzero(self.seq >= 0).flatten()
                if present.numel() == 0:
                    return _empty()
                pick = torch.randint(present.numel(), (n,), device=self.device, generator=self.generator)
                slots = present[pick]
                probs = torch.full((n,), 1.0 / present.numel(), dtype=torch.float64, device=self.device)
        else:
            slots = self._ordered(n)
            if slots.numel() == 0:
                return _empty()
            if self.tile:
                reps = -(-n // slots.numel())
                slots = slots.repeat(reps)[:n]
            probs = torch.ones(slots.numel(), dtype=torch.float64, device=self.device)
        seqs = self.seq[slots]
        # One device-to-host copy (slots and seqs are exact in f64 below 2^53).
        host = torch.stack([slots.to(torch.float64), seqs.to(torch.float64), probs]).cpu().numpy()
        return host[0].astype(np.int64), host[1].astype(np.int64), np.ascontiguousarray(host[2])

    def _ordered(self, n: int):
        """Up to n present slots in the sampler's order."""
        torch = torch_module()
        present = self.seq >= 0
        count = int(present.sum())
        k = min(n, count)
        if k == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        if self.kind in ("Fifo", "Lifo"):
            big = torch.iinfo(torch.int64).max
            if self.kind == "Fifo":
                key = torch.where(present, self.seq, torch.full_like(self.seq, big))
                return torch.topk(key, k, largest=False, sorted=True).indices
            key = torch.where(present, self.seq, torch.full_like(self.seq, -1))
            return torch.topk(key, k, largest=True, sorted=True).indices
        largest = self.kind in ("MaxHeap", "TopK")
        fill = -float("inf") if largest else float("inf")
        prio = torch.where(present, self.priority, torch.full_like(self.priority, fill))
        kth = torch.topk(prio, k, largest=largest, sorted=True).values[-1]
        better = (prio > kth) if largest else (prio < kth)
        chosen = torch.nonzero(better & present).flatten()
        tied = torch.nonzero((prio == kth) & present).flatten()
        need = k - chosen.numel()
        if need > 0:
            oldest = torch.topk(self.seq[tied], need, largest=False, sorted=True).indices
            chosen = torch.cat([chosen, tied[oldest]])
        # Order: priority (best first), then insertion order. Two stable sorts.
        by_seq = chosen[torch.sort(self.seq[chosen], stable=True).indices]
        order = torch.sort(self.priority[by_seq], descending=largest, stable=True).indices
        return by_seq[order]


def seeded_generator(device, seed: int | None):
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (None: from the OS)."""
    generator = torch_module().Generator(device=device)
    generator.manual_seed(int(seed) if seed is not None else int(np.random.SeedSequence().entropy % (1 << 63)))
    return generator


def sampling_weights(kind: str, exponent: float, seqs: np.ndarray, priorities: np.ndarray) -> np.ndarray:
    """The sum tree's weight of each changed slot, on the host (where the changes
    arrive): ones for Uniform, ``p^exponent`` for Prioritized; zero for empty slots
    (``seqs`` -1)."""
    present = seqs >= 0
    if kind == "Uniform":
        return present.astype(np.float64)
    w = priorities if exponent == 1.0 else np.power(priorities, exponent)
    return np.where(present, w, 0.0)


def _empty():
    return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)

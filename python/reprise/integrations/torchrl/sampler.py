"""``ReprisePrioritizedSampler``: TorchRL's ``PrioritizedSampler`` with the priorities
in a ``RepriseStorage``'s table, drawn from its exact f64 sum tree.

The sampler keeps no tree of its own: its state is ``alpha``, ``beta``, ``eps`` and the
largest priority given so far (``state_dict``, ``dumps``/``loads``, pickled as is). It
binds to the storage it is used with (weakly; a pickled sampler is rebound by its
storage or at its next use).
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from ..._convert import as_float, as_int
from ...errors import InvalidArgument
from .storage import RepriseStorage, TablePriorities

_EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."


class ReprisePrioritizedSampler(PrioritizedSampler, TablePriorities):
    """TorchRL's ``PrioritizedSampler`` over a ``RepriseStorage``: the priorities are the
    items' priorities in the storage's table, drawn from its exact f64 sum tree.

    The table holds ``priority + eps`` and samples with exponent ``alpha`` (fixed when the
    first write makes the table, so ``alpha`` cannot change afterwards). New elements get
    the largest priority given so far (1 at first). ``priority_weight`` is
    ``(N * P(i)) ** -beta`` normalised by the batch's largest (TorchRL's divides by the
    buffer's smallest-priority weight instead). ``max_capacity`` is optional: when given
    it must be at least the storage's ``max_size``.
    """

    def __init__(self, max_capacity: int | None = None, *, alpha: float, beta: float, eps: float = 1e-8,
                 reduction: str = "max"):
        self._max_capacity = None if max_capacity is None else as_int("max_capacity", max_capacity, 1)
        self._alpha = self._checked("alpha", alpha)
        self._beta = self._checked("beta", beta)
        self._eps = self._checked("eps", eps)
        self.reduction = reduction
        self.dtype = torch.float64
        self._max_priority_within_buffer = False
        self._device = None
        self._max_seen = None
        self._storage_ref = None

    @staticmethod
    def _checked(name: str, value) -> float:
        value = as_float(f"ReprisePrioritizedSampler: {name}", value)
        if not np.isfinite(value) or value < 0:
            raise InvalidArgument(f"ReprisePrioritizedSampler: {name} must be finite and >= 0, got {value}")
        return value

    def _init(self):
        """No trees of its own: the table keeps the priorities."""

    @property
    def device(self):
        return torch.device("cpu")

    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value):
        value = self._checked("alpha", value)
        storage = self._storage()
        if storage is not None and storage._table is not None and value != self._alpha:
            raise InvalidArgument(f"ReprisePrioritizedSampler: alpha is the priority exponent of table "
                                  f"'{storage._table.name}', fixed when it was made; it cannot change to {value}")
        self._alpha = value

    @property
    def default_priority(self) -> float:
        return 1.0 if self._max_seen is None else self._max_seen

    def _storage(self):
        return None if self._storage_ref is None else self._storage_ref()

    def _bind(self, storage) -> RepriseStorage:
        storage = self._storage() if storage is None else storage
        if not isinstance(storage, RepriseStorage):
            raise InvalidArgument(f"ReprisePrioritizedSampler needs a RepriseStorage (the priorities live in its "
                                  f"Reprise table), got {type(storage).__name__}; use torchrl's PrioritizedSampler "
                                  f"with other storages")
        storage._bind_sampler(self)
        self._storage_ref = weakref.ref(storage)
        return storage

    def sample(self, storage, batch_size: int):
        storage = self._bind(storage)
        if len(storage) == 0 or storage._table is None or storage._table.size == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        index, weight = storage._draw(batch_size, self._beta)
        return index, {"priority_weight": weight}

    @torch.no_grad()
    def update_priority(self, index, priority, *, storage=None):
        """Sets the priorities of the elements at ``index`` (one priority, or one per
        index; indices < 0 are skipped, as TorchRL's writers mark them). Every priority
        is checked first: a bad one changes nothing."""
        storage = self._bind(storage)
        if isinstance(index, tuple):
            raise IndexError("ReprisePrioritizedSampler: RepriseStorage is one-dimensional; got a tuple index")
        idx = torch.as_tensor(index).detach().to("cpu", torch.int64).reshape(-1).numpy()
        p = torch.as_tensor(priority).detach().to("cpu", torch.float64).reshape(-1).numpy()
        if p.size == 1:
            p = np.full(idx.size, p[0])
        elif p.size != idx.size:
            raise InvalidArgument(f"update_priority: {p.size} priorities for {idx.size} indices; expected one per "
                                  f"index or one for all")
        keep = idx >= 0
        idx, p = idx[keep], p[keep]
        if idx.size == 0:
            return
        bad = np.flatnonzero(~np.isfinite(p) | (p < 0))
        if bad.size:
            i = bad[0]
            raise InvalidArgument(f"update_priority: index {int(idx[i])}: priority must be finite and >= 0, got {p[i]}")
        storage._update_priorities(idx, p + self._eps)
        top = float(p.max())
        self._max_seen = top if self._max_seen is None else max(self._max_seen, top)

    def mark_update(self, index, *, storage=None):
        """New elements were inserted at ``default_priority`` by the storage: only binds."""
        self._bind(storage)

    def _empty(self):
        self._max_seen = None

    def state_dict(self) -> dict:
        return {"_alpha": self._alpha, "_beta": self._beta, "_eps": self._eps, "_max_priority": self._max_seen}

    def load_state_dict(self, state_dict: dict):
        self.alpha = state_dict["_alpha"]
        self._beta = self._checked("beta", state_dict["_beta"])
        self._eps = self._checked("eps", state_dict["_eps"])
        m = state_dict["_max_priority"]
        self._max_seen = None if m is None else float(m)

    def dumps(self, path):
        path = Path(path).absolute()
        path.mkdir(parents=True, exist_ok=True)
        with open(path / "sampler_metadata.json", "w") as f:
            json.dump(self.state_dict(), f)

    def loads(self, path):
        with open(Path(path).absolute() / "sampler_metadata.json") as f:
            self.load_state_dict(json.load(f))

    def __getstate__(self):
        state = super().__getstate__()
        state["_storage_ref"] = None
        return state

    def __repr__(self):
        return f"{type(self).__name__}(alpha={self._alpha}, beta={self._beta}, eps={self._eps})"

"""Reading elements out of a ``RepriseStorage``'s store.

Reads gather rows straight from the store's memory (``index_select`` on the host, the
fused gather kernel on a GPU): no draw is counted and no item is touched. A GPU read
may still be running when ``read`` returns: it hands back a CUDA event, which the
storage waits on before a write may free and reuse the rows.

For the host a ``Reader`` keeps each leaf's column viewed as ``[capacity, *shape]`` of
the leaf's dtype (bfloat16 straight from its int16 carrier's bits; columns start
64-byte aligned, so every dtype can view them), so a host read of n elements is one
``index_select`` per field (plus a view where the index is not one-dimensional), with
no lookups per call. A reader belongs to one store and one signature: the storage
makes a new one whenever it takes another store.
"""

from __future__ import annotations

import numpy as np
import torch


class Reader:
    """Reads rows of ``store`` as the leaves of ``spec``'s elements."""

    def __init__(self, store, spec):
        self._store, self._spec = store, spec
        self._host = None  # [(column as tensor[capacity, *shape] of the leaf's dtype, shape)], in leaf order

    def read(self, rows: np.ndarray, lead: tuple, device) -> tuple:
        """``([tensor[*lead, *shape] per leaf], event)``: the ``rows`` (int64, flat,
        each one holding an item; ``prod(lead)`` of them) on ``device``, in the leaves'
        dtypes. ``event`` marks the end of a GPU gather (None on the host)."""
        idx = torch.from_numpy(rows)
        if device.type == "cpu":
            host = self._host if self._host is not None else self._host_columns(device)
            if len(lead) == 1:
                return [torch.index_select(column, 0, idx) for column, _ in host], None
            return [torch.index_select(column, 0, idx).view((*lead, *shape)) for column, shape in host], None
        from ...torch._device import new_event
        from ...torch.collect import gather
        leaves = self._spec.leaves
        data = gather(self._store._columns_for(device), [leaf.name for leaf in leaves], idx.to(device),
                      rows.size, 1, False)
        out = [data[leaf.name].view(leaf.dtype).reshape((*lead, *leaf.shape)) for leaf in leaves]
        event = new_event(device)
        event.record()
        return out, event

    def _host_columns(self, device) -> list:
        views = self._store._columns_for(device).views  # [capacity, words] of the widest word dividing a row
        self._host = [(views[leaf.name].view(leaf.dtype).view(-1, *leaf.shape), leaf.shape)
                      for leaf in self._spec.leaves]
        return self._host

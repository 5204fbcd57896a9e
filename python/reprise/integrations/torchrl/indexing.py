"""TorchRL indices as positions of a one-dimensional ``RepriseStorage``.

``positions`` takes what ``get``, ``set`` and ``load_state_dict`` take (an int, a
slice, ``...``, a list, an array, a tensor of any shape, a bool mask, a 1-tuple of
any of those) and follows torch's rules: negatives count from the end, a bool mask
selects, anything out of range is an ``IndexError`` naming it. O(n) in the index.
"""

from __future__ import annotations

import numpy as np
import torch


def positions(index, length: int, what: str) -> np.ndarray:
    """``index`` as int64 positions in ``[0, length)`` (a 0-d array for one int)."""
    if isinstance(index, tuple):
        if len(index) != 1:
            raise IndexError(f"RepriseStorage is one-dimensional: {what} {index!r} has {len(index)} dimensions")
        index = index[0]
    if index is Ellipsis:
        index = slice(None)
    if isinstance(index, slice):
        return np.arange(*index.indices(length), dtype=np.int64)
    if isinstance(index, torch.Tensor):
        index = index.numpy(force=True)  # detached, on the host
    arr = np.asarray(index)
    if arr.dtype == np.bool_:
        if arr.shape != (length,):
            raise IndexError(f"RepriseStorage: a boolean {what} needs shape [{length}], got {list(arr.shape)}")
        return np.flatnonzero(arr)
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise IndexError(f"RepriseStorage: {what} must hold integers, got {arr.dtype}")
    pos = arr.astype(np.int64, copy=False)
    if pos.view(np.uint64).max() < length:  # one pass: negatives are huge as unsigned
        return pos
    low = pos.min()
    if low < 0:
        pos = np.where(pos < 0, pos + length, pos)
        low = pos.min()
    if low < 0 or pos.max() >= length:
        bad = np.flatnonzero(((pos < 0) | (pos >= length)).reshape(-1))
        raise IndexError(f"RepriseStorage: {what} {int(arr.reshape(-1)[bad[0]])} is out of range for {length} positions")
    return pos

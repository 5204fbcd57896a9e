"""Reused memory for large sample outputs on the host (``OutputPool``)."""

from __future__ import annotations

import threading
import weakref

import numpy as np


class OutputPool:
    """Memory for the large arrays of host samples, reused once nothing refers to an
    array made on it. Fresh memory for a batch costs a page fault per 4 KiB page
    whenever malloc has handed the last batch's back to the system (it does for
    blocks of megabytes), and for a 256 x 28 KB Atari batch those faults were most
    of a sample's time. ``empty`` hands out an array whose views (numpy's, and
    ``torch.from_numpy``'s tensors and theirs) all keep it alive; when it is
    collected its memory comes back here, at most ``KEEP`` blocks per size."""

    MIN_BYTES = 1 << 20
    KEEP = 4

    def __init__(self):
        self._free: dict[int, list] = {}
        self._lock = threading.Lock()

    def empty(self, nbytes: int) -> np.ndarray:
        """A uint8[nbytes] array (contents undefined)."""
        if nbytes < self.MIN_BYTES:
            return np.empty(nbytes, np.uint8)
        with self._lock:
            free = self._free.setdefault(nbytes, [])
            raw = free.pop() if free else np.empty(nbytes, np.uint8)
        # An array on a memoryview is where numpy's views of it stop looking for their
        # base: every view made from it keeps it alive, and its collection (no view
        # left) gives ``raw`` back.
        out = np.frombuffer(memoryview(raw), np.uint8)
        weakref.finalize(out, self._give_back, free, raw)
        return out

    def _give_back(self, free: list, raw: np.ndarray) -> None:
        with self._lock:
            if len(free) < self.KEEP:
                free.append(raw)


POOL = OutputPool()

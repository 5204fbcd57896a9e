"""Payloads and priorities every system gets the same of (numpy only).

Data is random normals (float32), so compression helps nobody; priorities are uniform
in (0.01, 10.01]. Everything is seeded: each system sees the same bytes.
"""

from __future__ import annotations

import numpy as np

from benchmarks.common.config import MiB


def payload(n: int, floats: int, seed: int = 0) -> np.ndarray:
    """float32[n, floats] of random normals: n steps of one field."""
    return np.random.default_rng(seed).standard_normal((n, floats), dtype=np.float32)


def step_payload(n: int, floats: int, seed: int = 0) -> np.ndarray:
    """float32[n, 1, floats]: the same values as :func:`payload`, as n one-step items."""
    return payload(n, floats, seed).reshape(n, 1, floats)


def floats_for(size: int) -> int:
    """float32 values in an item of ``size`` bytes."""
    assert size % 4 == 0
    return size // 4


def random_priorities(n: int, seed: int = 1) -> np.ndarray:
    """float64[n] uniform in (0.01, 10.01]: the same for every system."""
    return (np.random.default_rng(seed).random(n) * 10.0 + 0.01).astype(np.float64)


class PriorityStream:
    """Fresh random priorities for update_priorities, reused buffers: cheap per round."""

    def __init__(self, batch: int, seed: int = 2, dtype=np.float64) -> None:
        rng = np.random.default_rng(seed)
        self._pool = (rng.random(batch * 64) * 10.0 + 0.01).astype(dtype)
        self._batch = batch
        self._i = 0

    def next(self) -> np.ndarray:
        i = self._i
        self._i = (i + 1) % 64
        return self._pool[i * self._batch:(i + 1) * self._batch]


def fill_rows(n_items: int, floats: int, chunk: int = 4096) -> int:
    """Rows of payload to fill a table from: at most ``chunk`` and about 64 MiB."""
    return max(1, min(n_items, chunk, (64 * MiB) // (4 * floats)))


def fill_batches(n_items: int, batch: int):
    """Yield (start, stop) covering n_items in chunks of at most batch."""
    for start in range(0, n_items, batch):
        yield start, min(n_items, start + batch)


def check_batch(data, batch: int, floats: int) -> None:
    """Sanity check once per workload that a system returned what was asked for."""
    arr = np.asarray(data)
    if arr.shape[0] != batch or arr.size != batch * floats:
        raise AssertionError(f"expected {batch} x {floats} floats, got shape {arr.shape}")
    if arr.dtype != np.float32:
        raise AssertionError(f"expected float32, got {arr.dtype}")

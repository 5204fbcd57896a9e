"""Checkpoints: ``save(path, tables)`` and ``load(path)``.

The format (a directory with a manifest, row runs, column files, table indexes
and a size + CRC-32 per file, written under a temporary name and renamed when
complete) lives in Rust, ``crates/core/src/checkpoint/``, shared with the
servers; ``docs/checkpoints.md`` describes it. This module checks arguments,
shows progress, and moves the rows of device (GPU) stores, which the Rust side
reads and writes through the callbacks below.
"""

from __future__ import annotations

import json
import os

import numpy as np

from . import _native
from ._progress import Progress
from .errors import InvalidArgument
from .signature import Field

FORMAT = _native.checkpoint.FORMAT
VERSION = _native.checkpoint.VERSION

# The bar save and load show (tests replace it to watch a save's progress).
_Progress = Progress


class _Bar:
    """``progress(done, total)`` for the Rust side: a ``_Progress`` bar made at the first call."""

    def __init__(self, desc: str, enabled: bool | None):
        self._desc, self._enabled = desc, enabled
        self._bar, self._done = None, 0

    def __call__(self, done: int, total: int):
        if self._bar is None:
            self._bar = _Progress(total, self._desc, self._enabled)
        if done > self._done:
            self._bar.update(done - self._done)
            self._done = done

    def close(self):
        if self._bar is not None:
            self._bar.close()


def _device_reader(store):
    """``read(col, row, rows)``: rows of a device store's field ``col`` as uint8 bytes."""
    cols = store._device_columns
    if cols.device.type == "cuda":
        __import__("torch").cuda.synchronize(cols.device)  # writes recorded on any stream are done
    names = list(store.signature)

    def read(col, row, rows):
        view = cols.views[names[col]]
        return np.ascontiguousarray(view[row:row + rows].cpu().numpy()).view(np.uint8).reshape(-1)

    return read


def _device_writer(store):
    """``write(col, row, data)``: uint8 rows of field ``col`` onto a device store."""
    import torch
    cols = store._device_columns
    names = list(store.signature)

    def write(col, row, data):
        view = cols.views[names[col]]
        rows = data.size // (view.shape[1] * view.element_size())
        words = torch.from_numpy(data).view(view.dtype).view(rows, -1).to(cols.device)
        cols.write({names[col]: words}, torch.arange(row, row + rows, dtype=torch.int64, device=cols.device))

    return write


def save(path, tables, compression: str | None = None, progress: bool | None = None) -> str:
    """Writes a checkpoint of ``tables`` into a new directory under ``path``;
    returns its path. ``compression``: None or "zstd". ``progress``: a bar on
    stderr when it takes over a second (default: when stderr is a terminal)."""
    from .table import Table
    tables = [tables] if isinstance(tables, Table) else list(tables)
    if not tables or not all(isinstance(t, Table) for t in tables):
        raise InvalidArgument(f"tables must be a non-empty list of reprise.Table, got {tables!r}")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"table names must be unique in a checkpoint, got {names}")
    if compression not in (None, "zstd"):
        raise InvalidArgument(f"compression must be None or 'zstd', got {compression!r}")
    for t in tables:
        t.store._check_open()
    for t in tables:
        t._fold()  # draws counted on a device: into times_sampled before the snapshot
    off_host, seen = [], []
    for k, t in enumerate(tables):
        st = t.store
        if st._device_columns is None or any(s is st for s in seen):
            continue
        seen.append(st)
        device = st.device if st.device != "cpu" else "cuda"
        signature = [(n, list(f.shape), f.dtype) for n, f in st.signature.items()]
        off_host.append((k, device, signature, _device_reader(st)))
    bar = _Bar("checkpoint", progress)
    try:
        return _native.checkpoint.save(os.fspath(path), [t._native for t in tables], compression, off_host, bar)
    finally:
        bar.close()


def checkpoints(path) -> list[str]:
    """The checkpoints under ``path``, newest first (valid or not)."""
    return _native.checkpoint.checkpoints(os.fspath(path))


def verify(path) -> dict:
    """Checks a checkpoint's manifest and the size and CRC-32 of every file; returns
    the manifest or raises ``Corrupt`` naming the first bad file."""
    return json.loads(_native.checkpoint.verify(os.fspath(path)))


def latest(path) -> str | None:
    """The newest checkpoint under ``path`` that verifies, or None."""
    return _native.checkpoint.latest(os.fspath(path))


def load(path, progress: bool | None = None, device=None, directory=None,
         huge_pages: bool = False) -> dict:
    """Loads a checkpoint (a directory ``save`` returned, or the newest valid one
    under ``path``) into new stores and tables: ``{name: Table}``. Device stores
    come back on the device they were saved from, or on ``device`` when given;
    host stores go to ``directory`` (default /dev/shm), on huge pages with
    ``huge_pages=True`` (as ``Store`` takes them).

    Every file is checked (size, CRC-32, consistency) as it is read; on any
    damage the new stores are closed and ``Corrupt`` names the file: nothing is
    loaded."""
    from .store import Store
    from .table import Table
    made = []

    def make_store(index, signature, capacity, block_steps, saved_on, file):
        if file is not None:
            raise InvalidArgument(f"{path}: this is the index of the file store whose columns are {file}, saved in "
                                  f"place: open it with rp.Store.open({os.path.dirname(file)!r})")
        sig = {n: Field._from_native(shape, dtype, level, stack, padding)
               for n, shape, dtype, level, stack, padding in signature}
        on = None if saved_on == "cpu" else (saved_on if device is None else device)
        host = on is None
        store = Store(sig, capacity=capacity, block_steps=block_steps, device=on,
                      directory=directory if host else None, huge_pages=huge_pages and host)
        made.append(store)
        return store, None if store._device_columns is None else _device_writer(store)

    bar = _Bar("load", progress)
    try:
        _, stores, tables = _native.checkpoint.load(os.fspath(path), make_store, bar)
    except BaseException:
        for s in made:
            s.close()
        raise
    finally:
        bar.close()
    for s in made:  # stores of newer checkpoints that turned out damaged
        if not any(s is kept for kept in stores):
            s.close()
    return {native.name: Table._restored(native, stores[i], config) for native, i, config in tables}


__all__ = ["save", "load", "verify", "latest", "checkpoints", "FORMAT", "VERSION"]

"""Pickling of stores and tables, through the checkpoint format: a copy.

``pickle.dumps(table)`` (or of a store, or of any object holding them) writes a
checkpoint of every table over the store into a temporary directory and carries its
files as bytes; ``pickle.loads`` loads them into a new store (a new shared-memory
file, or the same device for a device store) and new tables with the same items,
priorities, selector and limiter state and counters. The copy shares nothing with
the original: writers, samples in flight and servers are not carried. A table and
its store pickled together come back together (pickle's memo): the unpickled
table's ``store`` is the unpickled store.

A store pickles with the tables alive over it at the time (it holds them weakly);
one with no table pickles as an empty store of the same layout.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile


def _pack(directory: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(os.listdir(directory)):
            tar.add(os.path.join(directory, name), arcname=name)
    return buf.getvalue()


def _unpack(blob: bytes, directory: str) -> None:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(directory, filter="data")


def reduce_store(store):
    """``Store.__reduce__``: the checkpoint of its tables, or its layout when it has none."""
    store._check_open()
    tables = [t for t in list(store._tables.values()) if t is not None]
    layout = (store.signature, store.capacity, store.block_steps,
              None if store._device_columns is None else str(store._device))
    if not tables:
        return _empty_store, layout
    from .checkpoint import save
    with tempfile.TemporaryDirectory(prefix="reprise-pickle-") as tmp:
        path = save(tmp, sorted(tables, key=lambda t: t.name), progress=False)
        return _loaded_store, (_pack(path), layout[3])


def _empty_store(signature, capacity, block_steps, device):
    from .store import Store
    return Store(signature, capacity=capacity, block_steps=block_steps, device=device)


def _loaded_store(blob: bytes, device):
    from .checkpoint import load
    with tempfile.TemporaryDirectory(prefix="reprise-unpickle-") as tmp:
        checkpoint = os.path.join(tmp, "checkpoint")
        os.mkdir(checkpoint, 0o700)
        _unpack(blob, checkpoint)
        tables = load(checkpoint, progress=False, device=device)
    store = next(iter(tables.values())).store
    store._unpickled = tables  # the store's tables live as long as it does
    return store


def reduce_table(table):
    """``Table.__reduce__``: the table of that name in its (pickled) store."""
    return _table_in, (table.store, table.name)


def _table_in(store, name: str):
    return store._tables[name]

"""Device stores (``Store(..., device="cuda")``): step data in GPU memory.

The host keeps what it always keeps — blocks, reference counts, items, tables —
over a one-byte-per-step index store in shared memory; the step data itself lives
in ``DeviceColumns`` at the same row numbers. Writers accept torch tensors on the
device (or anywhere; numpy too) and copy them into their rows with one kernel per
field, before any item over those rows is created, so a sampler can never find
an item whose data is not written (readers on other streams wait for the writes'
events; see ``DeviceColumns.wait_for_writes``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .. import _native
from .._convert import priorities as as_priorities
from ..errors import InvalidArgument
from ._device import host_to_device

INDEX_FIELD = "__rows__"


def _words(columns, data, lead_of, what):
    """Validates every field of ``data`` (and that no other is given) before anything changes."""
    if not isinstance(data, Mapping):
        raise InvalidArgument(f"{what}expected a dict of field -> value, got {type(data).__name__}")
    missing = [f for f in columns.fields if f not in data]
    extra = [f for f in data if f not in columns.fields]
    if missing or extra:
        raise InvalidArgument(
            f"{what}fields {sorted(map(str, data))} do not match the signature {columns.fields}"
            + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else "")
        )
    lead = lead_of(data)
    return lead, {f: columns.as_words(f, data[f], lead, what) for f in columns.fields}


def _leading(columns, data, dims: int, what: str):
    first = columns.fields[0]
    shape = tuple(getattr(data[first], "shape", np.shape(data[first])))
    if len(shape) < dims:
        raise InvalidArgument(f"{what}field '{first}' needs {dims} leading dimension(s), got shape {list(shape)}")
    return tuple(int(d) for d in shape[:dims])


class DeviceWriter:
    """The ``Writer`` of a device store: the same methods, data on the device."""

    def __init__(self, native_writer, store, max_sequence_length: int | None):
        self._w, self._store = native_writer, store
        self._columns = store._device_columns
        self._max = max_sequence_length

    def _rows(self, k: int):
        return host_to_device(self._w.recent_rows(k), self._columns.device)

    def append(self, step):
        """Appends one step: ``{field: value}`` (torch tensors on any device, numpy, scalars)."""
        _, words = _words(self._columns, step, lambda d: (), "append: ")
        self._w.append({INDEX_FIELD: np.zeros((), np.uint8)})
        self._columns.write(words, self._rows(1))

    def extend(self, steps):
        """Appends T steps: ``{field: [T, ...]}``."""
        (t,), words = _words(self._columns, steps, lambda d: _leading(self._columns, d, 1, "extend: "), "extend: ")
        if t == 0:
            return
        if self._max is not None and t > self._max:
            raise InvalidArgument(f"extend: {t} steps are more than the writer's max_sequence_length ({self._max})")
        self._w.extend({INDEX_FIELD: np.zeros(t, np.uint8)})
        self._columns.write(words, self._rows(t))

    def create_item(self, table, num_steps: int, priority: float, timeout: float | None = None):
        return self._w.create_item(table, num_steps, priority, timeout)

    def create_items(self, table, num_steps: int, priorities, timeout: float | None = None):
        return self._w.create_items(table, num_steps, priorities, timeout)

    def end_episode(self):
        self._w.end_episode()

    def flush(self, timeout: float | None = None):
        self._w.flush(timeout)

    @property
    def episode_steps(self) -> int:
        return self._w.episode_steps

    def close(self):
        self._w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def insert(table, data, priorities, timeout):
    """``Table.insert`` for a device store: n items of T steps, one kernel per field."""
    store = table.store
    columns = store._device_columns
    (n, t), words = _words(columns, data, lambda d: _leading(columns, d, 2, "insert: "), "insert: ")
    p = as_priorities(priorities, n)
    bad = np.flatnonzero(~np.isfinite(p) | (p < 0))
    if bad.size:
        i = int(bad[0])
        raise InvalidArgument(f"table '{table.name}' item {i}: priority must be finite and >= 0, got {p[i]}")
    if n == 0 or t == 0:
        raise InvalidArgument(f"insert: expected at least one item of at least one step, got [n, T] = [{n}, {t}]")
    # One writer per store for batch inserts: consecutive inserts fill its
    # current block instead of each leaving a partly used one behind.
    with store._insert_lock:
        if store._insert_writer is None:
            store._insert_writer = _native.Writer.in_process(store._native)
        w = store._insert_writer
        try:
            w.extend({INDEX_FIELD: np.zeros(n * t, np.uint8)})
            columns.write(words, host_to_device(w.recent_rows(n * t), columns.device))
            return w.create_tiled_items(table._native, t, p, timeout)
        finally:
            w.end_episode()

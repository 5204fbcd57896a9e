"""Collection: gathering the rows of a drawn sample into one device tensor per
field, ``[n, T, *shape]``, zero past each item's length.

The rows are read where they are (host shared memory registered with CUDA, or a
device store's GPU columns) by one gather kernel per field; nothing is staged on
the host. The draw's ``SampleRows`` keeps the rows from being reused by writers
until the kernels that read them have finished: a CUDA event is recorded after
them and a releaser thread lets the rows go once it has passed — so an item
evicted meanwhile never has its rows overwritten under a running gather. A table
drawn in process holds them by one pinned epoch (crates/core/src/blocks.rs): no
reference per item, and no block of the store freed while the gather runs is
reused before it has ended.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from ..sample import Sample
from .._attributes import arrays
from ._device import new_event, torch_module, use_stream

log = logging.getLogger("reprise")


class _Releaser:
    """Lets sampled rows go once the device work reading them has completed.

    Completed events are found by polling (``event.query()``, which never blocks):
    at every collect and from a sweeper thread that runs only while rows are held,
    a few times per millisecond. Nothing here ever waits on the GPU while holding
    the GIL, so the caller's thread is not slowed down."""

    SWEEP_SECONDS = 0.0005
    SWEEP_AT = 8  # a collect sweeps itself once this many samples are held

    def __init__(self):
        self._held: list = []
        self._lock = threading.Condition()
        self._thread = None

    def hold(self, event, rows):
        with self._lock:
            self._held.append((event, rows))
            if len(self._held) == 1:  # the sweeper may be waiting for work
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="reprise-release", daemon=True)
                    self._thread.start()
                self._lock.notify_all()
            many = len(self._held) > self.SWEEP_AT
        if many:
            self.sweep()

    def sweep(self) -> int:
        """Releases the rows whose gathers have completed; returns how many are still held."""
        with self._lock:
            if not self._held:
                return 0
            done, held = [], []
            for h in self._held:
                (done if h[0].query() else held).append(h)
            self._held = held
            left = len(held)
        for _, rows in done:
            rows.release()
        if done:
            with self._lock:
                self._lock.notify_all()
        return left

    def _run(self):
        while True:
            with self._lock:
                self._lock.wait_for(lambda: bool(self._held))
            time.sleep(self.SWEEP_SECONDS)
            self.sweep()

    def pending(self) -> int:
        with self._lock:
            return len(self._held)

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until every held sample was released; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.sweep():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(self.SWEEP_SECONDS)
        return True


RELEASER = _Releaser()


def release_after(rows, event, device):
    """Lets ``rows`` go once ``event`` has passed (at once on the CPU, where the
    work that read them has already run)."""
    if device.type == "cpu":
        rows.release()
    else:
        RELEASER.hold(event, rows)


def wait_released(timeout: float | None = None) -> bool:
    """Blocks until the rows of every GPU-collected sample are released."""
    return RELEASER.wait(timeout)


class _IndexStaging:
    """Pinned host buffers that row indices are written into (by the native
    sample, no temporary) and copied to the device from; a buffer is reused once
    the event recorded after the gather that read it has passed."""

    SLOTS = 8

    def __init__(self, device):
        self.device = device
        self._bufs = [None] * self.SLOTS
        self._events = [None] * self.SLOTS
        self._busy = [False] * self.SLOTS
        self._next = 0
        self._lock = threading.Lock()

    def take(self, need: int):
        """A free ``(slot, pinned int64 tensor of >= need entries)``; slot -1 is a
        one-off buffer (when every slot is in use by other threads)."""
        torch = torch_module()
        pinned = self.device.type == "cuda"
        with self._lock:
            k = self._next
            self._next = (k + 1) % self.SLOTS
            if self._busy[k]:
                k = -1
            else:
                self._busy[k] = True
        if k < 0:
            return -1, torch.empty(need, dtype=torch.int64, pin_memory=pinned)
        event = self._events[k]
        if event is not None:
            event.synchronize()
            self._events[k] = None
        buf = self._bufs[k]
        if buf is None or buf.numel() < need:
            buf = torch.empty(max(need, 1 << 14), dtype=torch.int64, pin_memory=pinned)
            self._bufs[k] = buf
        return k, buf

    def done(self, k: int, event):
        """Slot ``k`` may be reused once ``event`` has passed (None: at once)."""
        if k >= 0:
            self._events[k] = event
            self._busy[k] = False


_STAGING: dict = {}
_STAGING_LOCK = threading.Lock()


def _staging(device):
    s = _STAGING.get(device)
    if s is None:
        with _STAGING_LOCK:
            s = _STAGING.setdefault(device, _IndexStaging(device))
    return s


def gather(columns, names, idx, n: int, t: int, ragged: bool) -> dict:
    """``{field: [n, t, *shape] tensor}`` of the rows ``idx`` (device int64, n * t,
    -1 past an item's end when ``ragged``: zeros there), on the current stream: one
    launch per word width of the fields (``gather_kernels``) where that saves
    launches, else one ``index_select`` per field."""
    from . import gather_kernels  # here: importing Triton takes a while, and only the GPU path needs it
    if (len(names) > 1 or ragged) and gather_kernels.available(columns.device):
        try:
            words = gather_kernels.gather(columns, names, idx, n * t)
        except Exception as e:  # a Triton or driver version without what the kernel uses
            gather_kernels.ENABLED = False
            log.warning("reprise: the fused gather kernel failed on %s (%s: %s); gathering with index_select "
                        "instead", columns.device, type(e).__name__, e)
        else:
            return {name: columns.as_field(name, words[name], (n, t)) for name in names}
    torch = torch_module()
    mask = None
    if ragged:
        mask = (idx < 0).view(-1, 1)
        idx = idx.clamp(min=0)
    data = {}
    for name in names:
        words = torch.index_select(columns.views[name], 0, idx)
        if mask is not None:
            words.masked_fill_(mask, 0)
        data[name] = columns.as_field(name, words, (n, t))
    return data


def collect_rows(rows, columns, fields=None, stream=None, schema=None, packed: bool = False) -> Sample:
    """Gathers ``rows`` (a ``SampleRows``) from ``columns`` (``HostColumns`` or
    ``DeviceColumns``) into a ``Sample`` whose ``data`` holds device tensors, and
    whose ``attributes`` (by ``schema``, ``[(name, dtype)]``) are on that device too.
    ``packed``: the items' steps end to end, ``[total_steps, *shape]``, gathered
    straight into that layout (``packed_data``; no padded intermediate).

    Work is queued on ``stream`` (default: the current stream); the tensors are
    ready when that stream reaches this point. The rows are released once it has.
    """
    dev = columns.device
    names = columns.fields if fields is None else fields
    raw = rows.records() if schema else b""
    staging = _staging(dev)
    k = -1
    try:
        k, buf = staging.take(0)
        if packed:  # one row number per step, items end to end: a [1, total] gather
            *meta, total, filled = rows.packed_index(buf.numpy())
            if not filled:
                staging.done(k, None)
                k, buf = staging.take(total)
                *meta, total, filled = rows.packed_index(buf.numpy())
            n, t, ragged = 1, total, False
        else:
            *meta, n, t, ragged, filled = rows.index(buf.numpy())
            if not filled:  # longer items than the buffer holds: a bigger one
                staging.done(k, None)
                k, buf = staging.take(n * t)
                n, t, ragged = rows.fill_index(buf.numpy())
        context = use_stream(stream) if stream is not None else contextlib.nullcontext()
        with context:
            columns.wait_for_writes(stream)
            idx = buf[: n * t]
            if dev.type != "cpu":
                idx = idx.to(dev, non_blocking=True)
            data = gather(columns, names, idx, n, t, ragged)
            event = new_event(dev)
            event.record() if stream is None else event.record(stream)  # None: the current stream
        staging.done(k, event)
    except BaseException:
        staging.done(k, None)
        rows.release()
        raise
    release_after(rows, event, dev)
    keys, probabilities, priorities, times_sampled, table_size, lengths = meta
    torch = torch_module()
    attributes = {k: torch.from_numpy(v).to(dev) for k, v in arrays(schema, raw, len(keys)).items()}
    fields = dict(keys=keys, probabilities=probabilities, priorities=priorities, times_sampled=times_sampled,
                  table_size=int(table_size), lengths=lengths, attributes=attributes)
    if packed:
        return Sample._packed({name: v[0] for name, v in data.items()}, **fields)
    return Sample(**fields, data=data)

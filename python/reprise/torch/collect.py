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
from ._device import mapped_view, new_event, torch_module, use_stream

log = logging.getLogger("reprise")


class _Releaser:
    """Lets sampled rows go once the device work reading them has completed.

    Completed events are found by polling (``event.query()``, which never blocks):
    at every ``hold`` (the samples before it have usually completed by then) and
    from a sweeper thread, every half millisecond while rows are held and every few
    milliseconds otherwise; it ends after a while with nothing held and the next
    ``hold`` starts another. ``hold`` never wakes it: a wake per sample made the
    sweeper compete for the GIL with the thread that samples. Nothing here waits
    on the GPU while holding the GIL. The events of released samples are kept for
    reuse (``event``), so a sample creates no CUDA event."""

    SWEEP_SECONDS = 0.0005
    IDLE_SECONDS = 0.005  # the sweeper's pace with nothing held
    IDLE_EXIT = 2.0  # ... and how long it stays with nothing held
    SWEEP_AT = 8  # a hold sweeps the rest too once this many samples are held

    def __init__(self):
        self._held: list = []
        self._lock = threading.Condition()
        self._thread = None
        self._events: dict = {}  # device -> events of released samples, for reuse

    def event(self, dev):
        """An event to record after a sample's gathers (a released one's, or a new one)."""
        if dev.type == "cpu":
            return new_event(dev)
        with self._lock:
            free = self._events.get(dev)
            if free:
                return free.pop()
        return new_event(dev)

    def hold(self, event, rows, dev):
        with self._lock:
            first = bool(self._held) and self._held[0][0].query()
            self._held.append((event, rows, dev))
            many = len(self._held) > self.SWEEP_AT
            start = self._thread is None
            if start:
                self._thread = threading.Thread(target=self._run, name="reprise-release", daemon=True)
        if start:
            self._thread.start()
        if first or many:
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
        for _, rows, _ in done:
            rows.release()
        if done:
            with self._lock:
                for event, _, dev in done:
                    free = self._events.setdefault(dev, [])
                    if len(free) < 64:
                        free.append(event)
                self._lock.notify_all()
        return left

    def _run(self):
        idle = 0.0
        while True:
            pace = self.SWEEP_SECONDS if self.pending() else self.IDLE_SECONDS
            time.sleep(pace)
            if self.sweep():
                idle = 0.0
                continue
            idle += pace
            if idle >= self.IDLE_EXIT:
                with self._lock:
                    if not self._held:
                        self._thread = None
                        return
                idle = 0.0

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
        RELEASER.hold(event, rows, device)


def wait_released(timeout: float | None = None) -> bool:
    """Blocks until the rows of every GPU-collected sample are released."""
    return RELEASER.wait(timeout)


class _IndexStaging:
    """Pinned host buffers that row indices are written into (by the native
    sample, no temporary) and that the gathers read in place over the bus (no
    copy to the device before them: one CUDA call less a sample); a buffer is
    reused once the event recorded after the gather that read it has passed (the
    releaser may have recorded that event again for a later sample by then:
    waiting for it then waits for that one too, never for less)."""

    SLOTS = 8

    def __init__(self, device):
        self.device = device
        self._bufs = [None] * self.SLOTS  # (pinned int64 tensor, its view on the device)
        self._events = [None] * self.SLOTS
        self._busy = [False] * self.SLOTS
        self._next = 0
        self._lock = threading.Lock()

    def _new(self, need: int):
        torch = torch_module()
        host = torch.empty(need, dtype=torch.int64, pin_memory=self.device.type == "cuda")
        return host, mapped_view(host, self.device)

    def take(self, need: int):
        """A free ``(slot, pinned int64 tensor of >= need entries, its device view)``;
        slot -1 is a one-off buffer (when every slot is in use by other threads)."""
        with self._lock:
            k = self._next
            self._next = (k + 1) % self.SLOTS
            if self._busy[k]:
                k = -1
            else:
                self._busy[k] = True
        if k < 0:
            return (-1, *self._new(need))
        event = self._events[k]
        if event is not None:
            event.synchronize()
            self._events[k] = None
        buf = self._bufs[k]
        if buf is None or buf[0].numel() < need:
            buf = self._bufs[k] = self._new(max(need, 1 << 14))
        return (k, *buf)

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
        k, buf, on_dev = staging.take(0)
        if packed:  # one row number per step, items end to end: a [1, total] gather
            *meta, total, filled = rows.packed_index(buf.numpy())
            if not filled:
                staging.done(k, None)
                k, buf, on_dev = staging.take(total)
                *meta, total, filled = rows.packed_index(buf.numpy())
            n, t, ragged = 1, total, False
        else:
            *meta, n, t, ragged, filled = rows.index(buf.numpy())
            if not filled:  # longer items than the buffer holds: a bigger one
                staging.done(k, None)
                k, buf, on_dev = staging.take(n * t)
                n, t, ragged = rows.fill_index(buf.numpy())
        context = use_stream(stream) if stream is not None else contextlib.nullcontext()
        with context:
            columns.wait_for_writes(stream)
            data = gather(columns, names, on_dev[: n * t], n, t, ragged)
            event = RELEASER.event(dev)
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

"""Device-resident draws (``Table(..., selection_device="cuda")`` with a Uniform or
Prioritized sampler, no ``max_times_sampled``, and no extension that looks at each
draw).

The device keeps a mirror of everything a draw reads, per table slot: the item's
insertion sequence (-1: empty), key, priority, length, row windows (up to K row
ranges), times sampled, and a sum tree of sampling weights (ones for Uniform,
``p^a`` for Prioritized). A draw is:

1. one native call, ``admit``: the rate limiter admits the draws in bulk, and the
   table hands over the slots that changed since the last draw (O(changes)) with an
   epoch pinned under the same lock, so no block of an item present at that moment
   is reused before the epoch ends (crates/core/src/table/resident.rs);
2. the changes applied to the mirror in one batch;
3. the picks, keys, probabilities, priorities, lengths and times sampled computed
   from the mirror (two Triton kernels on CUDA, else torch operations) and copied
   to the host in one transfer;
4. the row numbers computed and the rows gathered; the epoch ends when the event
   recorded after the gathers has passed.

Nothing is done per drawn item on the host. Draws are counted per slot on the
device and credited to the table's ``times_sampled`` by :meth:`fold`, which the
table runs before anything reads them (``items()``, checkpoints).

The draw is linearised at the admission: it follows the table as it was then,
with the host selectors' distributions (Uniform: 1/size each; Prioritized:
``p^a / sum p^a``, uniform when every weight is zero). An item that leaves while
the kernels run may still be in the batch, exactly as if it had left just after.
"""

from __future__ import annotations

import logging
import threading
from typing import NamedTuple

import numpy as np

from ..sample import Sample
from . import resident_kernels as kernels
from ._device import current_stream, host_to_device, torch_module, use_stream
from .collect import RELEASER, gather, release_after
from .selection import sampling_weights, seeded_generator
from .sum_tree import SumTree


log = logging.getLogger("reprise")


class Admission(NamedTuple):
    """What the native ``Table.admit`` returns (crates/core/src/table/resident.rs)."""
    count: int
    table_size: int
    size: int
    positive: int
    dense: bool
    shortest: int
    longest: int
    rows: object      # a SampleRows of no items holding the epoch
    stopped: object   # the unraised error that cut the admission short, or None
    changes: tuple


class ResidentSelection:
    resident = True

    def __init__(self, native, kind: str, exponent: float, device, seed: int | None, max_size: int):
        torch = torch_module()
        self.native, self.kind, self.exponent, self.device = native, kind, float(exponent), device
        # Four Triton launches per draw instead of about forty torch operations.
        self.use_triton = kernels.triton is not None and device.type == "cuda"
        self.lock = threading.Lock()
        self.capacity, self.ranges = 0, 1
        i64 = dict(dtype=torch.int64, device=device)
        self.seq = torch.empty(0, **i64)
        self.key = torch.empty(0, **i64)
        self.priority = torch.empty(0, dtype=torch.float64, device=device)
        self.length = torch.empty(0, **i64)
        self.base = torch.empty(0, **i64)   # times sampled as the table last said
        self.delta = torch.empty(0, **i64)  # draws since, not yet credited to the table
        self.starts = torch.empty(0, 1, **i64)
        self.lens = torch.empty(0, 1, **i64)
        self.tree = SumTree(1, device)
        self.size = torch.zeros(1, **i64)  # the table size of the latest dense draw, read by the pick kernel
        self._size = 0
        self.graphs = kernels.DrawGraphs() if self.use_triton else None
        self._stream = None  # the stream of the latest graph replay
        self._grow(min(max_size, 1 << 16) + 1)
        self.generator = seeded_generator(device, seed)

    # ----- the mirror ---------------------------------------------------------

    def _grow(self, capacity: int, ranges: int = 1):
        torch = torch_module()
        if capacity <= self.capacity and ranges <= self.ranges:
            return
        new = max(capacity, 2 * self.capacity) if capacity > self.capacity else self.capacity
        k = max(ranges, self.ranges)
        old = self.capacity

        def grown(t, fill, shape=()):
            out = torch.full((new, *shape), fill, dtype=t.dtype, device=self.device)
            if t.dim() == 1:
                out[:old] = t
            else:
                out[:old, : t.shape[1]] = t
            return out

        self.seq = grown(self.seq, -1)
        self.key, self.length = grown(self.key, 0), grown(self.length, 0)
        self.base, self.delta = grown(self.base, 0), grown(self.delta, 0)
        self.priority = grown(self.priority, 0.0)
        self.starts, self.lens = grown(self.starts, 0, (k,)), grown(self.lens, 0, (k,))
        self.capacity, self.ranges = new, k
        if self.tree.capacity < new:
            self.tree = self.tree.grow(new)
        if self.graphs is not None:
            self.graphs.clear()  # they read the old buffers (the only place the mirror replaces them)

    def _apply(self, changes):
        """Applies ``admit``'s changes (see the native ``admit``)."""
        torch = torch_module()
        slots, seqs, keys, priorities, times, lengths, ranges, starts, range_lengths = changes
        if slots.size == 0:
            return
        self._grow(int(slots.max()) + 1, int(ranges.max()))
        k = self.ranges
        # One [7 + 2K, changes] array, one copy: slot, seq, key, priority bits, times
        # sampled, length, weight bits, then the windows as K row ranges each
        # (zero-length past an item's last).
        m = slots.size
        host = np.zeros((7 + 2 * k, m), np.int64)
        host[:7] = [slots, seqs, keys, priorities.view(np.int64), times, lengths,
                    sampling_weights(self.kind, self.exponent, seqs, priorities).view(np.int64)]
        at = np.zeros(m, np.int64)
        np.cumsum(ranges[:-1], out=at[1:])
        which = np.arange(range_lengths.size) - np.repeat(at, ranges)
        change = np.repeat(np.arange(m), ranges)
        host[7 + which, change] = starts
        host[7 + k + which, change] = range_lengths
        # Not waiting for the stream: a static sample's admit() must not stall
        # until the previous replay has run.
        dev = host_to_device(host, self.device)
        if kernels.available(self) and self._kernels(kernels.apply_changes, self, dev)[0]:
            return
        s, q = dev[0], dev[1]
        same = self.seq[s] == q  # a priority update keeps the slot's uncredited draws
        self.delta[s] = torch.where(same, self.delta[s], torch.zeros_like(q))
        self.seq[s], self.key[s] = q, dev[2]
        self.priority[s], self.base[s], self.length[s] = dev[3].view(torch.float64), dev[4], dev[5]
        self.starts[s], self.lens[s] = dev[7: 7 + k].T, dev[7 + k:].T
        self.tree.set(s, dev[6].view(torch.float64))

    def fold(self):
        """Credits the draws counted on the device to the table's times_sampled."""
        torch = torch_module()
        with self.lock:
            drawn = torch.nonzero(self.delta).flatten()
            if drawn.numel() == 0:
                return
            counts = self.delta[drawn]
            host = torch.stack([drawn, self.seq[drawn], counts]).cpu().numpy()
            self.native.credit_draws(host[0], host[1], host[2])
            self.base[drawn] += counts
            self.delta[drawn] = 0

    # ----- a draw -------------------------------------------------------------

    def admit(self, n: int, timeout, longest_allowed: int | None = None) -> Admission:
        """The native ``admit`` (under ``lock``)."""
        return Admission(*self.native.admit(n, timeout, longest_allowed))

    def draw(self, n: int, timeout, columns, names, stream=None) -> Sample:
        """Draws n items and gathers ``names`` from ``columns`` on the mirror's
        device, on ``stream`` (default: the current stream). On a timeout or an
        interrupt after some draws, the error's ``partial`` is their Sample."""
        with self.lock:
            a = self.admit(n, timeout)
            sample = self.draw_admitted(a, columns, names, stream)
        if a.stopped is not None:
            a.stopped.partial = sample
            raise a.stopped
        return sample

    def draw_admitted(self, a: Admission, columns, names, stream) -> Sample:
        """Draws and gathers the ``a.count`` draws of the admission ``a`` (under
        ``lock``); returns their Sample. Its rows are released in every case."""
        try:
            if stream is None:
                stream = current_stream(self.device)
            with use_stream(stream):
                columns.wait_for_writes(stream)
                slots, meta, idx = self.select(a, a.longest)
                # The metadata first, in one copy: waiting for it waits for the draw's
                # small kernels only, not for the gathers queued after it. (So every
                # kernel on the mirror has run when a draw returns, whatever stream
                # the next one uses.)
                meta = meta.cpu().numpy()
                t = a.longest if a.shortest == a.longest else int(meta[4].max())
                if idx is None:
                    idx = self.rows(slots, t)
                elif t != a.longest:
                    idx = idx[:, :t]
                data = gather(columns, names, idx.flatten().to(columns.device), a.count, t, a.shortest != a.longest)
                event = RELEASER.event(columns.device)
                event.record(stream)
        except BaseException:
            a.rows.release()
            raise
        release_after(a.rows, event, columns.device)
        return Sample(keys=meta[0].view(np.uint64), probabilities=meta[1].view(np.float64),
                      priorities=meta[2].view(np.float64), times_sampled=meta[3], table_size=int(a.table_size),
                      lengths=meta[4], data=data)

    def select(self, a: Admission, t: int):
        """Applies the admission's changes and draws its ``a.count`` items on the
        current stream: ``(slots, meta, idx)``, ``meta`` a device ``[5, n]`` int64 of keys,
        probability bits, priority bits, times sampled and lengths; ``idx`` the
        ``[n, t]`` row numbers (-1 past an item's end), or None when the torch
        operations drew or a window has several row ranges (``rows`` makes them).
        Runs under ``lock``, after ``admit``."""
        torch = torch_module()
        self._apply(a.changes)
        n = a.count
        uniform = self.kind == "Uniform" and a.dense  # the items fill slots 0..size
        zero = self.kind == "Prioritized" and a.positive == 0 and self.exponent != 0.0
        fused = kernels.available(self) and n <= kernels.MAX_BATCH and not zero
        graph = self.graphs.get(n, t, uniform) if fused and self.graphs is not None else None
        if graph is not None:
            self._after_previous_replay()
        u = graph.u if graph is not None else torch.empty(n, dtype=torch.float64, device=self.device)
        torch.rand(n, dtype=torch.float64, device=self.device, generator=self.generator, out=u)
        if fused:
            ok, drawn = self._kernels(self._fused_draw, graph, u, n, a.size, uniform, t)
            if ok:
                return drawn
        slots, probabilities = self._pick(u, a.size, uniform, zero)
        meta = torch.stack([self.key[slots], probabilities.view(torch.int64),
                            self.priority[slots].view(torch.int64), self._count(slots), self.length[slots]])
        return slots, meta, None

    def _after_previous_replay(self):
        """Makes the current stream wait for the work queued so far on the stream of
        the previous graph replay, when they differ: a graph's input and outputs are
        the same buffers at every replay, and the previous draw's gather may still
        be reading them there."""
        stream = torch_module().cuda.current_stream(self.device)
        if self._stream is not None and self._stream != stream:
            stream.wait_stream(self._stream)
        self._stream = stream

    def _fused_draw(self, graph, u, n: int, size: int, dense: bool, t: int):
        """``kernels.fused_draw``: the replay of its CUDA graph for this shape, or
        its launches (and then its graph captured for the next draw of the shape)."""
        if dense and size != self._size:
            self.size.fill_(size)
            self._size = size
        if graph is not None:
            return graph.replay()
        drawn = kernels.fused_draw(self, u, n, dense, t)
        if self.graphs is not None and self.graphs.enabled:
            try:
                self.graphs.capture(self, n, t, dense)
            except Exception as e:  # a torch, Triton or driver without what capturing needs
                self.graphs.disable()
                log.warning("reprise: capturing the device-resident draw in a CUDA graph failed on %s (%s: %s); "
                            "launching its kernels instead", self.device, type(e).__name__, e)
        return drawn

    def _kernels(self, fn, *args):
        """``(True, fn(*args))`` (one of the Triton kernels' steps), or ``(False,
        None)`` for good once the kernels fail on this device; torch operations do
        the work from then on. A failing step has changed nothing that they do not
        redo (applying changes is idempotent)."""
        try:
            return True, fn(*args)
        except Exception as e:  # a Triton or driver version without what the kernels use
            self.use_triton = self.tree.use_triton = False
            if self.graphs is not None:
                self.graphs.disable()
            log.warning("reprise: the device-resident draw kernels failed on %s (%s: %s); "
                        "drawing with torch operations instead", self.device, type(e).__name__, e)
            return False, None

    def _pick(self, u, size: int, uniform: bool, zero: bool):
        """The slots the uniform numbers ``u`` draw, and each draw's probability.
        ``uniform``: a Uniform table whose items fill slots 0..size; ``zero``: a
        Prioritized table whose weights are all zero (uniform over its items)."""
        torch = torch_module()
        n = u.numel()
        if uniform:
            slots = (u * size).to(torch.int64).clamp_(max=size - 1)
            return slots, torch.full((n,), 1.0 / size, dtype=torch.float64, device=self.device)
        if zero:
            present = torch.nonzero(self.seq >= 0).flatten()
            slots = present[(u * present.numel()).to(torch.int64).clamp_(max=present.numel() - 1)]
            return slots, torch.full((n,), 1.0 / size, dtype=torch.float64, device=self.device)
        total = self.tree.total()
        slots = self.tree.find(u * total)
        return slots, self.tree.get(slots) / total

    def rows(self, slots, t: int):
        """``[n, t]`` row numbers of the picked items' steps; -1 past an item's end."""
        torch = torch_module()
        lengths = self.length[slots]
        step = torch.arange(t, device=self.device)
        if self.ranges == 1:
            idx = self.starts[slots, :1] + step
        else:
            starts, lens = self.starts[slots], self.lens[slots]
            ends = torch.cumsum(lens, dim=1)
            which = torch.searchsorted(ends, step.expand(slots.numel(), t).contiguous(), right=True)
            which = which.clamp(max=self.ranges - 1)
            idx = starts.gather(1, which) + step - (ends - lens).gather(1, which)
        return torch.where(step < lengths[:, None], idx, torch.full_like(idx, -1))

    def _count(self, slots):
        """Counts the draws in the mirror; each draw's times sampled (its item's
        count including this draw, so an item drawn twice in a batch says k, k+1)."""
        torch = torch_module()
        n = slots.numel()
        order = torch.sort(slots, stable=True).indices
        ordered = slots[order]
        position = torch.arange(n, device=self.device)
        first = torch.ones(n, dtype=torch.bool, device=self.device)
        first[1:] = ordered[1:] != ordered[:-1]
        run_start = torch.cummax(torch.where(first, position, torch.zeros_like(position)), 0).values
        rank = torch.empty_like(position)
        rank[order] = position - run_start + 1
        times = self.base[slots] + self.delta[slots] + rank
        self.delta.index_add_(0, slots, torch.ones_like(slots))
        return times

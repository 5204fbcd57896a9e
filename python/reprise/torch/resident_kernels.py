"""Triton kernels for a device-resident draw (``reprise.torch.resident``): the same
arithmetic as its torch operations, a draw in two launches instead of about thirty.

* ``pick``: for each of n uniform numbers ``u`` in [0, 1), the slot (a random slot
  below ``size`` when the items fill slots ``0..size``; else a descent of the sum
  tree for ``u * total``), the draw's probability, and the slot's times sampled so
  far (the table's count plus the mirror's uncredited draws);
* ``describe``: each draw's rank among the draws of its slot in this batch (an item
  drawn twice says k+1, then k+2, in batch order), its times sampled, the mirror's
  count (atomic adds), the metadata row (key, probability bits, priority bits,
  times sampled, length), and the ``[n, T]`` row numbers (-1 past an item's end) of
  items with one row range.

A third, ``apply``, writes the changes an admission hands over into the mirror
(the sum tree's leaves and parents are ``SumTree.set``'s one launch).

The rank compares every pair of draws of the batch, so ``describe`` serves batches
of up to ``MAX_BATCH``; larger batches, windows of several row ranges, and tables
whose weights are all zero take the torch operations. Both paths give the same
numbers for the same ``u`` (tests/test_resident.py runs the kernels under
``TRITON_INTERPRET=1`` on the CPU and compares).
"""

from __future__ import annotations

from ._device import torch_module

try:  # Triton is optional: the gpu extra installs it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

MAX_BATCH = 4096
BLOCK = 64

if triton is not None:
    from .sum_tree import descend

    @triton.jit
    def _pick_kernel(u_ptr, tree_ptr, base_ptr, delta_ptr, slot_ptr, prev_ptr, meta_ptr, n, size_ptr, capacity,
                     dense: tl.constexpr, levels: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = offs < n
        u = tl.load(u_ptr + offs, mask=live, other=0.0)
        if dense:
            size = tl.load(size_ptr)  # read on the device: a CUDA graph of the draw replays for any size
            slot = tl.minimum((u * size).to(tl.int64), size - 1)
            prob = tl.full((BLOCK,), 1.0, tl.float64) / size
        else:
            total = tl.load(tree_ptr + 1)
            node = descend(tree_ptr, u * total, live, levels, BLOCK)
            slot = node - capacity
            prob = tl.load(tree_ptr + node, mask=live, other=0.0) / total
        prev = tl.load(base_ptr + slot, mask=live, other=0) + tl.load(delta_ptr + slot, mask=live, other=0)
        tl.store(slot_ptr + offs, slot, mask=live)
        tl.store(prev_ptr + offs, prev, mask=live)
        tl.store(meta_ptr + n + offs, prob.to(tl.int64, bitcast=True), mask=live)

    @triton.jit
    def _describe_kernel(slot_ptr, prev_ptr, key_ptr, prio_ptr, len_ptr, start_ptr, delta_ptr, meta_ptr, idx_ptr,
                         n, T, start_stride, rows: tl.constexpr, BLOCK: tl.constexpr, TB: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        live = offs < n
        slot = tl.load(slot_ptr + offs, mask=live, other=-1)
        # Rank: the draws of the same slot at or before this one in the batch.
        rank = tl.zeros((BLOCK,), tl.int64)
        for j0 in range(0, (pid + 1) * BLOCK, BLOCK):
            other_offs = j0 + tl.arange(0, BLOCK)
            other = tl.load(slot_ptr + other_offs, mask=other_offs < n, other=-2)
            same = (slot[:, None] == other[None, :]) & (other_offs[None, :] <= offs[:, None])
            rank += tl.sum(same.to(tl.int64), axis=1)
        times = tl.load(prev_ptr + offs, mask=live, other=0) + rank
        tl.atomic_add(delta_ptr + slot, tl.full((BLOCK,), 1, tl.int64), mask=live)
        length = tl.load(len_ptr + slot, mask=live, other=0)
        tl.store(meta_ptr + offs, tl.load(key_ptr + slot, mask=live, other=0), mask=live)
        prio = tl.load(prio_ptr + slot, mask=live, other=0.0)
        tl.store(meta_ptr + 2 * n + offs, prio.to(tl.int64, bitcast=True), mask=live)
        tl.store(meta_ptr + 3 * n + offs, times, mask=live)
        tl.store(meta_ptr + 4 * n + offs, length, mask=live)
        if rows:
            step = tl.arange(0, TB)
            start = tl.load(start_ptr + slot * start_stride, mask=live, other=0)
            row = start[:, None] + step[None, :]
            row = tl.where(step[None, :] < length[:, None], row, -1)
            tl.store(idx_ptr + offs[:, None] * T + step[None, :], row, mask=live[:, None] & (step[None, :] < T))


    @triton.jit
    def _apply_kernel(change_ptr, m, K, seq_ptr, key_ptr, prio_ptr, base_ptr, len_ptr, delta_ptr, starts_ptr,
                      lens_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = offs < m
        slot = tl.load(change_ptr + offs, mask=live, other=0)
        seq = tl.load(change_ptr + m + offs, mask=live, other=-1)
        # A priority update (same item) keeps the slot's uncredited draws.
        same = tl.load(seq_ptr + slot, mask=live, other=-1) == seq
        delta = tl.load(delta_ptr + slot, mask=live, other=0)
        tl.store(delta_ptr + slot, tl.where(same, delta, 0), mask=live)
        tl.store(seq_ptr + slot, seq, mask=live)
        tl.store(key_ptr + slot, tl.load(change_ptr + 2 * m + offs, mask=live, other=0), mask=live)
        prio = tl.load(change_ptr + 3 * m + offs, mask=live, other=0).to(tl.float64, bitcast=True)
        tl.store(prio_ptr + slot, prio, mask=live)
        tl.store(base_ptr + slot, tl.load(change_ptr + 4 * m + offs, mask=live, other=0), mask=live)
        tl.store(len_ptr + slot, tl.load(change_ptr + 5 * m + offs, mask=live, other=0), mask=live)
        for j in range(K):
            tl.store(starts_ptr + slot * K + j, tl.load(change_ptr + (7 + j) * m + offs, mask=live, other=0),
                     mask=live)
            tl.store(lens_ptr + slot * K + j, tl.load(change_ptr + (7 + K + j) * m + offs, mask=live, other=0),
                     mask=live)


def apply_changes(sel, changes):
    """Writes ``changes`` (a device ``[7 + 2K, m]`` int64: slot, seq, key, priority
    bits, times sampled, length, weight bits, K range starts, K range lengths) into
    the mirror ``sel``, and the weights into its sum tree: two launches (more when
    over ``SumTree.ONE_LAUNCH`` slots changed)."""
    m = changes.shape[1]
    _apply_kernel[(triton.cdiv(m, 256),)](changes, m, sel.ranges, sel.seq, sel.key, sel.priority, sel.base,
                                          sel.length, sel.delta, sel.starts, sel.lens, BLOCK=256)
    sel.tree.set(changes[0], changes[6].view(sel.tree.tree.dtype))


def available(sel) -> bool:
    """Whether ``sel`` (a ``ResidentSelection``) draws with these kernels."""
    return triton is not None and sel.use_triton


def fused_draw(sel, u, n: int, dense: bool, t: int):
    """``(slots, meta [5, n] int64, idx [n, t] int64 or None)`` for the uniform
    numbers ``u`` (the table size of a dense draw is ``sel.size``, on the device);
    ``idx`` is None when a window has several row ranges."""
    torch = torch_module()
    dev = sel.device
    slots = torch.empty(n, dtype=torch.int64, device=dev)
    prev = torch.empty(n, dtype=torch.int64, device=dev)
    meta = torch.empty((5, n), dtype=torch.int64, device=dev)
    rows = sel.ranges == 1
    idx = torch.empty((n, t), dtype=torch.int64, device=dev) if rows else slots
    grid = (triton.cdiv(n, BLOCK),)
    tree = sel.tree
    _pick_kernel[grid](u, tree.tree, sel.base, sel.delta, slots, prev, meta, n, sel.size, tree.capacity,
                       dense=dense, levels=tree.levels, BLOCK=BLOCK, enable_fp_fusion=False)
    _describe_kernel[grid](slots, prev, sel.key, sel.priority, sel.length, sel.starts, sel.delta, meta, idx,
                           n, t, sel.starts.stride(0), rows=rows, BLOCK=BLOCK, TB=triton.next_power_of_2(max(t, 1)))
    return slots, meta, (idx if rows else None)


class DrawGraphs:
    """CUDA graphs of ``fused_draw``, one per batch, steps, dense flag and mirror
    layout: after the first draw of a shape (launched, then captured), a draw is one
    graph replay instead of two Triton launches, each of which costs tens of
    microseconds of Python on the host. The graph reads its uniform numbers from
    ``u`` (filled before each replay) and writes into fixed outputs, which a draw's
    caller copies or reads before the next draw (under the selection's lock).

    A graph reads the mirror's buffers where they were at its capture: the mirror
    replaces them only when it grows, and then clears its graphs (``clear``).

    A capture that fails (a Triton, driver or torch without what it needs) turns
    the graphs off for good (``disable``), with one warning: the draws go on with
    launches."""

    MAX = 8  # shapes kept per selection

    def __init__(self):
        self.enabled = True
        self._graphs: dict = {}

    def get(self, n: int, t: int, dense: bool):
        """The graph for this draw's shape, or None (not captured yet, or graphs off)."""
        return self._graphs.get((n, t, dense)) if self.enabled else None

    def capture(self, sel, n: int, t: int, dense: bool):
        """Captures ``fused_draw`` for this shape (after a launched draw of the same
        shape compiled its kernels). Nothing runs: capturing only records."""
        torch = torch_module()
        if len(self._graphs) >= self.MAX:
            self._graphs.clear()
        graph = _Graph()
        graph.u = torch.empty(n, dtype=torch.float64, device=sel.device)
        graph.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph.graph, capture_error_mode="thread_local"):
            graph.out = fused_draw(sel, graph.u, n, dense, t)
        self._graphs[(n, t, dense)] = graph

    def clear(self):
        self._graphs.clear()

    def disable(self):
        self.enabled = False
        self._graphs.clear()


class _Graph:
    """One captured draw: ``u`` its input, ``out`` its ``(slots, meta, idx)``."""

    u = graph = out = None

    def replay(self):
        self.graph.replay()
        return self.out

"""A sum tree on the device: f64 weights of ``capacity`` slots in an implicit
binary tree (node 1 the root, node i's children 2i and 2i+1, leaves at
``capacity + slot``), so that a batch of B weighted draws and a batch of B weight
updates each cost O(B log N) work and log N tiny, parallel steps.

Updates recompute every touched parent from its two children, level by level, so
no rounding error accumulates (the host sum tree does the same). On CUDA both
operations are Triton kernels (one launch per draw batch, one per tree level per
update batch of more than ``ONE_LAUNCH`` slots, one launch for smaller ones);
elsewhere, and without Triton, the same arithmetic in torch ops.
"""

from __future__ import annotations

from ._device import torch_module

try:  # Triton is optional: the gpu extra installs it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

if triton is not None:

    @triton.jit
    def descend(tree_ptr, u, live, levels: tl.constexpr, BLOCK: tl.constexpr):
        """The leaf node (capacity + slot) whose prefix-sum interval holds each
        target ``u``; zero-weight subtrees are never entered while a sibling has weight."""
        node = tl.full((BLOCK,), 1, tl.int64)
        for _ in range(levels):
            left = tl.load(tree_ptr + 2 * node, mask=live, other=0.0)
            right = tl.load(tree_ptr + 2 * node + 1, mask=live, other=0.0)
            go_left = ((u < left) | (right <= 0.0)) & (left > 0.0)
            u = tl.where(go_left, u, u - left)
            node = tl.where(go_left, 2 * node, 2 * node + 1)
        return node

    @triton.jit
    def _descend_kernel(tree_ptr, u_ptr, out_ptr, n, capacity, levels: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        live = offs < n
        u = tl.load(u_ptr + offs, mask=live, other=0.0)
        node = descend(tree_ptr, u, live, levels, BLOCK)
        tl.store(out_ptr + offs, node - capacity, mask=live)

    @triton.jit
    def _level_kernel(tree_ptr, leaf_ptr, n, shift, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        live = offs < n
        leaf = tl.load(leaf_ptr + offs, mask=live, other=2)
        parent = leaf >> shift
        s = tl.load(tree_ptr + 2 * parent, mask=live, other=0.0) + tl.load(tree_ptr + 2 * parent + 1, mask=live, other=0.0)
        tl.store(tree_ptr + parent, s, mask=live)


    @triton.jit
    def _set_small_kernel(tree_ptr, slot_ptr, weight_ptr, n, capacity, levels: tl.constexpr, BLOCK: tl.constexpr):
        """One program: the leaves, then every level's parents, a barrier between
        levels (the writes of a level are seen by the whole program after it)."""
        for c in range(0, n, BLOCK):
            offs = c + tl.arange(0, BLOCK)
            live = offs < n
            leaf = tl.load(slot_ptr + offs, mask=live, other=0) + capacity
            tl.store(tree_ptr + leaf, tl.load(weight_ptr + offs, mask=live, other=0.0), mask=live)
        tl.debug_barrier()
        for level in range(1, levels + 1):
            for c in range(0, n, BLOCK):
                offs = c + tl.arange(0, BLOCK)
                live = offs < n
                parent = (tl.load(slot_ptr + offs, mask=live, other=0) + capacity) >> level
                s = tl.load(tree_ptr + 2 * parent, mask=live, other=0.0) + tl.load(tree_ptr + 2 * parent + 1,
                                                                                     mask=live, other=0.0)
                tl.store(tree_ptr + parent, s, mask=live)
            tl.debug_barrier()


class SumTree:
    # Updates of up to this many slots are one launch of one program (every level
    # in it: log N dependent steps of ONE_LAUNCH / 1024 chunks on one SM); larger
    # ones one parallel launch per level. Not tuned on a GPU yet.
    ONE_LAUNCH = 2048

    def __init__(self, capacity: int, device, use_triton: bool | None = None):
        torch = torch_module()
        cap = 1
        while cap < max(capacity, 2):
            cap *= 2
        self.capacity, self.levels, self.device = cap, cap.bit_length() - 1, device
        self.tree = torch.zeros(2 * cap, dtype=torch.float64, device=device)
        if use_triton is None:
            use_triton = triton is not None and device.type == "cuda"
        self.use_triton = use_triton

    def total(self):
        """The sum of all weights, as a 0-d device tensor."""
        return self.tree[1]

    def get(self, slots):
        return self.tree[self.capacity + slots]

    def set(self, slots, weights):
        """Sets the weights of distinct ``slots`` (device int64) and their ancestors."""
        if slots.numel() == 0:
            return
        if self.use_triton and slots.numel() <= self.ONE_LAUNCH:
            _set_small_kernel[(1,)](self.tree, slots.contiguous(), weights.to(self.tree.dtype).contiguous(),
                                    slots.numel(), self.capacity, levels=self.levels, BLOCK=1024, num_warps=8)
            return
        leaves = slots + self.capacity
        self.tree[leaves] = weights.to(self.tree.dtype)
        if self.use_triton:
            n, block = leaves.numel(), 256
            grid = (triton.cdiv(n, block),)
            for level in range(1, self.levels + 1):
                _level_kernel[grid](self.tree, leaves, n, level, BLOCK=block)
        else:
            parents = leaves
            for _ in range(self.levels):
                parents = parents // 2
                self.tree[parents] = self.tree[2 * parents] + self.tree[2 * parents + 1]

    def find(self, u):
        """Slots whose prefix-sum interval holds each target in ``u`` (f64, each in
        [0, total)). Zero-weight slots are never returned while the total is > 0."""
        torch = torch_module()
        n = u.numel()
        if self.use_triton:
            out = torch.empty(n, dtype=torch.int64, device=self.device)
            block = 256
            _descend_kernel[(triton.cdiv(n, block),)](self.tree, u, out, n, self.capacity, levels=self.levels, BLOCK=block)
            return out
        node = torch.ones(n, dtype=torch.int64, device=self.device)
        u = u.clone()
        for _ in range(self.levels):
            left = self.tree[2 * node]
            right = self.tree[2 * node + 1]
            go_left = ((u < left) | (right <= 0)) & (left > 0)
            u = torch.where(go_left, u, u - left)
            node = torch.where(go_left, 2 * node, 2 * node + 1)
        return node - self.capacity

    def grow(self, capacity: int) -> "SumTree":
        """A tree of at least ``capacity`` slots holding the same weights."""
        torch = torch_module()
        bigger = SumTree(capacity, self.device, self.use_triton)
        slots = torch.arange(self.capacity, device=self.device)
        bigger.set(slots, self.tree[self.capacity:])
        return bigger

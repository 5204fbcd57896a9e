"""The Triton sum-tree kernels (``reprise.torch.sum_tree``) against the torch ops
they replace, on trees whose expected answers are also known from numpy.

Everywhere: the kernels run through Triton's CPU interpreter (``TRITON_INTERPRET=1``)
on CPU tensors. The variable is read when a kernel is decorated, so these checks run
in a child process that sets it before importing anything (this pytest process, and
the other tests in it, keep compiled kernels). With CUDA: the same checks, compiled.
Run this file as a script to do the checks in the current process.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="the sum-tree kernels are Triton kernels: pip install triton (torch pulls it on Linux)")

from reprise.torch.sum_tree import SumTree  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def pair(capacity, device):
    """A tree that runs the Triton kernels and one that runs the torch ops."""
    return SumTree(capacity, device, use_triton=True), SumTree(capacity, device, use_triton=False)


def check_updates_match_the_torch_tree(device):
    """Parents recomputed level by level: batches larger than a kernel block (1024),
    partial updates, zeros, a capacity that is not a power of two, updates of more
    slots than one program takes, and growth."""
    g = np.random.default_rng(0)
    tri, ref = pair(1000, device)
    w = g.random(1000)
    w[g.random(1000) < 0.3] = 0
    for tree in (tri, ref):
        tree.set(torch.arange(1000, device=device), torch.as_tensor(w, device=device))
    assert torch.equal(tri.tree, ref.tree)
    assert float(tri.total()) == pytest.approx(w.sum(), rel=1e-12)
    for n in (1, 7, 300):
        idx = g.choice(1000, n, replace=False)
        w[idx] = np.where(g.random(n) < 0.2, 0.0, g.random(n) * 10)
        for tree in (tri, ref):
            tree.set(torch.as_tensor(idx, device=device), torch.as_tensor(w[idx], device=device))
        assert torch.equal(tri.tree, ref.tree), f"after an update of {n} slots"
        assert float(tri.total()) == pytest.approx(w.sum(), rel=1e-12)
    # More than ONE_LAUNCH slots: one launch per level instead of one program for all.
    wide_tri, wide_ref = pair(3 * SumTree.ONE_LAUNCH, device)
    idx = torch.as_tensor(g.choice(3 * SumTree.ONE_LAUNCH, SumTree.ONE_LAUNCH + 100, replace=False), device=device)
    v = torch.as_tensor(g.random(SumTree.ONE_LAUNCH + 100), device=device)
    for tree in (wide_tri, wide_ref):
        tree.set(idx, v)
    assert torch.equal(wide_tri.tree, wide_ref.tree)
    big_tri, big_ref = tri.grow(3000), ref.grow(3000)
    assert big_tri.use_triton and big_tri.capacity == 4096
    assert torch.equal(big_tri.tree, big_ref.tree)
    for cap in (1, 2, 3):  # one-level and two-level trees
        small_tri, small_ref = pair(cap, device)
        v = torch.arange(1, cap + 1, dtype=torch.float64, device=device)
        for tree in (small_tri, small_ref):
            tree.set(torch.arange(cap, device=device), v)
        assert torch.equal(small_tri.tree, small_ref.tree), f"capacity {cap}"
        assert float(small_tri.total()) == cap * (cap + 1) / 2


def check_draws_match_the_torch_descent(device):
    """Every target lands in the slot whose prefix-sum interval holds it; zero-weight
    slots (leading, trailing, runs) are never returned; targets on the boundaries of
    intervals go right, as ``searchsorted(side="right")`` does."""
    g = np.random.default_rng(1)
    tri, ref = pair(1000, device)
    w = g.random(1000)
    w[g.random(1000) < 0.3] = 0
    w[:5] = 0
    w[990:] = 0
    w[400:450] = 0
    for tree in (tri, ref):
        tree.set(torch.arange(1000, device=device), torch.as_tensor(w, device=device))
    cum = np.cumsum(w)
    total = float(tri.total())
    edges = np.concatenate([[0.0], cum[w > 0][:-1], [np.nextafter(total, 0)]])
    u_host = np.concatenate([g.random(3000) * total, edges])
    u = torch.as_tensor(u_host, device=device)
    got = tri.find(u)
    assert got.dtype == torch.int64 and got.shape == u.shape
    want = ref.find(u)
    bad = (got != want).nonzero().flatten()[:5].tolist()
    assert not bad, f"kernel and torch descents differ at targets {bad}: {got[bad].tolist()} != {want[bad].tolist()}"
    got = got.cpu().numpy()
    assert (w[got] > 0).all(), "a zero-weight slot was drawn"
    # Away from interval edges (where the tree's and cumsum's roundings may differ by an ulp), exactly searchsorted.
    far = np.min(np.abs(u_host[:, None] - np.concatenate([[0.0], cum])[None, :]), axis=1) > 1e-9 * total
    np.testing.assert_array_equal(got[far], np.searchsorted(cum, u_host[far], side="right"))
    # One drawable slot: every target finds it.
    one_tri, one_ref = pair(64, device)
    for tree in (one_tri, one_ref):
        tree.set(torch.tensor([37], device=device), torch.tensor([2.5], dtype=torch.float64, device=device))
    u = torch.as_tensor(g.random(500) * 2.5, device=device)
    assert set(one_tri.find(u).cpu().tolist()) == {37}
    assert torch.equal(one_tri.find(u), one_ref.find(u))


CHECKS = (check_updates_match_the_torch_tree, check_draws_match_the_torch_descent)


def test_kernels_under_the_triton_interpreter_match_the_torch_ops():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if proc.stdout.startswith("SKIP "):  # the interpreter's limit, not the kernels' (tests/triton_probe.py)
        pytest.skip(proc.stdout[5:].strip())
    for check in CHECKS:
        assert f"ok {check.__name__} (interpreted)" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: the compiled kernels need one (the interpreter test above runs them on the CPU)")
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_compiled_kernels_match_the_torch_ops(check):
    check(torch.device("cuda"))


def main():
    from reprise.torch import sum_tree
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if interpreted:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from triton_probe import interpreter_problem
        problem = interpreter_problem()
        if problem:
            print(f"SKIP {problem}")
            return  # the interpreter really is in use: the kernels were not compiled
        for kernel in (sum_tree._descend_kernel, sum_tree._level_kernel, sum_tree._set_small_kernel):
            assert type(kernel).__name__ == "InterpretedFunction", type(kernel)
    device = torch.device("cpu" if interpreted else "cuda")
    print(f"kernels from {sum_tree.__file__}", flush=True)
    for check in CHECKS:
        check(device)
        print(f"ok {check.__name__} ({'interpreted' if interpreted else 'compiled'})", flush=True)


if __name__ == "__main__":
    main()

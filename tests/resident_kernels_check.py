"""Run by tests/test_resident.py under TRITON_INTERPRET=1: the Triton kernels of a
device-resident draw (run by Triton's interpreter on the CPU) against the torch
operations, on twin tables with the same seed. Prints OK or raises."""

import numpy as np

import reprise as rp
from reprise.torch import emulate_cuda
from reprise.torch import resident_kernels as kernels


def twin(name, sampler, fused):
    store = rp.Store({"x": rp.Field((2,), "int64")}, capacity=512, block_steps=4)
    t = rp.Table(name, store, sampler=sampler, selection_device="cuda", seed=7, max_size=100)
    t._selection.use_triton = fused
    return store, t


def fill(store, t, lengths, interleave):
    with store.writer() as a, store.writer() as b:
        for i in range(12):
            a.append({"x": np.array([i, -i])})
            if interleave:  # the two writers take turns at blocks: windows of several row ranges
                b.append({"x": np.array([100 + i, 0])})
            for n in lengths:
                if i + 1 >= n:
                    a.create_item(t, n, float(1 + (i + n) % 4))


def main():
    emulate_cuda(True)
    assert kernels.triton is not None
    real, calls = kernels.fused_draw, []

    def counted(*args):
        calls.append(args[2])
        return real(*args)
    kernels.fused_draw = counted
    cases = [("u", rp.selectors.Uniform(), (1,), False), ("p", rp.selectors.Prioritized(0.7), (1, 3, 2), False),
             ("w", rp.selectors.Uniform(), (5, 3), True), ("d", rp.selectors.Prioritized(1.0), (2,), False)]
    for name, sampler, lengths, interleave in cases:
        pair = [twin(name, sampler, fused) for fused in (False, True)]
        for store, t in pair:
            fill(store, t, lengths, interleave)
        for step, n in enumerate((64, 300, kernels.MAX_BATCH + 10, 7)):
            if step == 2:  # a hole: Uniform draws by the sum tree from now on
                for _, t in pair:
                    t.delete([t.items()[1][0]])
            a, b = (t.sample(n, device="cuda") for _, t in pair)
            for k in ("keys", "probabilities", "priorities", "times_sampled", "lengths"):
                np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=f"{name} {n} {k}")
            np.testing.assert_array_equal(a.data["x"].numpy(), b.data["x"].numpy(), err_msg=f"{name} {n} data")
        assert pair[0][1].items() == pair[1][1].items(), name
        for store, _ in pair:
            store.close()
    # Every batch up to MAX_BATCH went through the kernels (4 cases x 3 batches).
    assert len(calls) == 12 and max(calls) <= kernels.MAX_BATCH, calls
    print("OK")


if __name__ == "__main__":
    main()

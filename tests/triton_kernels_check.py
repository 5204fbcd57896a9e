"""Run by tests/test_resident.py: the Triton kernels of the GPU path (under
TRITON_INTERPRET=1 run by Triton's interpreter on the CPU; else compiled, on a GPU)
against the torch operations:
a device-resident draw's on twin tables with the same seed (also through a static
sample), and the fused gather's against ``index_select``. Prints OK, or SKIP and why
(an interpreter that cannot run them: tests/triton_probe.py), or raises."""

import numpy as np
import torch

import reprise as rp
from reprise.torch import collect, emulate_cuda, gather_kernels, resident
from reprise.torch import resident_kernels as kernels


def twin(name, sampler, fused):
    store = rp.Store({"x": rp.Field((2,), "int64")}, capacity=512, block_steps=4)
    t = rp.Table(name, store, sampler=sampler, selection_device="cuda", seed=7, max_size=100)
    t._selection.use_triton = t._selection.tree.use_triton = fused
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


def check_draws():
    assert kernels.triton is not None
    real, calls, replays = resident.ResidentSelection._fused_draw, [], []

    def counted(self, graph, u, n, *rest):
        calls.append(n)
        replays.append(graph is not None)
        return real(self, graph, u, n, *rest)
    resident.ResidentSelection._fused_draw = counted
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
            for again in range(2):  # on a GPU the second draw of a shape replays its CUDA graph
                a, b = (t.sample(n, device="cuda") for _, t in pair)
                for k in ("keys", "probabilities", "priorities", "times_sampled", "lengths"):
                    np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=f"{name} {n} {again} {k}")
                np.testing.assert_array_equal(a.data["x"].cpu().numpy(), b.data["x"].cpu().numpy(),
                                              err_msg=f"{name} {n} {again} data")
        # Drawn items leave (their draws not yet credited) and new ones take their
        # slots: the new items' counts start at zero.
        drawn = [int(k) for k in np.unique(a.keys)[:3]]
        for store, t in pair:
            t.delete(drawn)
            with store.writer() as w:
                for i in range(3):
                    w.append({"x": np.array([50 + i, 0])})
                    w.create_item(t, 1, 2.0)
        a, b = (t.sample(200, device="cuda") for _, t in pair)
        np.testing.assert_array_equal(a.times_sampled, b.times_sampled, err_msg=f"{name} reused slots")
        assert pair[0][1].items() == pair[1][1].items(), name
        for store, _ in pair:
            store.close()
    # Every batch up to MAX_BATCH went through the kernels (4 cases x (3 batches x 2 + 1)),
    # on a GPU half of the repeated ones as graph replays.
    assert len(calls) == 28 and max(calls) <= kernels.MAX_BATCH, calls
    if DEVICE.type == "cuda":
        assert sum(replays) >= 8, replays
    resident.ResidentSelection._fused_draw = real


# Every word width (int64, int32, int16, uint8 words), rows narrower and wider than
# one step of the kernel's loop over a row's words (512).
FIELDS = {"obs": rp.Field((3, 700), "float32"), "action": rp.Field((3,), "int64"), "done": rp.Field((), "bool"),
          "code": rp.Field((5,), "int16"), "reward": rp.Field((), "float32"), "value": rp.Field((2,), "float64")}


DEVICE = torch.device("cpu")  # where "cuda" runs: the CPU when emulated (see main)


def check_gather():
    """The fused gather gives index_select's rows (zeros for -1), for host
    columns and a device store's, ragged or not, every field or a subset, and is
    what a sample uses."""
    rng = np.random.default_rng(5)
    for device in (None, "cuda"):
        store = rp.Store(FIELDS, capacity=256, block_steps=8, device=device)
        with store.writer() as w:
            for i in range(40):
                w.append({name: rng.integers(-100, 100, size=f.shape).astype(f.dtype) for name, f in FIELDS.items()})
        columns = store._columns_for(DEVICE)
        for names in (list(FIELDS), ["reward", "obs"], ["done", "code", "value"]):
            for n, t, ragged in ((1, 1, False), (37, 3, True), (200, 2, True), (64, 1, False)):
                idx = torch.from_numpy(rng.integers(0, 40, size=n * t))
                if ragged:
                    idx[torch.from_numpy(rng.random(n * t) < 0.3)] = -1
                idx = idx.to(DEVICE)
                results = []
                for enabled in (False, True):
                    gather_kernels.ENABLED = enabled
                    results.append(collect.gather(columns, names, idx.clone(), n, t, ragged))
                assert list(results[1]) == names
                for name in names:
                    a, b = results[0][name], results[1][name]
                    assert a.dtype == b.dtype and a.shape == b.shape, (name, a.shape, b.shape)
                    assert torch.equal(a, b), (device, name, n, t, ragged)
        store.close()
    real, calls = gather_kernels.gather, []
    gather_kernels.gather = lambda *args: calls.append(args[1]) or real(*args)
    gather_kernels.ENABLED = True
    store = rp.Store(FIELDS, capacity=256, block_steps=8)
    t = rp.Table("g", store, sampler=rp.selectors.Uniform(), seed=1)
    with store.writer() as w:
        for i in range(6):
            w.append({name: np.full(f.shape, i, f.dtype) for name, f in FIELDS.items()})
            w.create_item(t, 1 + i % 2, 1.0)
    s = t.sample(16, device="cuda", fields=["obs", "action"])
    for k, length in enumerate(s.lengths):
        assert (s.data["obs"][k, length:] == 0).all() and (s.data["action"][k, :length] >= 0).all()
    assert calls == [["obs", "action"]], calls
    gather_kernels.gather = real
    gather_kernels.ENABLED = None
    store.close()


def check_static():
    """A static sample drawn and gathered by the kernels gives the torch operations'
    numbers, for windows of one row range and of several."""
    for interleave in (False, True):
        pair = [twin("s", rp.selectors.Prioritized(0.8), fused) for fused in (False, True)]
        samples = []
        for (store, t), fused in zip(pair, (False, True)):
            fill(store, t, (1, 3), interleave)
            gather_kernels.ENABLED = fused
            samples.append(t.static_sample(40, steps=3))
        for _ in range(3):
            outs = []
            for s, fused in zip(samples, (False, True)):
                gather_kernels.ENABLED = fused
                outs.append(s.admit().draw())
            a, b = outs
            for k in ("keys", "probabilities", "priorities", "times_sampled", "lengths"):
                assert torch.equal(getattr(a, k), getattr(b, k)), (k, interleave)
            assert torch.equal(a.data["x"], b.data["x"]), interleave
        gather_kernels.ENABLED = None
        for (store, _), s in zip(pair, samples):
            s.close()
            store.close()


def main():
    import os
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton_probe import interpreter_problem
        problem = interpreter_problem()
        if problem:
            print(f"SKIP {problem}")
            return
        emulate_cuda(True)  # interpreted on the CPU; else compiled, on the GPU
    elif not torch.cuda.is_available():
        raise SystemExit("without TRITON_INTERPRET=1 these checks need CUDA")
    else:
        global DEVICE
        DEVICE = torch.device("cuda", torch.cuda.current_device())
    check_draws()
    check_gather()
    check_static()
    print("OK")


if __name__ == "__main__":
    main()

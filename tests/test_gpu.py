"""The GPU path, run twice: emulated (``emulate_cuda``: the same code with "cuda"
mapped to the CPU; what CI runs) and on a real CUDA device when there is one."""

import time

import numpy as np
import pytest

import reprise as rp

torch = pytest.importorskip("torch")
rt = pytest.importorskip("reprise.torch")
from reprise.torch.collect import wait_released  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(params=["emulated", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device"))])
def backend(request):
    rt.emulate_cuda(request.param == "emulated")
    yield request.param
    wait_released(10)
    rt.emulate_cuda(False)


SIG = {
    "obs": rp.Field((3, 2), "float32"),
    "act": rp.Field((), "int64"),
    "flag": rp.Field((), "bool"),
    "half": rp.Field((5,), "float16"),
    "u16": rp.Field((3,), "uint16"),
    "u64": rp.Field((), "uint64"),
    "f64": rp.Field((2,), "float64"),
}


def step(i):
    return {
        "obs": np.full((3, 2), i, np.float32) + np.arange(6, dtype=np.float32).reshape(3, 2) / 10,
        "act": np.int64(i),
        "flag": np.bool_(i % 2),
        "half": np.full(5, i % 100, np.float16),
        "u16": np.array([i, i + 1, i + 2], np.uint16),
        "u64": np.uint64(2**63 + i),
        "f64": np.array([i, -i], np.float64),
    }


def host(x):
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def fill(store, tables, episodes=6, length=7, lengths=(1, 3)):
    """Episodes written step by step, items of several lengths (ragged samples,
    windows across block boundaries)."""
    i = 0
    with store.writer() as w:
        for _ in range(episodes):
            for t in range(length):
                w.append(step(i))
                i += 1
                for n in lengths:
                    if t + 1 >= n:
                        for table in tables:
                            w.create_item(table, n, float(1 + i % 5))
            w.end_episode()
    return i


def same_sample(a, b):
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_allclose(a.probabilities, b.probabilities)
    assert set(a.data) == set(b.data)
    for k in a.data:
        np.testing.assert_array_equal(host(a.data[k]), host(b.data[k]), err_msg=k)


def test_cuda_sample_equals_host_sample(backend, make_store):
    store = make_store(SIG, capacity=512, block_steps=4)
    t1 = rp.Table("a", store, sampler=rp.selectors.Prioritized(0.7), max_size=400, seed=3)
    t2 = rp.Table("b", store, sampler=rp.selectors.Prioritized(0.7), max_size=400, seed=3)
    fill(store, [t1, t2])
    for n in (1, 5, 64):
        g = t1.sample(n, device="cuda")
        h = t2.sample(n)
        same_sample(g, h)
        for k, v in g.data.items():
            assert isinstance(v, torch.Tensor)
            assert v.device.type == ("cuda" if backend == "cuda" else "cpu")
            assert v.dtype == rt.columns.torch_dtype(SIG[k].dtype)
        assert g.data["obs"].shape == (n, int(g.lengths.max()), 3, 2)
    # Padding past an item's end is zero.
    g = t1.sample(64, device="cuda", fields=["obs", "act"])
    assert set(g.data) == {"obs", "act"}
    short = np.nonzero(g.lengths < 3)[0]
    assert len(short) > 0
    for i in short:
        assert not host(g.data["obs"][i, g.lengths[i]:]).any()


def item_steps(table, episodes, length=7, lengths=(1, 3)):
    """``{key: step numbers}`` of the items ``fill`` made (``table.items()`` is in insertion order)."""
    spans = []
    for j in range(episodes * length):
        spans += [range(j - n + 1, j + 1) for n in lengths if j % length + 1 >= n]
    keys = [k for k, *_ in table.items()]
    assert len(keys) == len(spans)
    return dict(zip(keys, spans))


def assert_holds_items(s, spans):
    """Every row of ``s`` holds, field by field, the steps its item was made over, zero past its end."""
    for r, key in enumerate(s.keys):
        steps = spans[int(key)]
        assert s.lengths[r] == len(steps)
        for name in SIG:
            got = host(s.data[name])[r]
            want = np.stack([step(j)[name] for j in steps])
            np.testing.assert_array_equal(got[: len(steps)], want, err_msg=f"item {key}, field {name}")
            assert not got[len(steps):].any()


def overwrite_free_blocks(store, first):
    """Writes ``2 * capacity`` one-step episodes (values from ``step(first)`` on):
    every block a writer can take is overwritten, and only those."""
    written = 0
    with store.writer() as w:
        for i in range(2 * store.capacity):
            try:
                w.append(step(first + i))
            except rp.errors.ResourceExhausted:
                break
            written += 1
            w.end_episode()
    return written


@pytest.mark.parametrize("selection_device", [None, "cuda"])
def test_rows_are_held_until_the_gather_finished_then_released(backend, make_store, monkeypatch, selection_device):
    """Between the draw and the gather's reads the sampled items are evicted and
    writers overwrite every block they can take (the gather ran late), and again
    after the sample returned: the gathered values are still those of the sampled
    items, and once the gather has finished every block is free again. With
    ``selection_device`` the draw is device-resident: the admission's epoch holds
    the blocks. Without the epoch the overwrite would reach them."""
    store = make_store(SIG, capacity=64, block_steps=4)
    t = rp.Table("t", store, max_size=60, seed=0, selection_device=selection_device)
    fill(store, [t], episodes=2)
    spans = item_steps(t, episodes=2)
    from reprise.torch import gather_kernels
    gathers = {"index_select": torch.index_select, "fused": gather_kernels.gather}
    late = {}

    def delayed(kind):
        def late_gather(*args, **kwargs):
            run_late()
            return gathers[kind](*args, **kwargs)
        return late_gather

    def run_late():
        if not late:  # the first gather: the sample is drawn, none of its rows read yet
            t.reset()
            # The sample's epoch holds its blocks (in limbo), not a reference per item.
            late["held"] = store._native.limbo_blocks
            late["referenced"] = [b for b in range(store.num_blocks) if store._native.block_refcount(b) > 0]
            late["free"] = store.free_blocks
            late["written"] = overwrite_free_blocks(store, 10_000)

    with monkeypatch.context() as m:
        # Both ways a GPU sample gathers (the fused kernel on CUDA, index_select elsewhere).
        m.setattr(torch, "index_select", delayed("index_select"))
        m.setattr(gather_kernels, "gather", delayed("fused"))
        s = t.sample(32, device="cuda")
    assert late, "the gather went through neither torch.index_select nor the fused kernel: this test no longer delays it"
    assert late["held"] > 0, "no block was held by the sample in flight"
    assert late["referenced"] == [], "the sample held references per block instead of an epoch"
    # Writers took every free block (blocks freed while the gather is pending are not reused).
    assert late["written"] >= late["free"] > 0
    assert t.size == 0
    overwrite_free_blocks(store, 20_000)  # the gather may still run on the device (CUDA): its rows are held
    assert_holds_items(s, spans)
    assert wait_released(10)
    assert [store._native.block_refcount(b) for b in range(store.num_blocks)] == [0] * store.num_blocks
    assert store.free_blocks == store.num_blocks and store._native.limbo_blocks == 0


def test_bad_device_and_fields(backend, make_store):
    store = make_store(SIG, capacity=64, block_steps=4)
    t = rp.Table("t", store, max_size=60)
    fill(store, [t], episodes=1)
    n = t.info()["num_samples"]
    with pytest.raises(rp.errors.NotFound, match="unknown field 'nope'"):
        t.sample(2, device="cuda", fields=["nope"])
    with pytest.raises(rp.errors.InvalidArgument, match="expected a CUDA device"):
        t.sample(2, device="meta")
    with pytest.raises(rp.errors.InvalidArgument, match="not a device"):
        t.sample(2, device="gpu please")
    assert t.info()["num_samples"] == n


@pytest.mark.skipif(HAS_CUDA, reason="needs a machine without CUDA")
def test_cuda_without_a_device_is_a_clear_error(make_store):
    rt.emulate_cuda(False)
    store = make_store(SIG, capacity=64, block_steps=4)
    t = rp.Table("t", store, max_size=60)
    fill(store, [t], episodes=1)
    for call in (lambda: t.sample(1, device="cuda"),
                 lambda: rp.Store(SIG, capacity=8, device="cuda"),
                 lambda: rp.Table("g", store, selection_device="cuda"),
                 lambda: next(iter(t.iterate(2, device="cuda")))):
        with pytest.raises(rp.errors.InvalidArgument, match="CUDA is not available"):
            call()
    assert t.info()["num_samples"] == 0


# --- device stores -------------------------------------------------------------------

def test_device_store_round_trip(backend):
    store = rp.Store(SIG, capacity=256, block_steps=4, device="cuda")
    try:
        dev = rt.resolve("cuda")  # emulated: the CPU
        assert store.device == str(dev) and dev.type == ("cuda" if backend == "cuda" else "cpu")
        assert all(v.device == dev for v in store._device_columns.views.values())
        t = rp.Table("t", store, sampler=rp.selectors.Fifo(), max_size=100)
        target = dev.type
        with store.writer() as w:
            for i in range(5):
                w.append({k: torch.from_numpy(np.asarray(v)).to(target) for k, v in step(i).items()})
            w.create_item(t, 3, 1.0)
            w.extend({k: np.stack([step(i)[k] for i in range(5, 9)]) for k in SIG})
            w.create_items(t, 2, [1.0, 2.0])
        s = t.sample(1, device="cuda")
        np.testing.assert_array_equal(host(s.data["act"]), [[2, 3, 4]])
        np.testing.assert_array_equal(host(s.data["u64"]), [[2**63 + 2, 2**63 + 3, 2**63 + 4]])
        hs = t.sample(1)  # to the host: numpy
        assert isinstance(hs.data["obs"], np.ndarray)
        np.testing.assert_array_equal(hs.data["f64"][0, :, 0], [2, 3, 4])
        # Batch insert from device tensors.
        data = {k: torch.from_numpy(np.stack([np.stack([step(100 + 3 * j + u)[k] for u in range(3)]) for j in range(4)])).to(target)
                for k in SIG}
        keys = t.insert(data, priorities=[1, 2, 3, 4])
        assert len(keys) == 4
        t2 = rp.Table("all", store, sampler=rp.selectors.Lifo(), max_size=100)
        t2.insert(data, priorities=1.0)
        s = t2.sample(1, device="cuda")
        assert all(v.device == dev for v in s.data.values())
        np.testing.assert_array_equal(host(s.data["act"]), [[109, 110, 111]])
        np.testing.assert_allclose(host(s.data["obs"]), host(data["obs"][3:4]))
        # Each returned key names its own item: the j-th window of the batch, with the j-th priority.
        new = [int(k) for k in keys]
        old = [k for k, *_ in t.items() if k not in new]
        assert len(old) == 3 and t.delete(old) == 3
        for j, key in enumerate(new):  # Fifo: the oldest left is the next inserted
            s = t.sample(1, device="cuda")
            assert int(s.keys[0]) == key and s.priorities[0] == j + 1 and s.lengths[0] == 3
            for k in SIG:
                np.testing.assert_array_equal(host(s.data[k])[0], host(data[k][j]), err_msg=f"item {j}, field {k}")
            assert t.delete([key]) == 1
        assert t.size == 0
    finally:
        store.close()


def test_device_store_bad_input_changes_nothing(backend):
    store = rp.Store({"x": rp.Field((2,), "float32")}, capacity=64, block_steps=4, device="cuda")
    try:
        t = rp.Table("t", store, max_size=50)
        free = store.free_blocks
        w = store.writer()
        cases = [
            ({"x": torch.zeros(3)}, "expects shape \\[2\\]"),
            ({"x": torch.zeros(2, dtype=torch.float64)}, "expects float32"),
            ({"y": torch.zeros(2)}, "missing \\['x'\\]"),
            ({"x": np.zeros(2, np.float64)}, "expects float32"),
        ]
        for step_, msg in cases:
            with pytest.raises(rp.errors.InvalidArgument, match=msg):
                w.append(step_)
        assert w.episode_steps == 0
        with pytest.raises(rp.errors.InvalidArgument, match="expects shape \\[2, 1, 2\\]"):
            t.insert({"x": torch.zeros(2, 1, 3)}, priorities=1.0)
        with pytest.raises(rp.errors.InvalidArgument, match="priorit"):
            t.insert({"x": torch.zeros(2, 1, 2)}, priorities=[1.0, float("nan")])
        w.close()
        assert t.size == 0 and store.free_blocks == free
        with pytest.raises(rp.errors.InvalidArgument, match="cannot map|serve a host store"):
            rp.Server([t])
    finally:
        store.close()


# --- GPU selection ---------------------------------------------------------------------

def scalar_store(make_store, capacity=4096):
    return make_store({"x": rp.Field((), "int64")}, capacity=capacity, block_steps=8)


def put(table, values, priorities):
    return table.insert({"x": np.asarray(values, np.int64).reshape(-1, 1)}, priorities=priorities)


@pytest.mark.parametrize("sampler", [rp.selectors.Fifo(), rp.selectors.Lifo(), rp.selectors.MaxHeap(),
                                     rp.selectors.MinHeap(), rp.selectors.TopK()])
@pytest.mark.parametrize("max_times", [0, 1, 2])
def test_ordered_gpu_selection_matches_the_host(backend, make_store, sampler, max_times):
    rng = np.random.default_rng(max_times)
    store = scalar_store(make_store)
    host_t = rp.Table("h", store, sampler=sampler, max_size=64, max_times_sampled=max_times, seed=1)
    gpu_t = rp.Table("g", store, sampler=sampler, max_size=64, max_times_sampled=max_times, seed=1,
                     selection_device="cuda")
    for rnd in range(6):
        vals = rng.integers(0, 1000, size=10)
        pr = rng.integers(0, 4, size=10).astype(float)  # ties on purpose
        put(host_t, vals, pr)
        put(gpu_t, vals, pr)
        if rnd % 2:
            k = gpu_t.items()[::3]
            host_t.update_priorities([i[0] - 0 for i in host_t.items()[::3]], [7.0] * len(k))
            gpu_t.update_priorities([i[0] for i in k], [7.0] * len(k))
        n = int(rng.integers(1, 12))
        a = host_t.sample(n, timeout=0)
        b = gpu_t.sample(n, device="cuda", timeout=0)
        np.testing.assert_array_equal(a.data["x"], host(b.data["x"]))
        np.testing.assert_array_equal(a.times_sampled, b.times_sampled)
        assert host_t.size == gpu_t.size


def chi_square_ok(counts, expected, p=1e-4):
    from math import isfinite
    stat = float(((counts - expected) ** 2 / expected).sum())
    # Wilson-Hilferty approximation of the chi-square quantile.
    k = len(counts) - 1
    z = 3.719  # 1e-4 upper quantile of N(0,1)
    crit = k * (1 - 2 / (9 * k) + z * (2 / (9 * k)) ** 0.5) ** 3
    assert isfinite(stat)
    return stat < crit, stat, crit


@pytest.mark.parametrize("exponent", [None, 0.0, 0.6, 1.0])
def test_random_gpu_selection_distribution(backend, make_store, exponent):
    store = scalar_store(make_store)
    sampler = rp.selectors.Uniform() if exponent is None else rp.selectors.Prioritized(exponent)
    t = rp.Table("g", store, sampler=sampler, max_size=100, seed=5, selection_device="cuda")
    pr = np.arange(1, 21, dtype=float)
    pr[3] = 0.0
    keys = put(t, np.arange(20), pr)
    t.delete(keys[5:6])  # a removed item is never drawn
    draws = 40_000
    counts = np.zeros(20)
    s = None
    for _ in range(8):
        s = t.sample(draws // 8, device="cuda")
        counts += np.bincount(host(s.data["x"])[:, 0], minlength=20)
    w = np.ones(20) if exponent is None else pr ** exponent
    w[5] = 0
    expected = w / w.sum() * draws
    assert counts[5] == 0
    if exponent not in (None, 0.0):
        assert counts[3] == 0
    ok, stat, crit = chi_square_ok(counts[expected > 0], expected[expected > 0])
    assert ok, (stat, crit, counts, expected)
    want_p = (w / w.sum())[host(s.data["x"])[:, 0]]
    np.testing.assert_allclose(s.probabilities, want_p, rtol=1e-9)


def test_gpu_selection_is_reproducible_and_tracks_updates(backend, make_store):
    store = scalar_store(make_store)
    ts = [rp.Table(f"g{i}", store, sampler=rp.selectors.Prioritized(1.0), max_size=100, seed=11,
                   selection_device="cuda") for i in range(2)]
    for t in ts:
        put(t, np.arange(10), np.ones(10))
    a, b = (t.sample(50, device="cuda") for t in ts)
    np.testing.assert_array_equal(host(a.data["x"]), host(b.data["x"]))
    t = ts[0]
    keys = [k for k, *_ in t.items()]
    t.update_priorities(keys, [0.0] * 9 + [1.0])  # only the last remains drawable
    s = t.sample(30, device="cuda")
    assert set(host(s.data["x"])[:, 0]) == {9}
    np.testing.assert_allclose(s.probabilities, 1.0)


def test_gpu_selection_max_times_sampled_and_limiter(backend, make_store):
    store = scalar_store(make_store)
    t = rp.Table("q", store, sampler=rp.selectors.Uniform(), max_size=100, max_times_sampled=1, seed=2,
                 selection_device="cuda", rate_limiter=rp.rate_limiters.MinSize(1))
    put(t, np.arange(30), np.ones(30))
    s = t.sample(30, device="cuda", timeout=0)
    assert sorted(host(s.data["x"])[:, 0]) == list(range(30))  # each exactly once
    assert t.size == 0
    with pytest.raises(rp.errors.Timeout) as e:
        t.sample(3, device="cuda", timeout=0.05)
    assert e.value.partial is None
    put(t, [7, 8], [1, 1])
    with pytest.raises(rp.errors.Timeout) as e:
        t.sample(3, timeout=0.05)
    assert sorted(e.value.partial.data["x"][:, 0]) == [7, 8]
    assert t.info()["num_samples"] == 32


# --- iterate ---------------------------------------------------------------------------

def test_iterate_prefetches_complete_batches(backend, make_store):
    store = make_store(SIG, capacity=512, block_steps=4)
    t = rp.Table("a", store, sampler=rp.selectors.Uniform(), max_size=400, seed=3)
    fill(store, [t])
    seen = 0
    for s in t.iterate(batch_size=16, device="cuda", prefetch=3, num_batches=10):
        assert s.data["obs"].shape[0] == 16
        act = host(s.data["act"])
        obs = host(s.data["obs"])
        for i in range(16):
            for j in range(s.lengths[i]):
                np.testing.assert_allclose(obs[i, j], step(int(act[i, j]))["obs"])
        t.update_priorities(s.keys, np.full(16, 2.0))
        seen += 1
    assert seen == 10
    host_batches = list(t.iterate(batch_size=4, num_batches=3))
    assert len(host_batches) == 3 and isinstance(host_batches[0].data["obs"], np.ndarray)
    with pytest.raises(rp.errors.InvalidArgument, match="batch_size"):
        next(iter(t.iterate(batch_size=0, device="cuda")))


# --- clients ---------------------------------------------------------------------------

def test_client_cuda_sample_equals_host(backend, make_store):
    store = make_store(SIG, capacity=512, block_steps=4)
    t1 = rp.Table("a", store, sampler=rp.selectors.Prioritized(1.0), max_size=400, seed=3)
    t2 = rp.Table("b", store, sampler=rp.selectors.Prioritized(1.0), max_size=400, seed=3)
    fill(store, [t1, t2])
    server = rp.Server([t1, t2])
    try:
        client = rp.Client(server.local_address)
        g = client.sample("a", 40, device="cuda")
        h = client.sample("b", 40)
        same_sample(g, h)
        with pytest.raises(rp.errors.NotFound):
            client.sample("a", 1, device="cuda", fields=["zzz"])
        client.close()
        assert wait_released(10)
    finally:
        server.stop()


# --- device sum tree -------------------------------------------------------------------

def test_sum_tree_matches_prefix_sums(backend):
    from reprise.torch.sum_tree import SumTree
    dev = rt.resolve("cuda")
    tree = SumTree(1000, dev)
    g = np.random.default_rng(0)
    w = g.random(1000)
    w[g.random(1000) < 0.3] = 0
    slots = torch.arange(1000, device=dev)
    tree.set(slots, torch.as_tensor(w, device=dev))
    assert abs(float(tree.total()) - w.sum()) < 1e-9
    u = torch.as_tensor(g.random(5000) * w.sum(), device=dev)
    got = host(tree.find(u))
    want = np.searchsorted(np.cumsum(w), host(u), side="right")
    np.testing.assert_array_equal(got, want)
    assert (w[got] > 0).all()
    # Batched updates recompute the parents exactly.
    idx = g.choice(1000, 200, replace=False)
    w[idx] = g.random(200)
    tree.set(torch.as_tensor(idx, device=dev), torch.as_tensor(w[idx], device=dev))
    assert abs(float(tree.total()) - w.sum()) < 1e-9
    if backend == "cuda":  # the Triton kernels against the torch ops
        ref = SumTree(1000, dev, use_triton=False)
        ref.set(slots, torch.as_tensor(w, device=dev))
        torch.testing.assert_close(tree.tree, ref.tree)
        np.testing.assert_array_equal(host(tree.find(u)), host(ref.find(u)))


def dlpack_sample(make_store):
    store = make_store(SIG, capacity=64, block_steps=4)
    t = rp.Table("t", store, max_size=60, seed=0)
    fill(store, [t], episodes=1)
    return t.sample(8, device="cuda")


def test_dlpack_export_to_torch(backend, make_store):
    s = dlpack_sample(make_store)
    for k, x in s.data.items():
        y = torch.from_dlpack(x.__dlpack__())
        assert y.data_ptr() == x.data_ptr() and y.dtype == x.dtype and y.device == x.device, k
        assert torch.equal(y, x), k


def test_dlpack_export_to_jax(backend, make_store):
    """Every field's tensor (64-bit ones too) becomes a JAX array over the same memory."""
    jax = pytest.importorskip("jax", reason="JAX is not installed (not in the test extra: jax[cpu] is about "
                                             "125 MB); pip install jax to run this test")
    import jax.dlpack
    platform = "gpu" if backend == "cuda" else "cpu"
    try:
        jax.devices(platform)
    except RuntimeError:
        pytest.skip(f"this JAX has no {platform} backend (for CUDA: pip install 'jax[cuda12]')")
    s = dlpack_sample(make_store)
    try:
        x64 = jax.enable_x64
    except AttributeError:  # older JAX
        from jax.experimental import enable_x64 as x64
    with x64(True):  # JAX would otherwise copy 64-bit data into 32-bit arrays
        for k, x in s.data.items():
            j = jax.dlpack.from_dlpack(x)
            assert {d.platform for d in j.devices()} == {platform}, k
            assert j.shape == tuple(x.shape) and str(j.dtype) == SIG[k].dtype, k
            assert j.unsafe_buffer_pointer() == x.data_ptr(), f"field {k} was copied"
            np.testing.assert_array_equal(np.asarray(j), host(x), err_msg=k)


@pytest.mark.skipif(not HAS_CUDA, reason="CuPy exports need a CUDA device (cupy is a CUDA-only package)")
def test_dlpack_export_to_cupy(make_store):
    rt.emulate_cuda(False)
    cupy = pytest.importorskip("cupy", reason="cupy is not installed (a CUDA-only package, not in the test extra): "
                                              "pip install cupy-cuda12x to run this test")
    s = dlpack_sample(make_store)
    for k, x in s.data.items():
        c = cupy.from_dlpack(x)
        assert c.data.ptr == x.data_ptr(), f"field {k} was copied"
        np.testing.assert_array_equal(cupy.asnumpy(c), host(x), err_msg=k)


def test_device_store_inserts_pack_blocks(backend):
    store = rp.Store({"x": rp.Field((), "int32")}, capacity=64, block_steps=8, device="cuda")
    try:
        t = rp.Table("t", store, sampler=rp.selectors.Fifo(), max_size=64)
        for i in range(12):
            t.insert({"x": torch.arange(5 * i, 5 * i + 5, dtype=torch.int32).reshape(5, 1)}, priorities=1.0)
        assert t.size == 60 and t.info()["num_store_evictions"] == 0
        s = t.sample(1)
        assert s.data["x"][0, 0] == 0
    finally:
        store.close()


def test_concurrent_cuda_samples_from_threads(backend, make_store):
    import threading
    store = make_store(SIG, capacity=1024, block_steps=4)
    t = rp.Table("t", store, sampler=rp.selectors.Uniform(), max_size=900, seed=1)
    fill(store, [t], episodes=8)
    errors = []

    def worker():
        try:
            for _ in range(15):
                s = t.sample(24, device="cuda")
                act, obs = host(s.data["act"]), host(s.data["obs"])
                for i in range(24):
                    for j in range(s.lengths[i]):
                        np.testing.assert_allclose(obs[i, j], step(int(act[i, j]))["obs"])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(12)]  # more threads than staging slots
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    assert t.info()["num_samples"] == 12 * 15 * 24


def test_partial_samples_are_collected_like_whole_ones(backend, make_store):
    for device_store in (False, True):
        if device_store:
            store = rp.Store(SIG, capacity=256, block_steps=4, device="cuda")
        else:
            store = make_store(SIG, capacity=256, block_steps=4)
        try:
            q = rp.Table.queue("q", store, max_size=10)
            with store.writer() as w:
                for i in range(5):
                    w.append(step(i))
                    w.create_item(q, 1, 1.0)
            with pytest.raises(rp.errors.Timeout) as e:
                q.sample(7, device="cuda", timeout=0.05, fields=["act", "obs"])
            p = e.value.partial
            assert set(p.data) == {"act", "obs"} and isinstance(p.data["act"], torch.Tensor)
            np.testing.assert_array_equal(host(p.data["act"])[:, 0], [0, 1, 2, 3, 4])
            with store.writer() as w:
                for i in (3, 4):
                    w.append(step(i))
                    w.create_item(q, 1, 1.0)
            # iterate yields the batches drawn before a timeout, then raises it.
            got = []
            it = q.iterate(batch_size=1, device="cuda", prefetch=3, timeout=0.05, fields=["act"])
            with pytest.raises(rp.errors.Timeout) as e:
                for s in it:
                    got.append(int(host(s.data["act"])[0, 0]))
            assert got == [3, 4] and e.value.partial is None
            put_back = {k: np.stack([step(9)[k]]) for k in SIG}
            with store.writer() as w:
                w.extend(put_back)
                w.create_item(q, 1, 1.0)
            with pytest.raises(rp.errors.Timeout) as e:
                q.sample(2, timeout=0.05)  # to the host
            assert isinstance(e.value.partial.data["obs"], np.ndarray)
            assert set(e.value.partial.data) == set(SIG)
            assert e.value.partial.data["act"][0, 0] == 9
        finally:
            if device_store:
                store.close()


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_rows_under_a_running_gather_are_not_reused(make_store):
    """The stream is kept busy so the gather runs late; meanwhile the sampled
    items are evicted and writers cycle the whole store. The gathered rows must
    still be the ones sampled: their blocks come back only after the gather's event."""
    rt.emulate_cuda(False)
    store = make_store({"x": rp.Field((256,), "int64")}, capacity=256, block_steps=8)
    t = rp.Table("t", store, sampler=rp.selectors.Fifo(), max_size=32)
    with store.writer() as w:
        for i in range(32):
            w.append({"x": np.full(256, i, np.int64)})
            w.create_item(t, 1, 1.0)
    for _ in range(10):  # registration and pinned staging buffers: their allocation waits for an idle device
        t.sample(32, device="cuda")
    torch.cuda.synchronize()
    assert wait_released(10)
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time queued before the gather
    start = time.perf_counter()
    s = t.sample(32, device="cuda")
    assert time.perf_counter() - start < 0.5, "the sample waited for the device: the race is not exercised"
    held = store.num_blocks - store.free_blocks
    t.reset()
    written = 0
    with store.writer() as w:  # try to overwrite everything: only free blocks can be taken
        for i in range(300):
            try:
                w.append({"x": np.full(256, 1000 + i, np.int64)})
                written += 1
            except rp.errors.ResourceExhausted:
                break
            w.end_episode()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(host(s.data["x"])[:, 0, 0], np.zeros(32))  # Fifo: the oldest, 32 times
    assert held >= 1
    assert wait_released(10)

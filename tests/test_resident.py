"""Device-resident draws (``reprise.torch.resident``): a table with GPU selection
and a Uniform or Prioritized sampler draws on the device from its mirror, with no
work per drawn item on the host. Run emulated (what CI runs) and on CUDA when
there is a device. Checked against a plain reference model of the table."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reprise as rp

torch = pytest.importorskip("torch")
rt = pytest.importorskip("reprise.torch")
from reprise.torch.resident import ResidentSelection  # noqa: E402
from reprise.torch.selection import DeviceSelection  # noqa: E402
from test_gpu import SIG, assert_holds_items, backend, chi_square_ok, fill, host, item_steps  # noqa: E402,F401


def table(store, sampler=None, name="t", **kw):
    return rp.Table(name, store, sampler=sampler or rp.selectors.Uniform(), selection_device="cuda", seed=3, **kw)


def test_which_tables_draw_on_the_device(backend, make_store):
    store = make_store()
    assert isinstance(table(store)._selection, ResidentSelection)
    assert isinstance(table(store, rp.selectors.Prioritized(0.5))._selection, ResidentSelection)
    # Defaults: the built-ins a device-resident draw keeps exact.
    assert table(store).extensions == [rp.extensions.PriorityHistogram(), rp.extensions.Rates()]
    # Per-item observers, max_times_sampled and ordered samplers keep the candidate path.
    assert isinstance(table(store, extensions=[rp.extensions.TimesSampled()])._selection, DeviceSelection)
    assert isinstance(table(store, max_times_sampled=2)._selection, DeviceSelection)
    assert isinstance(table(store, rp.selectors.Fifo())._selection, DeviceSelection)
    assert table(store, max_times_sampled=2).extensions[2] == rp.extensions.TimesSampled()
    # The native refusal names the reason.
    t = table(store, extensions=[rp.extensions.SampledAge()])
    assert "extension looks at each draw" in t._native.resident_refusal()
    with pytest.raises(rp.errors.InvalidArgument, match="cannot draw on a device from its mirror.*extension"):
        t._native.admit(1, 0.0)


def test_samples_hold_their_items_rows_and_metadata(backend, make_store):
    """Ragged items and windows across block boundaries (several row ranges):
    every row holds its item's steps, zero past its end, and the metadata are the
    table's."""
    store = make_store(SIG, capacity=512, block_steps=4)
    t = table(store, rp.selectors.Prioritized(1.0))
    fill(store, [t])
    spans = item_steps(t, episodes=6)
    for fields in (None, ["obs", "u64"]):
        s = t.sample(300, device="cuda", fields=fields)
        assert set(s.data) == set(fields or SIG)
        if fields is None:
            assert_holds_items(s, spans)
        assert s.data["obs"].shape[:2] == (300, int(s.lengths.max()))
        items = {k: (p, n) for k, p, _, n in t.items()}
        np.testing.assert_array_equal(s.priorities, [items[int(k)][0] for k in s.keys])
        np.testing.assert_array_equal(s.lengths, [items[int(k)][1] for k in s.keys])
        total = sum(p for p, _ in items.values())
        np.testing.assert_allclose(s.probabilities, s.priorities / total, rtol=1e-12)
        assert s.table_size == len(items)
    h = t.sample(50)  # to the host: numpy, gathered the same way
    assert all(isinstance(v, np.ndarray) for v in h.data.values())
    assert_holds_items(h, spans)


def test_windows_of_several_row_ranges(backend, make_store):
    """Two writers take turns at blocks, so an item over steps of two blocks has
    two row ranges (the mirror's windows widen to them)."""
    store = make_store(capacity=64, block_steps=2)
    t = table(store)
    with store.writer() as a, store.writer() as b:
        for i in range(6):
            a.append({"x": np.int64(i)})
            b.append({"x": np.int64(100 + i)})
        a.create_item(t, 5, 1.0)   # steps 1..5 over a's blocks: 1 | 2 3 | 4 5
        b.create_item(t, 3, 1.0)
    assert t._selection.ranges == 1
    s = t.sample(40, device="cuda")
    assert t._selection.ranges == 3
    for r, n in enumerate(s.lengths):
        want = np.arange(1, 6) if n == 5 else np.array([103, 104, 105, 0, 0])
        np.testing.assert_array_equal(host(s.data["x"])[r], want)


def test_times_sampled_counts_every_draw_and_reaches_the_table(backend, make_store):
    store = make_store()
    t = table(store)
    t.insert({"x": np.arange(3).reshape(3, 1)}, priorities=1.0)
    seen = {}
    for _ in range(4):
        s = t.sample(500, device="cuda")
        for k, n in zip(s.keys.tolist(), s.times_sampled.tolist()):
            seen[k] = seen.get(k, 0) + 1
            assert n == seen[k]  # k, k + 1, ... within a batch and across batches
    assert {k: n for k, _, n, _ in t.items()} == seen
    assert t.info()["num_samples"] == 2000
    # A priority update keeps the draws not yet credited; a new item in a reused slot starts at 0.
    s = t.sample(30, device="cuda")
    t.update_priorities(s.keys[:1], [2.0])
    t.delete(s.keys[1:2]) if s.keys[1] != s.keys[0] else None
    t.insert({"x": np.array([[9]])}, priorities=1.0)
    before = {k: n for k, _, n, _ in t.items()}
    s2 = t.sample(40, device="cuda")
    for k in set(s2.keys.tolist()):
        assert s2.times_sampled[s2.keys == k].max() == before[k] + (s2.keys == k).sum()


@pytest.mark.parametrize("exponent", [1.0, 0.6, 0.0])
def test_prioritized_and_uniform_distributions(backend, make_store, exponent):
    """Chi-square against p^a / sum p^a (and 1/size for Uniform) over 200k draws."""
    store = make_store()
    pr = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 10.0])
    for name, sampler, w in (("p", rp.selectors.Prioritized(exponent), pr ** exponent),
                             ("u", rp.selectors.Uniform(), np.ones(6))):
        t = table(store, sampler, name)
        t.insert({"x": np.arange(6).reshape(6, 1)}, priorities=pr)
        s = t.sample(200_000, device="cuda")
        counts = np.bincount(host(s.data["x"])[:, 0], minlength=6)
        p = w / w.sum()
        keep = p > 0
        assert counts[~keep].sum() == 0
        assert chi_square_ok(counts[keep], p[keep] * counts.sum())[0]
        np.testing.assert_allclose(s.probabilities, p[host(s.data["x"])[:, 0]], rtol=1e-12)
        t.reset()


def test_uniform_over_slots_with_holes(backend, make_store):
    """Dense slots draw by one random slot number; after a delete (a free slot)
    the sum tree of ones draws, never the deleted item."""
    store = make_store()
    t = table(store)
    keys = t.insert({"x": np.arange(5).reshape(5, 1)}, priorities=1.0)
    t.delete(keys[2:3])
    s = t.sample(40_000, device="cuda")
    counts = np.bincount(host(s.data["x"])[:, 0], minlength=5)
    assert counts[2] == 0
    assert chi_square_ok(counts[[0, 1, 3, 4]], np.full(4, 10_000.0))[0]
    np.testing.assert_array_equal(s.probabilities, np.full(40_000, 0.25))
    t.insert({"x": np.array([[7]])}, priorities=1.0)  # the hole is filled again
    s = t.sample(40_000, device="cuda")
    assert chi_square_ok(np.bincount(host(s.data["x"])[:, 0], minlength=8)[[0, 1, 3, 4, 7]], np.full(5, 8_000.0))[0]


def test_all_zero_priorities_draw_uniformly(backend, make_store):
    store = make_store()
    t = table(store, rp.selectors.Prioritized(0.7))
    t.insert({"x": np.arange(4).reshape(4, 1)}, priorities=0.0)
    s = t.sample(8000, device="cuda")
    counts = np.bincount(host(s.data["x"])[:, 0], minlength=4)
    assert counts.min() > 1700
    np.testing.assert_array_equal(s.probabilities, np.full(8000, 0.25))
    t.update_priorities(s.keys[:1], [1.0])  # one positive: only it is drawn
    assert set(host(t.sample(100, device="cuda").data["x"])[:, 0]) == {int(host(s.data["x"])[0, 0])}


def test_seeded_draws_repeat(backend, make_store):
    def run():
        store = make_store()
        t = table(store, rp.selectors.Prioritized(0.6))
        t.insert({"x": np.arange(50).reshape(50, 1)}, priorities=np.arange(50.0))
        return [host(t.sample(64, device="cuda").data["x"]).ravel() for _ in range(3)]
    for a, b in zip(run(), run()):
        np.testing.assert_array_equal(a, b)


def test_rate_limiter_timeout_returns_the_admitted_draws(backend, make_store):
    store = make_store()
    t = table(store, rate_limiter=rp.rate_limiters.RateLimiter(2.0, 1, 0.0, 1e9))
    t.insert({"x": np.arange(3).reshape(3, 1)}, priorities=1.0)
    info = t.info()
    with pytest.raises(rp.errors.Timeout) as e:
        t.sample(100, timeout=0.05, device="cuda")
    part = e.value.partial
    drawn = t.info()["num_samples"] - info["num_samples"]
    assert 0 < len(part.keys) == drawn < 100
    assert part.data["x"].shape == (drawn, 1)
    assert sum(n for _, _, n, _ in t.items()) == drawn
    with pytest.raises(rp.errors.Timeout) as e:  # nothing possible: nothing drawn
        t.sample(5, timeout=0.01, device="cuda")
    assert e.value.partial is None
    assert t.info()["num_samples"] == info["num_samples"] + drawn


def test_bad_input_changes_nothing(backend, make_store):
    store = make_store()
    t = table(store)
    t.insert({"x": np.arange(3).reshape(3, 1)}, priorities=1.0)
    before = (t.info(), t.items())
    with pytest.raises(rp.errors.InvalidArgument, match="sample size must be >= 1, got 0"):
        t.sample(0, device="cuda")
    with pytest.raises(rp.errors.NotFound, match="unknown field 'y'"):
        t.sample(3, device="cuda", fields=["y"])
    with pytest.raises(rp.errors.InvalidArgument, match="3 slots, 3 seqs and 2 counts"):
        t._native.credit_draws(np.zeros(3, np.int64), np.zeros(3, np.int64), np.zeros(2, np.int64))
    with pytest.raises(rp.errors.InvalidArgument, match="a count must be >= 0, got -1"):
        t._native.credit_draws(np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, -1, np.int64))
    assert (t.info(), t.items()) == before


def test_device_store_with_resident_draws(backend):
    """A device store (data born on the device) and device-resident draws: the whole
    sample stays on the device but for one metadata copy; samples to the host too."""
    store = rp.Store({"obs": rp.Field((4,), "float32"), "i": rp.Field((), "int64")}, capacity=256,
                     block_steps=8, device="cuda")
    try:
        dev = rt.resolve("cuda")
        t = rp.Table("t", store, sampler=rp.selectors.Prioritized(1.0), selection_device="cuda", seed=0)
        assert isinstance(t._selection, ResidentSelection)
        with store.writer() as w:
            w.extend({"obs": torch.arange(40.0, device=dev).view(10, 4), "i": torch.arange(10, device=dev)})
            w.create_items(t, 2, np.arange(1.0, 10.0))  # 9 items of 2 steps, priority = last step
        s = t.sample(500, device="cuda")
        assert all(v.device == dev for v in s.data.values())
        last = host(s.data["i"])[:, 1]
        np.testing.assert_array_equal(host(s.data["i"])[:, 0], last - 1)
        np.testing.assert_array_equal(s.priorities, last)
        np.testing.assert_allclose(host(s.data["obs"])[:, 1, 0], 4.0 * last)
        np.testing.assert_allclose(s.probabilities, last / 45.0, rtol=1e-12)
        h = t.sample(5)
        assert isinstance(h.data["obs"], np.ndarray) and h.data["obs"].shape == (5, 2, 4)
    finally:
        store.close()


def test_concurrent_draws_inserts_updates_and_reads(backend, make_store):
    """Two sampling threads, a writer evicting through max_size, priority updates
    and items() at once: every row is its key's data (the step number stored in
    the item's priority), and at the end every draw is counted exactly once."""
    import threading
    store = make_store(capacity=4096, block_steps=8)
    t = table(store, rp.selectors.Prioritized(1.0), max_size=64)
    t.insert({"x": np.arange(1, 65).reshape(64, 1)}, priorities=np.arange(1.0, 65.0))
    stop, errors, drawn = threading.Event(), [], [0, 0]

    def sampler(k):
        try:
            while not stop.is_set():
                s = t.sample(32, device="cuda")
                x = host(s.data["x"])[:, 0]
                assert (x == s.priorities).all(), (x, s.priorities)
                drawn[k] += len(s.keys)
                t.update_priorities(s.keys[:4], s.priorities[:4])
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=sampler, args=(k,)) for k in (0, 1)]
    for th in threads:
        th.start()
    try:
        for i in range(65, 400):
            t.insert({"x": np.array([[i]])}, priorities=float(i))
            if i % 50 == 0:
                assert len(t.items()) == 64
    finally:
        stop.set()
        for th in threads:
            th.join(30)
    assert not errors, errors[0]
    assert sum(drawn) > 0 and t.info()["num_samples"] == sum(drawn)
    # Items still present were credited every draw of theirs (evicted ones took theirs along).
    assert sum(n for _, _, n, _ in t.items()) <= sum(drawn)
    before = {k: n for k, _, n, _ in t.items()}
    t.sample(200, device="cuda")
    after = {k: n for k, _, n, _ in t.items()}
    assert sum(after.values()) - sum(before.values()) == 200


def test_checkpoint_round_trip_keeps_device_draws(backend, make_store, tmp_path):
    store = make_store()
    t = table(store, rp.selectors.Prioritized(1.0))
    t.insert({"x": np.arange(5).reshape(5, 1)}, priorities=np.arange(1.0, 6.0))
    t.sample(1000, device="cuda")
    want = t.items()
    assert sum(n for _, _, n, _ in want) == 1000
    path = rp.checkpoint.save(tmp_path, [t])
    loaded = rp.checkpoint.load(path)
    try:
        assert loaded["t"].items() == want
    finally:
        loaded["t"].store.close()


def test_iterate_prefetches_resident_draws(backend, make_store):
    store = make_store()
    t = table(store)
    t.insert({"x": np.arange(10).reshape(10, 1)}, priorities=1.0)
    batches = list(t.iterate(16, device="cuda", prefetch=3, num_batches=5))
    assert [b.data["x"].shape for b in batches] == [(16, 1)] * 5
    assert sum(n for _, _, n, _ in t.items()) == 80


def test_triton_kernels_match_the_torch_operations():
    """The two Triton kernels a CUDA draw uses, run by Triton's interpreter on the
    CPU (TRITON_INTERPRET=1, in a child process: it must be set before Triton is
    imported), give the same samples and counts as the torch operations."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, os.path.join(here, "triton_kernels_check.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 0 and r.stdout.startswith("SKIP "):
        pytest.skip(r.stdout[5:].strip())
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the compiled kernels need one "
                    "(the interpreted check above runs them on the CPU)")
def test_compiled_triton_kernels_match_the_torch_operations():
    """The same checks with the kernels compiled, on the GPU (a child process: the
    checks patch module state)."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, os.path.join(here, "triton_kernels_check.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-4000:]


def test_triton_kernels_compile_for_an_h100():
    """The kernels a CUDA draw launches compile to sm_90 machine code (Triton's
    own LLVM and ptxas; no GPU needed), in every variant the draw uses."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from reprise.torch import resident_kernels as K
    target = GPUTarget("cuda", 90, 32)
    pick = {"u_ptr": "*fp64", "tree_ptr": "*fp64", "base_ptr": "*i64", "delta_ptr": "*i64", "slot_ptr": "*i64",
            "prev_ptr": "*i64", "meta_ptr": "*i64", "n": "i32", "size_ptr": "*i64", "capacity": "i64",
            "dense": "constexpr", "levels": "constexpr", "BLOCK": "constexpr"}
    describe = {"slot_ptr": "*i64", "prev_ptr": "*i64", "key_ptr": "*i64", "prio_ptr": "*fp64", "len_ptr": "*i64",
                "start_ptr": "*i64", "delta_ptr": "*i64", "meta_ptr": "*i64", "idx_ptr": "*i64", "n": "i32",
                "T": "i32", "start_stride": "i32", "rows": "constexpr", "BLOCK": "constexpr", "TB": "constexpr"}
    variants = [(K._pick_kernel, pick, {"dense": d, "levels": 20, "BLOCK": K.BLOCK}) for d in (True, False)]
    variants += [(K._describe_kernel, describe, {"rows": r, "BLOCK": K.BLOCK, "TB": 8}) for r in (True, False)]
    apply = {"change_ptr": "*i64", "m": "i32", "K": "i32", "seq_ptr": "*i64", "key_ptr": "*i64", "prio_ptr": "*fp64",
             "base_ptr": "*i64", "len_ptr": "*i64", "delta_ptr": "*i64", "starts_ptr": "*i64", "lens_ptr": "*i64",
             "BLOCK": "constexpr"}
    variants.append((K._apply_kernel, apply, {"BLOCK": 256}))
    from reprise.torch import sum_tree as S
    set_small = {"tree_ptr": "*fp64", "slot_ptr": "*i64", "weight_ptr": "*fp64", "n": "i32", "capacity": "i64",
                 "levels": "constexpr", "BLOCK": "constexpr"}
    variants.append((S._set_small_kernel, set_small, {"levels": 20, "BLOCK": 1024}))
    from reprise.torch import gather_kernels as G
    for word in ("i64", "i32", "i16", "u8"):
        gather = {"idx_ptr": "*i64", "desc_ptr": "*i64", "out_ptr": f"*{word}", "nrows": "i32",
                  "ROWS": "constexpr", "WORDS": "constexpr"}
        variants += [(G._gather_kernel, gather, {"ROWS": rows, "WORDS": words}) for rows, words in ((128, 1), (8, 512))]
    for fn, signature, constants in variants:
        try:
            compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants), target=target,
                                      options={"enable_fp_fusion": False})
        except FileNotFoundError as e:  # a Triton build without its bundled CUDA tools
            pytest.skip(f"Triton cannot compile for CUDA here: {e}")
        assert compiled.asm["cubin"] and ".target sm_90" in compiled.asm["ptx"]


def test_kernels_that_fail_fall_back_to_torch_operations(make_store, caplog):
    """Triton kernels launched on CPU tensors (no interpreter) fail: the draw
    goes on with the torch operations, the same numbers, and says so once."""
    pytest.importorskip("triton")
    import os
    if os.environ.get("TRITON_INTERPRET"):
        pytest.skip("the interpreter runs the kernels on the CPU")
    rt.emulate_cuda(True)
    try:
        twins = []
        for fused in (False, True):
            store = make_store()
            t = table(store, rp.selectors.Prioritized(1.0))
            t._selection.use_triton = fused
            t.insert({"x": np.arange(8).reshape(8, 1)}, priorities=np.arange(8.0))
            twins.append(t)
        with caplog.at_level("WARNING", logger="reprise"):
            a, b = (t.sample(100, device="cuda") for t in twins)
        assert not twins[1]._selection.use_triton
        assert "drawing with torch operations instead" in caplog.text
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.times_sampled, b.times_sampled)
        assert twins[0].items() == twins[1].items()
    finally:
        rt.emulate_cuda(False)


def test_a_gather_kernel_that_fails_falls_back_to_index_select(caplog):
    """The fused gather launched on CPU tensors (no interpreter) fails: the sample
    is gathered by index_select instead, the same rows, and it says so."""
    pytest.importorskip("triton")
    import os
    from reprise.torch import gather_kernels
    if os.environ.get("TRITON_INTERPRET"):
        pytest.skip("the interpreter runs the kernels on the CPU")
    store = rp.Store({"x": rp.Field((3,), "int64"), "y": rp.Field((), "float32")}, capacity=64)
    t = rp.Table("t", store, sampler=rp.selectors.Uniform(), seed=2)
    t.insert({"x": np.arange(12).reshape(4, 1, 3), "y": np.arange(4, dtype=np.float32).reshape(4, 1)}, priorities=1.0)
    rt.emulate_cuda(True)
    gather_kernels.ENABLED = True
    try:
        with caplog.at_level("WARNING", logger="reprise"):
            s = t.sample(20, device="cuda")
        assert gather_kernels.ENABLED is False
        assert "gathering with index_select instead" in caplog.text
        y = s.data["y"].numpy().astype(np.int64).reshape(20)
        assert len(set(y)) > 1
        np.testing.assert_array_equal(s.data["x"].numpy().reshape(20, 3), 3 * y[:, None] + np.arange(3))
    finally:
        gather_kernels.ENABLED = None
        rt.emulate_cuda(False)
        store.close()


# ----- property test against a plain reference model ------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.lists(st.integers(1, 5), min_size=1, max_size=4),
              st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=4, max_size=4)),
    st.tuples(st.just("update"), st.integers(0, 50), st.sampled_from([0.0, 2.0, 7.0])),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("sample"), st.integers(1, 40)),
), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, prioritized=st.booleans())
def test_matches_a_reference_model(make_store, ops, prioritized):
    """Inserts (episodes of several lengths, windows across blocks), priority
    updates, deletes and samples. Every draw is of an item present at the time,
    with its data, length, priority and probability; times_sampled counts draws;
    the table's items after all equal the model's."""
    rt.emulate_cuda(True)
    try:
        store = make_store({"x": rp.Field((), "int64")}, capacity=256, block_steps=4)
        t = table(store, rp.selectors.Prioritized(0.5) if prioritized else rp.selectors.Uniform(), max_size=40)
        model = {}  # key -> [steps, priority, times]
        step = 0
        for op in ops:
            if op[0] == "insert":
                lengths, prios = op[1], op[2]
                with store.writer() as w:
                    first = step
                    for _ in range(max(lengths)):
                        w.append({"x": np.int64(step)})
                        step += 1
                    for n, p in zip(lengths, prios):
                        w.create_item(t, n, p)
                keys = [k for k, *_ in t.items()]
                new = [k for k in keys if k not in model]
                for k, (n, p) in zip(new, zip(lengths, prios)):
                    model[k] = [list(range(first + max(lengths) - n, first + max(lengths))), p, 0]
                for k in [k for k in model if k not in keys]:  # evicted by max_size
                    del model[k]
            elif op[0] == "update" and model:
                k = sorted(model)[op[1] % len(model)]
                t.update_priorities([k], [op[2]])
                model[k][1] = op[2]
            elif op[0] == "delete" and model:
                k = sorted(model)[op[1] % len(model)]
                t.delete([k])
                del model[k]
            elif op[0] == "sample" and model:
                s = t.sample(op[1], device="cuda")
                weights = {k: (v[1] ** 0.5 if prioritized else 1.0) for k, v in model.items()}
                total = sum(weights.values())
                if total == 0:
                    weights, total = {k: 1.0 for k in model}, float(len(model))
                assert s.table_size == len(model)
                for r, k in enumerate(s.keys.tolist()):
                    steps, p, _ = model[k]
                    assert weights[k] > 0
                    model[k][2] += 1
                    assert s.times_sampled[r] == model[k][2]
                    assert s.priorities[r] == p and s.lengths[r] == len(steps)
                    assert s.probabilities[r] == pytest.approx(weights[k] / total, rel=1e-9)
                    row = host(s.data["x"])[r]
                    np.testing.assert_array_equal(row[: len(steps)], steps)
                    assert not row[len(steps):].any()
        assert {k: (p, n, len(steps)) for k, (steps, p, n) in model.items()} == \
            {k: (p, n, length) for k, p, n, length in t.items()}
    finally:
        rt.emulate_cuda(False)

"""Static samples (``Table.static_sample``, ``reprise.torch.static``): fixed-size
device-resident draws into fixed buffers, whose gather a CUDA graph captures. Run
emulated (what CI runs) and on CUDA when there is a device; the graph capture
itself needs a device."""

import numpy as np
import pytest

import reprise as rp

torch = pytest.importorskip("torch")
rt = pytest.importorskip("reprise.torch")
from reprise.torch.collect import wait_released  # noqa: E402
from test_gpu import (HAS_CUDA, SIG, assert_holds_items, backend, chi_square_ok, fill, host,  # noqa: E402,F401
                      item_steps, overwrite_free_blocks)


def table(store, sampler=None, name="t", **kw):
    return rp.Table(name, store, sampler=sampler or rp.selectors.Uniform(), selection_device="cuda", seed=4, **kw)


def test_admissions_fill_the_same_buffers_with_the_tables_items(backend, make_store):
    """Items of 1 and 3 steps over block boundaries, all fields, steps=3: every
    admission rewrites the same metadata tensors in place, every row holds its
    item's steps (zero past its end), and every draw is counted once."""
    store = make_store(SIG, capacity=128, block_steps=4)
    t = table(store, rp.selectors.Prioritized(1.0), max_size=100)
    fill(store, [t], episodes=2)
    spans = item_steps(t, episodes=2)
    s = t.static_sample(16, steps=3)
    assert s.fields == list(SIG) and (s.batch_size, s.steps) == (16, 3)
    pointers = [x.data_ptr() for x in (s.keys, s.probabilities, s.priorities, s.times_sampled, s.lengths)]
    keys = []
    for _ in range(5):
        out = s.admit().draw()
        assert out.keys is s.keys and out.lengths is s.lengths
        assert [x.data_ptr() for x in (s.keys, s.probabilities, s.priorities, s.times_sampled, s.lengths)] == pointers
        assert {k: tuple(v.shape) for k, v in out.data.items()} == {
            k: (16, 3, *f.shape) for k, f in SIG.items()}
        assert all(v.device == s.keys.device for v in out.data.values())
        assert out.table_size == s.table_size == t.size
        assert_holds_items(out, spans)
        items = {k: (p, n) for k, p, _, n in t.items()}
        total = sum(p for p, _ in items.values())
        for key, prob, prio, length in zip(*(host(x) for x in (out.keys, out.probabilities, out.priorities,
                                                                 out.lengths))):
            assert (prio, length) == items[int(key)]
            assert prob == pytest.approx(prio / total)
        keys += host(out.keys).tolist()
    s.close()
    assert t.info()["num_samples"] == 80
    counted = {k: n for k, _, n, _ in t.items()}
    assert sum(counted.values()) == 80
    assert all(counted[k] == keys.count(k) for k in set(keys))


def test_times_sampled_counts_each_draw_in_batch_order(backend, make_store):
    store = make_store()
    t = table(store)
    t.insert({"x": np.arange(1).reshape(1, 1)}, priorities=1.0)
    s = t.static_sample(4)
    assert host(s.admit().draw().times_sampled).tolist() == [1, 2, 3, 4]
    assert host(s.admit().draw().times_sampled).tolist() == [5, 6, 7, 8]
    assert t.items()[0][2] == 8


def test_uniform_draws_are_uniform(backend, make_store):
    store = make_store(capacity=256)
    t = table(store, max_size=50)
    t.insert({"x": np.arange(50).reshape(50, 1)}, priorities=1.0)
    t.delete([t.items()[7][0]])  # a hole: the draw descends the sum tree
    s = t.static_sample(500, fields=["x"])
    counts = np.zeros(50)
    for _ in range(20):
        x = host(s.admit().draw().data["x"]).reshape(-1)
        np.add.at(counts, x, 1)
    assert counts[7] == 0
    ok, stat, crit = chi_square_ok(np.delete(counts, 7), np.full(49, 10_000 / 49))
    assert ok, (stat, crit)


def test_rows_stay_reserved_until_the_next_admission(backend, make_store):
    """Between admit() and the gather the items are evicted and writers overwrite
    every free block: the gather still reads the admitted items. After the next
    admission (work on the stream done) the blocks are free again.

    16 blocks of 4 steps; two episodes of 7 steps fill 2 blocks each. The admission
    holds those 4 (in limbo once the reset frees them), so writers take exactly the
    other 12: 48 one-step episodes, then ``ResourceExhausted``."""
    store = make_store(SIG, capacity=64, block_steps=4)
    t = table(store, max_size=60)
    fill(store, [t], episodes=2)
    spans = item_steps(t, episodes=2)
    assert (store.num_blocks, store.free_blocks) == (16, 12)
    s = t.static_sample(32, steps=3)
    s.admit()
    t.reset()
    assert store._native.limbo_blocks == 4 and store.free_blocks == 12
    assert overwrite_free_blocks(store, 10_000) == 12 * 4
    assert_holds_items(s.draw(), spans)
    with pytest.raises(rp.errors.Timeout):  # the table is empty now
        s.admit(timeout=0.05)
    s.close()
    assert wait_released(10)
    assert store.free_blocks == store.num_blocks and store._native.limbo_blocks == 0


def test_a_timeout_returns_an_ordinary_sample_of_the_admitted_draws(backend, make_store):
    """The limiter allows 10 samples: two admissions of 4, then one stopped after
    2 (an ordinary Sample of them in ``partial``), then none. Stopped admissions
    leave the buffers as the last whole one wrote them."""
    store = make_store()
    t = table(store, rate_limiter=rp.rate_limiters.SampleToInsertRatio(1.0, 1, 6.0))
    t.insert({"x": np.arange(5).reshape(5, 1)}, priorities=1.0)
    s = t.static_sample(4)
    s.admit()
    before = host(s.admit().draw().data["x"]).copy()
    keys = host(s.keys).copy()
    with pytest.raises(rp.errors.Timeout, match="2 of 4 samples were possible") as err:
        s.admit(timeout=0.05)
    partial = err.value.partial
    assert isinstance(partial, rp.Sample) and isinstance(partial.keys, np.ndarray) and len(partial.keys) == 2
    order = {k: i for i, (k, *_) in enumerate(t.items())}
    np.testing.assert_array_equal(host(partial.data["x"]), [[order[int(k)]] for k in partial.keys])
    with pytest.raises(rp.errors.Timeout, match="0 of 4") as err:
        s.admit(timeout=0.05)
    assert err.value.partial is None
    assert t.info()["num_samples"] == 10
    np.testing.assert_array_equal(host(s.keys), keys)
    np.testing.assert_array_equal(host(s.draw().data["x"]), before)
    s.close()


def test_items_longer_than_steps_are_refused_and_nothing_changes(backend, make_store):
    store = make_store(capacity=64, block_steps=4)
    t = table(store)
    t.insert({"x": np.arange(4).reshape(2, 2)}, priorities=1.0)
    s = t.static_sample(3, steps=1)
    with pytest.raises(rp.errors.InvalidArgument, match="holds an item of 2 steps; draws of at most 1 steps"):
        s.admit()
    assert t.info()["num_samples"] == 0
    with pytest.raises(rp.errors.InvalidArgument, match="draw\\(\\) before any admit\\(\\)"):
        s.draw()
    out = t.static_sample(3, steps=2).admit().draw()
    assert host(out.lengths).tolist() == [2, 2, 2]


def test_bad_arguments_name_what_was_expected(backend, make_store):
    store = make_store()
    host_table = rp.Table("h", store)
    with pytest.raises(rp.errors.InvalidArgument, match="cannot make a static sample.*selects on the host"):
        host_table.static_sample(4)
    limited = table(store, max_times_sampled=2, name="limited")
    with pytest.raises(rp.errors.InvalidArgument, match="max_times_sampled is 2"):
        limited.static_sample(4)
    t = table(store)
    t.insert({"x": np.arange(3).reshape(3, 1)}, priorities=1.0)
    with pytest.raises(rp.errors.InvalidArgument, match="batch_size"):
        t.static_sample(0)
    with pytest.raises(rp.errors.InvalidArgument, match="steps"):
        t.static_sample(4, steps=0)
    with pytest.raises(rp.errors.NotFound, match="unknown field 'y'"):
        t.static_sample(4, fields=["y"])
    s = t.static_sample(4)
    s.close()
    with pytest.raises(rp.errors.InvalidArgument, match="admit\\(\\) after close\\(\\)"):
        s.admit()
    assert t.info()["num_samples"] == 0


@pytest.mark.skipif(not HAS_CUDA, reason="a CUDA graph needs a CUDA device")
def test_a_captured_training_step_samples_on_every_replay(make_store):
    """The gather captured in a CUDA graph with the computation that uses it: each
    replay after an admit() computes on that admission's items."""
    rt.emulate_cuda(False)
    store = make_store({"x": rp.Field((4,), "float32")}, capacity=4096)
    t = table(store, max_size=1000)
    values = np.arange(1000, dtype=np.float32)
    t.insert({"x": np.repeat(values[:, None, None], 4, axis=2)}, priorities=1.0)
    s = t.static_sample(256)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as torch's graph docs ask
        s.admit().draw()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = s.draw()
        total = out.data["x"].sum(dim=(1, 2))
    for _ in range(3):
        s.admit()
        graph.replay()
        torch.cuda.synchronize()
        keys = host(s.keys).astype(np.int64)
        order = {k: i for i, (k, *_) in enumerate(t.items())}
        want = np.array([4 * values[order[k]] for k in keys])
        np.testing.assert_array_equal(host(total), want)
    s.close()
    assert wait_released(10)

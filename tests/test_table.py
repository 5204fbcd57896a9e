"""Table: selectors as samplers and removers, eviction, sampling, priorities, deletes, batch insert."""

import numpy as np
import pytest
from conftest import insert_scalars

import reprise as rp

S = rp.selectors


def table_of(store, sampler=None, remover=None, max_size=100, name="t", **kwargs):
    return rp.Table(name, store, sampler=sampler, remover=remover, max_size=max_size, **kwargs)


def keys_of(table):
    return [k for k, *_ in table.items()]


def x_of(sample):
    return sample.data["x"][:, 0].tolist()


# --- selectors as samplers ----------------------------------------------------------------------


def test_fifo_sampler_returns_the_oldest_item_with_probability_one(scalar_store):
    t = table_of(scalar_store, sampler=S.Fifo())
    keys = insert_scalars(t, [10, 11, 12])
    s = t.sample(4)
    assert s.keys.tolist() == [keys[0]] * 4
    assert x_of(s) == [10] * 4
    assert s.probabilities.tolist() == [1.0] * 4
    t.delete([keys[0]])
    assert x_of(t.sample(1)) == [11]


def test_lifo_sampler_returns_the_newest_item(scalar_store):
    t = table_of(scalar_store, sampler=S.Lifo())
    keys = insert_scalars(t, [10, 11, 12])
    s = t.sample(2)
    assert s.keys.tolist() == [keys[2]] * 2
    assert s.probabilities.tolist() == [1.0, 1.0]
    t.delete([keys[2]])
    assert x_of(t.sample(1)) == [11]


def test_max_heap_sampler_returns_the_highest_priority_oldest_first_on_ties(scalar_store):
    t = table_of(scalar_store, sampler=S.MaxHeap())
    keys = insert_scalars(t, [0, 1, 2, 3], priorities=[1.0, 5.0, 5.0, 2.0])
    assert t.sample(1).keys.tolist() == [keys[1]]
    t.update_priorities([keys[3]], [9.0])
    s = t.sample(2)
    assert s.keys.tolist() == [keys[3]] * 2
    assert s.priorities.tolist() == [9.0, 9.0]
    assert s.probabilities.tolist() == [1.0, 1.0]
    t.update_priorities([keys[3]], [0.0])
    assert t.sample(1).keys.tolist() == [keys[1]]
    t.delete([keys[1]])
    assert t.sample(1).keys.tolist() == [keys[2]]


def test_min_heap_sampler_returns_the_lowest_priority_oldest_first_on_ties(scalar_store):
    t = table_of(scalar_store, sampler=S.MinHeap())
    keys = insert_scalars(t, [0, 1, 2, 3], priorities=[3.0, 0.5, 0.5, 2.0])
    assert t.sample(1).keys.tolist() == [keys[1]]
    t.update_priorities([keys[0]], [0.1])
    assert t.sample(1).keys.tolist() == [keys[0]]
    t.delete([keys[0], keys[1]])
    assert t.sample(1).keys.tolist() == [keys[2]]


def test_uniform_sampler_reports_one_over_size_and_returns_present_items(scalar_store):
    t = table_of(scalar_store, sampler=S.Uniform(), seed=1)
    keys = insert_scalars(t, range(8))
    s = t.sample(200)
    assert set(s.keys.tolist()) <= set(keys.tolist())
    assert len(set(s.keys.tolist())) == 8  # 200 draws from 8 items reach them all
    np.testing.assert_allclose(s.probabilities, 1 / 8)
    assert s.table_size == 8
    # The data of each drawn item is that item's step.
    by_key = dict(zip(keys.tolist(), range(8)))
    assert x_of(s) == [by_key[k] for k in s.keys.tolist()]


def test_prioritized_sampler_never_picks_zero_priority_items(scalar_store):
    t = table_of(scalar_store, sampler=S.Prioritized(0.5), seed=2)
    keys = insert_scalars(t, range(4), priorities=[0.0, 4.0, 0.0, 1.0])
    s = t.sample(500)
    assert set(s.keys.tolist()) == {keys[1], keys[3]}
    expected = {keys[1]: 2.0 / 3.0, keys[3]: 1.0 / 3.0}
    np.testing.assert_allclose(s.probabilities, [expected[k] for k in s.keys.tolist()], rtol=1e-12)


def test_prioritized_sampler_with_all_zero_priorities_is_uniform(scalar_store):
    t = table_of(scalar_store, sampler=S.Prioritized(0.6), seed=3)
    keys = insert_scalars(t, range(5), priorities=0.0)
    s = t.sample(300)
    assert set(s.keys.tolist()) == set(keys.tolist())
    np.testing.assert_allclose(s.probabilities, 0.2)


def test_prioritized_sampler_follows_priority_updates(scalar_store):
    t = table_of(scalar_store, sampler=S.Prioritized(1.0), seed=4)
    keys = insert_scalars(t, range(3), priorities=[1.0, 1.0, 1.0])
    t.update_priorities(keys, [0.0, 0.0, 3.0])
    s = t.sample(50)
    assert s.keys.tolist() == [keys[2]] * 50
    assert s.priorities.tolist() == [3.0] * 50
    np.testing.assert_allclose(s.probabilities, 1.0)


# --- selectors as removers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "remover, priorities, evicted",
    [
        (S.Fifo(), [1.0, 1.0, 1.0], 0),
        (S.Lifo(), [1.0, 1.0, 1.0], 2),
        (S.MaxHeap(), [1.0, 7.0, 3.0], 1),
        (S.MinHeap(), [4.0, 7.0, 3.0], 2),
        (S.Prioritized(1.0), [0.0, 2.0, 0.0], 1),
        (S.MaxHeap(), [5.0, 5.0, 1.0], 0),  # ties: oldest first
    ],
)
def test_remover_picks_the_item_to_evict_when_the_table_is_full(scalar_store, remover, priorities, evicted):
    t = table_of(scalar_store, sampler=S.Fifo(), remover=remover, max_size=3)
    keys = insert_scalars(t, [0, 1, 2], priorities=priorities).tolist()
    (new,) = insert_scalars(t, [3], priorities=[1.0]).tolist()
    expected = [k for i, k in enumerate(keys) if i != evicted] + [new]
    assert keys_of(t) == expected
    assert t.size == 3
    assert t.info()["num_evictions"] == 1


def test_uniform_remover_evicts_exactly_one_existing_item(scalar_store):
    t = table_of(scalar_store, remover=S.Uniform(), max_size=4, seed=5)
    seen = set()
    for round_ in range(30):
        before = set(keys_of(t))
        (new,) = insert_scalars(t, [round_]).tolist()
        after = set(keys_of(t))
        assert new in after
        if len(before) == 4:
            gone = before - after
            assert len(gone) == 1
            seen |= gone
        assert t.size == min(round_ + 1, 4)
    assert len(seen) > 4  # not always the same slot pattern
    assert t.info()["num_evictions"] == 26


def test_max_size_bounds_the_table_and_counts_evictions(scalar_store):
    t = table_of(scalar_store, sampler=S.Fifo(), remover=S.Fifo(), max_size=5)
    for i in range(12):
        insert_scalars(t, [i])
        assert t.size == min(i + 1, 5)
    assert [x for x in x_of(t.sample(1))] == [7]
    info = t.info()
    assert (info["size"], info["max_size"], info["num_inserts"], info["num_evictions"]) == (5, 5, 12, 7)
    assert len(t) == 5


def test_batch_insert_into_a_full_table_evicts_in_order(scalar_store):
    t = table_of(scalar_store, sampler=S.Fifo(), remover=S.Fifo(), max_size=3)
    keys = insert_scalars(t, range(5)).tolist()
    assert keys_of(t) == keys[2:]


def test_table_max_size_larger_than_store_capacity_is_rejected(make_store):
    store = make_store(capacity=100, block_steps=10)
    with pytest.raises(rp.errors.InvalidArgument, match=r"'big'.*max_size 101.*100 steps"):
        rp.Table("big", store, max_size=101)
    assert rp.Table("fits", store, max_size=100).info()["max_size"] == 100
    assert rp.Table("default", store).info()["max_size"] == store.capacity


# --- max_times_sampled, queue, stack ----------------------------------------------------------


def test_max_times_sampled_removes_items_after_that_many_draws(scalar_store):
    t = table_of(scalar_store, sampler=S.Fifo(), max_times_sampled=2)
    keys = insert_scalars(t, [0, 1, 2]).tolist()
    s = t.sample(5)
    assert s.keys.tolist() == [keys[0], keys[0], keys[1], keys[1], keys[2]]
    assert s.times_sampled.tolist() == [1, 2, 1, 2, 1]
    assert x_of(s) == [0, 0, 1, 1, 2]
    assert t.items() == [(keys[2], 1.0, 1, 1)]
    assert t.info()["num_evictions"] == 2
    assert t.info()["num_samples"] == 5


def test_times_sampled_counts_draws_including_this_one(scalar_store):
    t = table_of(scalar_store, sampler=S.Fifo())
    (key,) = insert_scalars(t, [0]).tolist()
    assert t.sample(3).times_sampled.tolist() == [1, 2, 3]
    assert t.sample(1).times_sampled.tolist() == [4]
    assert t.items() == [(key, 1.0, 4, 1)]


def test_queue_returns_items_in_insertion_order_once_each(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=10)
    insert_scalars(q, range(6))
    assert x_of(q.sample(2)) == [0, 1]
    insert_scalars(q, [6])
    assert x_of(q.sample(5)) == [2, 3, 4, 5, 6]
    assert q.size == 0
    info = q.info()
    assert info["max_times_sampled"] == 1 and info["sampler"] == "Fifo()" and info["remover"] == "Fifo()"


def test_stack_returns_the_newest_item_first_once_each(scalar_store):
    st = rp.Table.stack("s", scalar_store, max_size=10)
    insert_scalars(st, range(4))
    assert x_of(st.sample(2)) == [3, 2]
    insert_scalars(st, [9])
    assert x_of(st.sample(3)) == [9, 1, 0]
    assert st.size == 0
    assert st.info()["sampler"] == "Lifo()"


def test_queue_blocks_inserts_when_full_and_samples_when_empty(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=2)
    insert_scalars(q, [0, 1])
    with pytest.raises(rp.errors.Timeout):
        q.insert({"x": np.array([[2]])}, 1.0, timeout=0)
    assert x_of(q.sample(2, timeout=0)) == [0, 1]
    with pytest.raises(rp.errors.Timeout):
        q.sample(1, timeout=0)


# --- seeds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampler", [S.Uniform(), S.Prioritized(0.7)])
def test_same_seed_gives_the_same_key_sequence(scalar_store, sampler):
    def run(name, seed):
        t = table_of(scalar_store, sampler=sampler, name=name, seed=seed)
        insert_scalars(t, range(20), priorities=np.linspace(0.5, 3.0, 20))
        return [t.sample(7).keys.tolist() for _ in range(10)]

    assert run("a", 1234) == run("b", 1234)
    assert run("c", 1234) != run("d", 4321)


def test_uniform_remover_is_reproducible_with_a_seed(scalar_store):
    def run(name):
        t = table_of(scalar_store, remover=S.Uniform(), max_size=5, name=name, seed=9)
        insert_scalars(t, range(40))
        return keys_of(t)

    assert run("a") == run("b")


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_bad_seed_is_rejected(scalar_store, seed):
    with pytest.raises(rp.errors.InvalidArgument, match="seed"):
        table_of(scalar_store, seed=seed)


# --- sample contents ------------------------------------------------------------------------------


def test_sample_fields_limits_the_copied_fields(make_store):
    sig = {"obs": rp.Field((3,), "float32"), "a": rp.Field((), "int64"), "r": rp.Field((), "float32")}
    store = make_store(sig, capacity=64, block_steps=8)
    t = table_of(store, sampler=S.Fifo(), max_size=8)
    t.insert({"obs": np.ones((1, 2, 3), np.float32), "a": np.array([[4, 5]]), "r": np.zeros((1, 2), np.float32)}, 1.0)
    s = t.sample(2, fields=["a"])
    assert list(s.data) == ["a"]
    assert s.data["a"].tolist() == [[4, 5], [4, 5]]
    s = t.sample(1, fields=["r", "obs"])
    assert set(s.data) == {"r", "obs"}
    assert s.data["obs"].shape == (1, 2, 3)
    s = t.sample(1, fields=[])
    assert s.data == {} and len(s) == 1


def test_sample_fields_unknown_name_is_not_found_and_draws_nothing(scalar_store):
    t = table_of(scalar_store, sampler=S.Fifo())
    insert_scalars(t, [1])
    with pytest.raises(rp.errors.NotFound, match="'nope'"):
        t.sample(1, fields=["nope"])
    assert t.info()["num_samples"] == 0
    assert t.items()[0][2] == 0


def test_ragged_items_are_zero_padded_with_their_lengths(make_store):
    sig = {"x": rp.Field((), "int64"), "v": rp.Field((2,), "float32")}
    store = make_store(sig, capacity=256, block_steps=4)
    t = table_of(store, sampler=S.Fifo(), max_times_sampled=1)
    with store.writer() as w:
        for i in range(1, 6):
            w.append({"x": i, "v": [i, -i]})
        w.create_item(t, num_steps=1, priority=1.0)
        w.create_item(t, num_steps=3, priority=1.0)
        w.create_item(t, num_steps=2, priority=1.0)
    s = t.sample(3)
    assert s.lengths.tolist() == [1, 3, 2]
    assert s.data["x"].tolist() == [[5, 0, 0], [3, 4, 5], [4, 5, 0]]
    assert s.data["v"].shape == (3, 3, 2)
    np.testing.assert_array_equal(s.data["v"][0], [[5, -5], [0, 0], [0, 0]])
    np.testing.assert_array_equal(s.data["v"][2], [[4, -4], [5, -5], [0, 0]])


def test_sample_metadata_has_documented_dtypes_and_shapes(scalar_store):
    t = table_of(scalar_store, sampler=S.Prioritized(1.0), seed=0)
    insert_scalars(t, range(3), priorities=[1.0, 2.0, 3.0])
    s = t.sample(4)
    assert len(s) == 4
    assert s.keys.dtype == np.uint64 and s.keys.shape == (4,)
    assert s.probabilities.dtype == np.float64
    assert s.priorities.dtype == np.float64
    assert s.times_sampled.dtype == np.int64
    assert s.lengths.dtype == np.int64 and s.lengths.tolist() == [1] * 4
    assert s.table_size == 3 and isinstance(s.table_size, int)
    assert s.data["x"].shape == (4, 1) and s.data["x"].dtype == np.int64
    w = s.importance_weights(beta=0.5)
    expected = (3 * s.probabilities) ** -0.5
    np.testing.assert_allclose(w, expected / expected.max())
    assert "n=4" in repr(s)


@pytest.mark.parametrize("n", [0, -1])
def test_sample_size_must_be_positive(scalar_store, n):
    t = table_of(scalar_store)
    insert_scalars(t, [0])
    with pytest.raises(rp.errors.InvalidArgument, match=f"sample size.*{n}"):
        t.sample(n)


def test_sample_rejects_non_integer_sizes_and_negative_timeouts(scalar_store):
    t = table_of(scalar_store)
    insert_scalars(t, [0])
    with pytest.raises(rp.errors.InvalidArgument, match="n must be an integer"):
        t.sample(1.0)
    with pytest.raises(rp.errors.InvalidArgument, match="timeout"):
        t.sample(1, timeout=-0.5)


# --- update_priorities and delete ----------------------------------------------------------------


def test_update_priorities_skips_stale_keys_and_returns_the_count(scalar_store):
    t = table_of(scalar_store, sampler=S.MaxHeap(), remover=S.Fifo(), max_size=2)
    k0, k1, k2 = insert_scalars(t, [0, 1, 2]).tolist()  # k0 evicted
    assert t.update_priorities([k0, k1, k2], [9.0, 2.0, 3.0]) == 2
    assert t.items() == [(k1, 2.0, 0, 1), (k2, 3.0, 0, 1)]
    assert t.update_priorities(np.array([k0], dtype=np.uint64), [1.0]) == 0
    assert t.update_priorities([], []) == 0


def test_update_priorities_broadcasts_one_number(scalar_store):
    t = table_of(scalar_store)
    keys = insert_scalars(t, range(3))
    assert t.update_priorities(keys, 4.5) == 3
    assert [p for _, p, _, _ in t.items()] == [4.5] * 3


def test_delete_skips_stale_keys_and_returns_the_count(scalar_store):
    t = table_of(scalar_store, max_size=2)
    k0, k1, k2 = insert_scalars(t, [0, 1, 2]).tolist()
    assert t.delete([k0, k1]) == 1
    assert t.delete([k1]) == 0
    assert t.delete([k2, k2]) == 1
    assert t.size == 0
    assert t.info()["num_deletes"] == 2
    assert scalar_store.free_blocks == scalar_store.num_blocks - 1  # the bulk cursor's block


def test_a_reused_slot_does_not_revive_an_old_key(scalar_store):
    t = table_of(scalar_store, sampler=S.Fifo())
    (old,) = insert_scalars(t, [0]).tolist()
    assert t.delete([old]) == 1
    (new,) = insert_scalars(t, [1], priorities=2.0).tolist()
    assert new != old
    assert t.update_priorities([old], [7.0]) == 0
    assert t.delete([old]) == 0
    assert t.items() == [(new, 2.0, 0, 1)]


def test_deleted_items_are_never_sampled(scalar_store):
    t = table_of(scalar_store, sampler=S.Uniform(), seed=0)
    keys = insert_scalars(t, range(6)).tolist()
    t.delete(keys[::2])
    assert set(t.sample(100).keys.tolist()) == set(keys[1::2])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), -0.5])
def test_bad_priority_updates_name_the_key_and_change_nothing(scalar_store, bad):
    t = table_of(scalar_store, sampler=S.Prioritized(1.0), max_size=2)
    k0, k1, k2 = insert_scalars(t, [0, 1, 2], priorities=[1.0, 2.0, 3.0]).tolist()
    before = t.items()
    with pytest.raises(rp.errors.InvalidArgument, match=f"key {k2}.*priority") as e:
        t.update_priorities([k1, k0, k2], [5.0, 6.0, bad])
    assert "finite and >= 0" in str(e.value)
    assert t.items() == before
    s = t.sample(200)
    np.testing.assert_allclose(s.probabilities, [{k1: 0.4, k2: 0.6}[k] for k in s.keys.tolist()])


def test_priority_that_overflows_under_the_exponent_is_rejected(scalar_store):
    t = table_of(scalar_store, sampler=S.Prioritized(2.0))
    with pytest.raises(rp.errors.InvalidArgument, match="overflows"):
        insert_scalars(t, [0], priorities=1e200)
    (k,) = insert_scalars(t, [0], priorities=1.0).tolist()
    with pytest.raises(rp.errors.InvalidArgument, match=f"key {k}.*overflows"):
        t.update_priorities([k], [1e200])
    assert t.items() == [(k, 1.0, 0, 1)]


@pytest.mark.parametrize("keys", [[-1], [[1, 2]], ["a"], [1.5]])
def test_bad_keys_are_rejected(scalar_store, keys):
    t = table_of(scalar_store)
    insert_scalars(t, [0])
    with pytest.raises(rp.errors.InvalidArgument, match="keys"):
        t.delete(keys)
    assert t.size == 1


def test_update_priorities_needs_one_priority_per_key(scalar_store):
    t = table_of(scalar_store)
    keys = insert_scalars(t, range(3))
    with pytest.raises(rp.errors.InvalidArgument, match="expected 3 priorities"):
        t.update_priorities(keys, [1.0, 2.0])
    assert [p for _, p, _, _ in t.items()] == [1.0] * 3


# --- reset and info -------------------------------------------------------------------------------


def test_reset_removes_every_item_and_restarts_the_limiter(scalar_store):
    t = table_of(scalar_store, sampler=S.Fifo())
    keys = insert_scalars(t, range(10))
    t.sample(3)
    t.reset()
    assert t.size == 0 and t.items() == []
    assert t.update_priorities(keys, 1.0) == 0
    assert t.delete(keys) == 0
    rl = t.info()["rate_limiter"]
    assert (rl["inserts"], rl["samples"]) == (0, 0)
    assert scalar_store.free_blocks == scalar_store.num_blocks - 1  # the bulk cursor's block
    with pytest.raises(rp.errors.Timeout):
        t.sample(1, timeout=0)
    insert_scalars(t, [42])
    assert x_of(t.sample(1)) == [42]


def test_info_reports_the_documented_keys(scalar_store):
    t = table_of(scalar_store, max_size=50,
                 rate_limiter=rp.rate_limiters.SampleToInsertRatio(2.0, 3, 10.0))
    insert_scalars(t, range(4))
    t.sample(2)
    info = t.info()
    for key in ("size", "max_size", "num_inserts", "num_samples", "num_evictions", "rate_limiter"):
        assert key in info
    rl = info["rate_limiter"]
    for key in ("samples_per_insert", "min_size_to_sample", "blocked_insert_seconds", "blocked_sample_seconds"):
        assert key in rl
    assert (info["size"], info["max_size"], info["num_inserts"], info["num_samples"], info["num_evictions"]) == (4, 50, 4, 2, 0)
    assert (rl["samples_per_insert"], rl["min_size_to_sample"]) == (2.0, 3)
    assert rl["blocked_insert_seconds"] >= 0.0 and rl["blocked_sample_seconds"] >= 0.0
    assert info["name"] == "t"


def test_repr_names_table_selectors_and_sizes(scalar_store):
    t = table_of(scalar_store, sampler=S.Prioritized(0.6), remover=S.Fifo(), max_size=7, name="replay")
    insert_scalars(t, [1])
    r = repr(t)
    assert "'replay'" in r and "Prioritized(priority_exponent=0.6)" in r and "Fifo()" in r
    assert "size=1" in r and "max_size=7" in r


# --- constructor validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (lambda: dict(max_size=0), "max_size"),
        (lambda: dict(max_size=-3), "max_size"),
        (lambda: dict(max_size=2.5), "max_size"),
        (lambda: dict(max_times_sampled=-1), "max_times_sampled"),
        (lambda: dict(sampler="Uniform"), "sampler"),
        (lambda: dict(remover=S.Fifo), "remover"),
        (lambda: dict(rate_limiter=5), "rate_limiter"),
        (lambda: dict(sampler=S.Prioritized(-1.0)), "priority_exponent.*-1"),
        (lambda: dict(sampler=S.Prioritized(float("nan"))), "priority_exponent.*nan"),
        (lambda: dict(selection_device="tpu"), "selection_device"),
    ],
)
def test_bad_table_arguments_are_rejected_naming_them(scalar_store, kwargs, match):
    # A bad selector may be refused when it is built or when the table is.
    with pytest.raises(rp.errors.InvalidArgument, match=f"(?i){match}"):
        rp.Table("t", scalar_store, **kwargs())
    rp.Table("t", scalar_store)  # the failed attempt did not take the name


@pytest.mark.parametrize("name", ["", None, 3])
def test_table_name_must_be_a_non_empty_string(scalar_store, name):
    with pytest.raises(rp.errors.InvalidArgument, match="name"):
        rp.Table(name, scalar_store)


def test_table_needs_a_reprise_store():
    with pytest.raises(rp.errors.InvalidArgument, match="Store"):
        rp.Table("t", object())


# --- batch insert ---------------------------------------------------------------------------------


@pytest.fixture
def two_field_store(make_store):
    return make_store({"obs": rp.Field((2,), "float32"), "a": rp.Field((), "int64")}, capacity=1024, block_steps=8)


def test_batch_insert_stores_each_item_as_its_own_episode(two_field_store):
    t = table_of(two_field_store, sampler=S.Fifo(), max_times_sampled=1)
    obs = np.arange(3 * 4 * 2, dtype=np.float32).reshape(3, 4, 2)
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    keys = t.insert({"obs": obs, "a": a}, priorities=[1.0, 2.0, 3.0])
    assert keys.dtype == np.uint64 and keys.shape == (3,)
    assert t.items() == [(int(k), float(i + 1), 0, 4) for i, k in enumerate(keys)]
    s = t.sample(3)
    np.testing.assert_array_equal(s.data["obs"], obs)
    np.testing.assert_array_equal(s.data["a"], a)
    assert s.keys.tolist() == keys.tolist()


def test_batch_insert_of_items_longer_than_a_block(two_field_store):
    t = table_of(two_field_store, sampler=S.Fifo(), max_times_sampled=1)
    a = np.arange(5 * 13, dtype=np.int64).reshape(5, 13)
    t.insert({"obs": np.zeros((5, 13, 2), np.float32), "a": a}, 1.0)
    np.testing.assert_array_equal(t.sample(5).data["a"], a)


def test_batch_insert_accepts_lists_and_broadcast_priorities(two_field_store):
    t = table_of(two_field_store, sampler=S.Fifo())
    keys = t.insert({"obs": [[[1.0, 2.0]], [[3.0, 4.0]]], "a": [[1], [2]]}, 0.5)
    assert [p for _, p, _, _ in t.items()] == [0.5, 0.5]
    assert len(keys) == 2


def _assert_unchanged(table, store, size, free, inserts):
    assert table.size == size
    assert store.free_blocks == free
    assert table.info()["num_inserts"] == inserts


@pytest.mark.parametrize(
    "data, match",
    [
        ({"obs": np.zeros((3, 4, 2), np.float32), "a": np.zeros((2, 4), np.int64)}, r"'a' has \[n, T\] = \[2, 4\].*'obs' has \[3, 4\]"),
        ({"obs": np.zeros((3, 4, 2), np.float32), "a": np.zeros((3, 5), np.int64)}, r"'a' has \[n, T\] = \[3, 5\]"),
        ({"obs": np.zeros((3, 4, 2), np.float64), "a": np.zeros((3, 4), np.int64)}, r"field 'obs' expects float32\[n,T,2\], got float64\[3,4,2\]"),
        ({"obs": np.zeros((3, 4, 3), np.float32), "a": np.zeros((3, 4), np.int64)}, r"field 'obs' expects float32\[n,T,2\], got float32\[3,4,3\]"),
        ({"obs": np.zeros((4, 2), np.float32), "a": np.zeros((3, 4), np.int64)}, r"field 'obs' expects float32\[n,T,2\]"),
        ({"obs": np.zeros((3, 4, 2), np.float32), "a": np.zeros((3, 4), np.int32)}, r"field 'a' expects int64\[n,T\], got int32\[3,4\]"),
        ({"obs": np.zeros((3, 4, 2), np.float32)}, r"missing field 'a'"),
    ],
)
def test_batch_insert_shape_and_dtype_errors_change_nothing(two_field_store, data, match):
    t = table_of(two_field_store)
    insert_ok = {"obs": np.zeros((1, 1, 2), np.float32), "a": np.zeros((1, 1), np.int64)}
    t.insert(insert_ok, 1.0)
    before = (t.size, two_field_store.free_blocks, 1)
    with pytest.raises(rp.errors.InvalidArgument, match=match):
        t.insert(data, 1.0)
    _assert_unchanged(t, two_field_store, *before)


def test_batch_insert_unknown_field_is_not_found(two_field_store):
    t = table_of(two_field_store)
    data = {"obs": np.zeros((1, 1, 2), np.float32), "a": np.zeros((1, 1), np.int64), "b": np.zeros((1, 1))}
    free = two_field_store.free_blocks
    with pytest.raises(rp.errors.NotFound, match="'b'"):
        t.insert(data, 1.0)
    _assert_unchanged(t, two_field_store, 0, free, 0)


@pytest.mark.parametrize("priorities, match", [([1.0, 2.0], "expected 3 priorities"), ([1.0, float("nan"), 1.0], "item 1.*priority"), ([[1.0, 2.0, 3.0]], "priorities")])
def test_batch_insert_priority_errors_change_nothing(two_field_store, priorities, match):
    t = table_of(two_field_store)
    free = two_field_store.free_blocks
    data = {"obs": np.zeros((3, 2, 2), np.float32), "a": np.zeros((3, 2), np.int64)}
    with pytest.raises(rp.errors.InvalidArgument, match=match):
        t.insert(data, priorities)
    _assert_unchanged(t, two_field_store, 0, free, 0)


def test_batch_insert_of_zero_step_items_is_rejected(two_field_store):
    t = table_of(two_field_store)
    with pytest.raises(rp.errors.InvalidArgument, match=">= 1 step"):
        t.insert({"obs": np.zeros((2, 0, 2), np.float32), "a": np.zeros((2, 0), np.int64)}, 1.0)
    assert t.size == 0


def test_batch_insert_of_zero_items_returns_no_keys(two_field_store):
    t = table_of(two_field_store)
    keys = t.insert({"obs": np.zeros((0, 3, 2), np.float32), "a": np.zeros((0, 3), np.int64)}, [])
    assert keys.tolist() == [] and t.size == 0


def test_native_insert_returns_each_items_first_store_row():
    """``Table.insert(..., rows=True)`` (the batched insert a position-addressed storage
    uses) returns beside the keys the store row of each item's first step: reading the
    store there gives back what was inserted, items of one step or several."""
    from reprise.transitions import _host_columns
    store = rp.Store({"x": rp.Field((3,), "int64")}, capacity=256, block_steps=8)
    try:
        t = rp.Table("t", store, max_size=100)
        for n, steps in ((5, 1), (7, 3), (1, 2)):
            data = {"x": np.arange(n * steps * 3, dtype=np.int64).reshape(n, steps, 3) + 1000 * n}
            keys, rows = t._native.insert(data, np.ones(n), None, True)
            assert keys.dtype == np.uint64 and rows.dtype == np.int64 and rows.shape == keys.shape == (n,)
            column, dtype, shape = _host_columns(store)["x"]
            for i in range(n):
                first = column[rows[i]].view(dtype).reshape(shape)
                assert np.array_equal(first, data["x"][i, 0]), (n, steps, i)
        assert isinstance(t._native.insert({"x": np.zeros((2, 1, 3), np.int64)}, np.ones(2)), np.ndarray)
    finally:
        store.close()

"""Writer: steps in, items over the last steps of an episode out, for any table on the store."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reprise as rp

ATARI = {
    "obs": rp.Field((4, 84, 84), "uint8"),
    "action": rp.Field((), "int64"),
    "reward": rp.Field((), "float32"),
}


def fifo_table(store, name="t"):
    """Fifo sampler, each item sampled once: ``drain`` reads items back in insertion order."""
    return rp.Table(name, store, sampler=rp.selectors.Fifo(), remover=rp.selectors.Fifo(),
                    max_size=min(256, store.capacity), max_times_sampled=1)


def drain(table):
    """Every item of a ``fifo_table``, oldest first, as ``[{field: array[length, ...]}]``."""
    n = table.size
    if n == 0:
        return []
    s = table.sample(n, timeout=0)
    return [{f: s.data[f][i, : s.lengths[i]] for f in s.data} for i in range(n)]


def x_values(table):
    return [item["x"].tolist() for item in drain(table)]


def atari_step(i):
    return {
        "obs": np.full((4, 84, 84), i % 256, dtype=np.uint8),
        "action": np.int64(i),
        "reward": np.float32(i / 2),
    }


# --- windows -----------------------------------------------------------------------------------


def test_append_then_create_item_covers_the_last_steps(scalar_store):
    table = fifo_table(scalar_store)
    with scalar_store.writer() as w:
        for i in range(5):
            w.append({"x": i})
        w.create_item(table, num_steps=3, priority=1.0)
        w.create_item(table, num_steps=1, priority=1.0)
        w.create_item(table, num_steps=5, priority=1.0)
    assert x_values(table) == [[2, 3, 4], [4], [0, 1, 2, 3, 4]]


def test_extend_appends_t_steps_in_order(scalar_store):
    table = fifo_table(scalar_store)
    with scalar_store.writer() as w:
        w.extend({"x": np.arange(10, 20, dtype=np.int64)})
        assert w.episode_steps == 10
        w.create_item(table, num_steps=4, priority=1.0)
        w.append({"x": 99})
        w.create_item(table, num_steps=3, priority=1.0)
    assert x_values(table) == [[16, 17, 18, 19], [18, 19, 99]]


def test_items_spanning_several_blocks_read_back_in_order(make_store):
    store = make_store({"x": rp.Field((), "int64")}, capacity=512, block_steps=3)
    table = fifo_table(store)
    with store.writer() as w:
        w.extend({"x": np.arange(7, dtype=np.int64)})
        w.append({"x": 7})
        w.extend({"x": np.arange(8, 20, dtype=np.int64)})
        w.create_item(table, num_steps=20, priority=1.0)
        w.create_item(table, num_steps=11, priority=1.0)
    assert x_values(table) == [list(range(20)), list(range(9, 20))]


def test_multi_field_steps_read_back_field_by_field(make_store):
    store = make_store(ATARI, capacity=256, block_steps=16)
    table = fifo_table(store)
    with store.writer() as w:
        for i in range(3):
            w.append(atari_step(i))
        w.extend({
            "obs": np.stack([atari_step(i)["obs"] for i in range(3, 8)]),
            "action": np.arange(3, 8, dtype=np.int64),
            "reward": np.arange(3, 8, dtype=np.float32) / 2,
        })
        w.create_item(table, num_steps=6, priority=1.0)
    (item,) = drain(table)
    assert item["obs"].shape == (6, 4, 84, 84)
    assert [int(o[0, 0, 0]) for o in item["obs"]] == list(range(2, 8))
    assert np.all(item["obs"] == np.arange(2, 8, dtype=np.uint8)[:, None, None, None])
    assert item["action"].tolist() == list(range(2, 8))
    assert item["reward"].tolist() == [i / 2 for i in range(2, 8)]


def test_large_extend_copies_every_byte(make_store):
    store = make_store({"img": rp.Field((64, 64), "uint8")}, capacity=256, block_steps=16)
    table = fifo_table(store)
    imgs = np.random.default_rng(0).integers(0, 256, size=(40, 64, 64), dtype=np.uint8)
    with store.writer() as w:
        w.extend({"img": imgs})
        w.create_item(table, num_steps=40, priority=1.0)
    (item,) = drain(table)
    np.testing.assert_array_equal(item["img"], imgs)


def test_non_contiguous_arrays_are_accepted(make_store):
    store = make_store({"m": rp.Field((3, 2), "int32")}, capacity=64, block_steps=8)
    table = fifo_table(store)
    base = np.arange(6, dtype=np.int32).reshape(2, 3)
    with store.writer() as w:
        w.append({"m": base.T})
        w.extend({"m": np.arange(24, dtype=np.int32).reshape(2, 2, 3, 2)[:, 0]})
        w.create_item(table, num_steps=3, priority=1.0)
    (item,) = drain(table)
    np.testing.assert_array_equal(item["m"][0], base.T)
    np.testing.assert_array_equal(item["m"][1:], np.arange(24, dtype=np.int32).reshape(2, 2, 3, 2)[:, 0])


def test_extend_with_zero_steps_changes_nothing(scalar_store):
    with scalar_store.writer() as w:
        free = scalar_store.free_blocks
        w.extend({"x": np.zeros(0, dtype=np.int64)})
        assert w.episode_steps == 0
        assert scalar_store.free_blocks == free


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append")),
            st.tuples(st.just("extend"), st.integers(1, 9)),
            st.tuples(st.just("end")),
            st.tuples(st.just("item"), st.integers(1, 12)),
        ),
        max_size=30,
    ),
    block_steps=st.integers(1, 5),
    max_sequence_length=st.one_of(st.none(), st.integers(1, 8)),
)
def test_item_windows_match_a_reference_model(make_store, ops, block_steps, max_sequence_length):
    store = make_store({"x": rp.Field((), "int64")}, capacity=4096, block_steps=block_steps)
    table = fifo_table(store)
    episode, expected, counter = [], [], 0
    with store.writer(max_sequence_length=max_sequence_length) as w:
        for op in ops:
            if op[0] == "append":
                w.append({"x": counter})
                episode.append(counter)
                counter += 1
            elif op[0] == "extend":
                values = list(range(counter, counter + op[1]))
                w.extend({"x": np.array(values, dtype=np.int64)})
                episode.extend(values)
                counter += op[1]
            elif op[0] == "end":
                w.end_episode()
                episode = []
            else:
                n = op[1]
                kept = len(episode) if max_sequence_length is None else min(len(episode), max_sequence_length)
                if n > kept:
                    size, free = table.size, store.free_blocks
                    with pytest.raises(rp.errors.InvalidArgument):
                        w.create_item(table, num_steps=n, priority=1.0)
                    assert (table.size, store.free_blocks) == (size, free)
                else:
                    w.create_item(table, num_steps=n, priority=1.0)
                    expected.append(episode[-n:])
            assert w.episode_steps == len(episode)
    assert x_values(table) == expected
    assert store.free_blocks == store.num_blocks  # writer closed, items drained


def test_interleaved_writers_get_their_own_rows(make_store):
    store = make_store({"x": rp.Field((), "int64")}, capacity=512, block_steps=2)
    table = fifo_table(store)
    w1, w2 = store.writer(), store.writer()
    for i in range(7):
        w1.append({"x": 100 + i})
        w2.extend({"x": np.array([200 + 2 * i, 201 + 2 * i], dtype=np.int64)})
    w1.create_item(table, num_steps=7, priority=1.0)  # rows scattered over non-adjacent blocks
    w2.create_item(table, num_steps=5, priority=1.0)
    w1.close()
    w2.close()
    assert x_values(table) == [list(range(100, 107)), list(range(209, 214))]
    assert store.free_blocks == store.num_blocks


# --- several tables ------------------------------------------------------------------------------


def test_several_tables_share_the_same_steps(scalar_store):
    a, b = fifo_table(scalar_store, "a"), fifo_table(scalar_store, "b")
    with scalar_store.writer() as w:
        w.extend({"x": np.arange(6, dtype=np.int64)})
        w.create_item(a, num_steps=2, priority=1.0)
        w.create_item(b, num_steps=5, priority=1.0)
        w.create_item("a", num_steps=6, priority=1.0)
    assert x_values(a) == [[4, 5], [0, 1, 2, 3, 4, 5]]
    assert x_values(b) == [[1, 2, 3, 4, 5]]


def test_steps_stay_readable_while_any_table_references_them(scalar_store):
    a = rp.Table("a", scalar_store, sampler=rp.selectors.Fifo(), max_size=16)
    b = rp.Table("b", scalar_store, sampler=rp.selectors.Fifo(), max_size=16)
    with scalar_store.writer() as w:
        w.extend({"x": np.arange(3, dtype=np.int64)})
        ka = w.create_item(a, num_steps=3, priority=1.0)
        w.create_item(b, num_steps=3, priority=1.0)
    assert a.delete([ka]) == 1
    assert b.sample(1).data["x"].tolist() == [[0, 1, 2]]
    b.reset()
    assert scalar_store.free_blocks == scalar_store.num_blocks


def test_create_item_by_table_name(scalar_store):
    table = fifo_table(scalar_store, "replay")
    with scalar_store.writer() as w:
        w.append({"x": 5})
        key = w.create_item("replay", num_steps=1, priority=2.5)
    assert table.items() == [(key, 2.5, 0, 1)]


def test_create_item_for_an_unknown_table_name_is_not_found(scalar_store):
    table = fifo_table(scalar_store, "replay")
    with scalar_store.writer() as w:
        w.append({"x": 5})
        free = scalar_store.free_blocks
        with pytest.raises(rp.errors.NotFound, match="'nope'") as e:
            w.create_item("nope", num_steps=1, priority=1.0)
        assert isinstance(e.value, KeyError)
        assert "replay" in str(e.value)
        assert scalar_store.free_blocks == free
        assert table.size == 0
        w.create_item("replay", num_steps=1, priority=1.0)  # the writer still works
    assert table.size == 1


def test_create_item_by_the_name_of_a_dropped_table_is_not_found(scalar_store):
    table = fifo_table(scalar_store, "gone")
    del table
    with scalar_store.writer() as w:
        w.append({"x": 1})
        with pytest.raises(rp.errors.NotFound, match="'gone'"):
            w.create_item("gone", num_steps=1, priority=1.0)


def test_create_item_rejects_a_table_over_another_store(make_store):
    s1, s2 = make_store(), make_store()
    other = rp.Table("other", s2)
    with s1.writer() as w:
        w.append({"x": 1})
        with pytest.raises(rp.errors.InvalidArgument, match="'other'.*different store"):
            w.create_item(other, num_steps=1, priority=1.0)
    assert other.size == 0


def test_create_item_rejects_something_that_is_not_a_table(scalar_store):
    with scalar_store.writer() as w:
        w.append({"x": 1})
        with pytest.raises(rp.errors.InvalidArgument, match="Table or a table name"):
            w.create_item(42, num_steps=1, priority=1.0)


@pytest.mark.parametrize("num_steps", [0, -1])
def test_create_item_rejects_non_positive_num_steps(scalar_store, num_steps):
    table = fifo_table(scalar_store)
    with scalar_store.writer() as w:
        w.append({"x": 1})
        with pytest.raises(rp.errors.InvalidArgument, match=f"num_steps.*{num_steps}"):
            w.create_item(table, num_steps=num_steps, priority=1.0)
    assert table.size == 0


@pytest.mark.parametrize("priority", [float("nan"), float("inf"), -1.0])
def test_create_item_rejects_bad_priorities_and_changes_nothing(scalar_store, priority):
    table = fifo_table(scalar_store)
    with scalar_store.writer() as w:
        w.append({"x": 1})
        free = scalar_store.free_blocks
        with pytest.raises(rp.errors.InvalidArgument, match="priority"):
            w.create_item(table, num_steps=1, priority=priority)
        assert table.size == 0 and scalar_store.free_blocks == free
        assert table.info()["num_inserts"] == 0


def test_create_item_rejects_a_negative_timeout(scalar_store):
    table = fifo_table(scalar_store)
    with scalar_store.writer() as w:
        w.append({"x": 1})
        with pytest.raises(rp.errors.InvalidArgument, match="timeout"):
            w.create_item(table, num_steps=1, priority=1.0, timeout=-1.0)
    assert table.size == 0


# --- episodes -------------------------------------------------------------------------------------


def test_items_never_span_episodes(scalar_store):
    table = fifo_table(scalar_store)
    with scalar_store.writer() as w:
        w.extend({"x": np.arange(4, dtype=np.int64)})
        w.end_episode()
        assert w.episode_steps == 0
        w.extend({"x": np.arange(10, 12, dtype=np.int64)})
        assert w.episode_steps == 2
        w.create_item(table, num_steps=2, priority=1.0)
    assert x_values(table) == [[10, 11]]


def test_item_longer_than_the_episode_is_rejected_and_changes_nothing(scalar_store):
    table = fifo_table(scalar_store)
    with scalar_store.writer() as w:
        w.extend({"x": np.arange(4, dtype=np.int64)})
        w.create_item(table, num_steps=4, priority=1.0)
        w.end_episode()
        w.extend({"x": np.arange(10, 12, dtype=np.int64)})
        size, free, items = table.size, scalar_store.free_blocks, table.items()
        with pytest.raises(rp.errors.InvalidArgument, match=r"3 steps.*'t'.*episode.*\(2 steps\)"):
            w.create_item(table, num_steps=3, priority=1.0)
        assert table.size == size
        assert scalar_store.free_blocks == free
        assert table.items() == items
        assert table.info()["num_inserts"] == 1
        assert w.episode_steps == 2


def test_create_item_on_an_empty_episode_is_rejected(scalar_store):
    table = fifo_table(scalar_store)
    with scalar_store.writer() as w:
        with pytest.raises(rp.errors.InvalidArgument, match="episode"):
            w.create_item(table, num_steps=1, priority=1.0)
    assert table.size == 0


def test_end_episode_releases_rows_no_item_references(make_store):
    store = make_store({"x": rp.Field((), "int64")}, capacity=64, block_steps=4)
    table = fifo_table(store)
    with store.writer() as w:
        w.extend({"x": np.arange(16, dtype=np.int64)})
        w.create_item(table, num_steps=2, priority=1.0)  # rows 14, 15: the last block
        w.end_episode()
        # Only the last block is still held (by the item and by the writer's cursor).
        assert store.free_blocks == store.num_blocks - 1
    drain(table)
    assert store.free_blocks == store.num_blocks


# --- max_sequence_length ----------------------------------------------------------------------------


def test_max_sequence_length_limits_item_length(scalar_store):
    table = fifo_table(scalar_store)
    with scalar_store.writer(max_sequence_length=3) as w:
        w.extend({"x": np.arange(5, dtype=np.int64)})
        assert w.episode_steps == 5
        with pytest.raises(rp.errors.InvalidArgument, match="max_sequence_length"):
            w.create_item(table, num_steps=4, priority=1.0)
        assert table.size == 0
        w.create_item(table, num_steps=3, priority=1.0)
    assert x_values(table) == [[2, 3, 4]]


def test_max_sequence_length_lets_go_of_old_blocks(make_store):
    store = make_store({"x": rp.Field((), "int64")}, capacity=1024, block_steps=4)
    with store.writer(max_sequence_length=5) as w:
        for i in range(200):
            w.append({"x": i})
        # At most the blocks of the last 5 steps plus the current one stay held.
        assert store.num_blocks - store.free_blocks <= 3
    with store.writer() as w:
        w.extend({"x": np.arange(200, dtype=np.int64)})
        assert store.num_blocks - store.free_blocks == 50  # the whole episode is kept
    assert store.free_blocks == store.num_blocks


# --- conversions and validation -------------------------------------------------------------------


def test_python_scalars_lists_and_numpy_scalars_are_converted(make_store):
    sig = {
        "obs": rp.Field((2, 2), "uint8"),
        "action": rp.Field((), "int64"),
        "reward": rp.Field((), "float32"),
        "done": rp.Field((), "bool"),
        "vec": rp.Field((3,), "float64"),
    }
    store = make_store(sig, capacity=64, block_steps=8)
    table = fifo_table(store)
    with store.writer() as w:
        w.append({"obs": [[1, 2], [3, 4]], "action": 7, "reward": 0.5, "done": True, "vec": [1, 2.5, 3]})
        w.append({"obs": np.zeros((2, 2), np.uint8), "action": np.int32(-3), "reward": 2,
                  "done": np.bool_(False), "vec": (0.0, 0.0, 1.0)})
        w.extend({"obs": [[[5, 6], [7, 8]]], "action": [9], "reward": [1.25], "done": [False], "vec": [[4, 5, 6]]})
        w.create_item(table, num_steps=3, priority=1.0)
    (item,) = drain(table)
    assert item["obs"][0].tolist() == [[1, 2], [3, 4]]
    assert item["obs"][2].tolist() == [[5, 6], [7, 8]]
    assert item["action"].tolist() == [7, -3, 9]
    assert item["reward"].tolist() == [0.5, 2.0, 1.25]
    assert item["done"].tolist() == [True, False, False]
    assert item["vec"].tolist() == [[1.0, 2.5, 3.0], [0.0, 0.0, 1.0], [4.0, 5.0, 6.0]]


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("obs", [[1, 2], [3, 300]], "does not fit in uint8"),
        ("obs", [[1, 2], [3, -1]], "does not fit in uint8"),
        ("action", 1.5, "field 'action' expects int64"),
        ("action", "3", "field 'action' expects int64"),
        ("done", 1, "field 'done' expects bool"),
        ("reward", None, "field 'reward' expects float32"),
        ("obs", [[1, 2], [3]], "field 'obs'"),
    ],
)
def test_lossy_or_unconvertible_python_values_are_rejected(make_store, field, value, match):
    sig = {"obs": rp.Field((2, 2), "uint8"), "action": rp.Field((), "int64"),
           "reward": rp.Field((), "float32"), "done": rp.Field((), "bool")}
    store = make_store(sig, capacity=64, block_steps=8)
    step = {"obs": [[0, 0], [0, 0]], "action": 0, "reward": 0.0, "done": False}
    step[field] = value
    with store.writer() as w:
        with pytest.raises(rp.errors.InvalidArgument, match=match):
            w.append(step)
        assert w.episode_steps == 0


def test_wrong_numpy_dtype_and_shape_name_field_expected_and_got(make_store):
    store = make_store(ATARI, capacity=64, block_steps=8)
    step = atari_step(0)
    with store.writer() as w:
        step["obs"] = np.zeros((84, 84), np.float32)
        with pytest.raises(rp.errors.InvalidArgument, match=r"field 'obs' expects uint8\[4,84,84\], got float32\[84,84\]"):
            w.append(step)
        step["obs"] = np.zeros((4, 84, 84), np.int16)
        with pytest.raises(rp.errors.InvalidArgument, match=r"field 'obs' expects uint8\[4,84,84\], got int16\[4,84,84\]"):
            w.append(step)
        step = atari_step(0)
        step["action"] = np.array(3, dtype=np.int32)  # lossless, but numpy arrays must match exactly
        with pytest.raises(rp.errors.InvalidArgument, match=r"field 'action' expects int64\[\], got int32\[\]"):
            w.append(step)
        step["action"] = np.zeros((1,), np.int64)
        with pytest.raises(rp.errors.InvalidArgument, match=r"field 'action' expects int64\[\], got int64\[1\]"):
            w.append(step)
        assert w.episode_steps == 0


def test_extend_names_the_expected_leading_dimension(make_store):
    store = make_store(ATARI, capacity=64, block_steps=8)
    with store.writer() as w:
        bad = {"obs": np.zeros((4, 84, 84), np.uint8), "action": np.zeros(1, np.int64),
               "reward": np.zeros(1, np.float32)}
        with pytest.raises(rp.errors.InvalidArgument, match=r"field 'obs' expects uint8\[T,4,84,84\], got uint8\[4,84,84\]"):
            w.extend(bad)
        assert w.episode_steps == 0


def test_extend_rejects_fields_with_different_step_counts(make_store):
    store = make_store(ATARI, capacity=64, block_steps=8)
    free = store.free_blocks
    with store.writer() as w:
        steps = {"obs": np.zeros((3, 4, 84, 84), np.uint8), "action": np.zeros(2, np.int64),
                 "reward": np.zeros(3, np.float32)}
        with pytest.raises(rp.errors.InvalidArgument, match=r"'action' has 2 steps.*'obs' has 3"):
            w.extend(steps)
        assert w.episode_steps == 0
        assert store.free_blocks == free


def test_unknown_field_is_not_found(make_store):
    store = make_store(ATARI, capacity=64, block_steps=8)
    with store.writer() as w:
        step = atari_step(0)
        step["extra"] = 1
        with pytest.raises(rp.errors.NotFound, match="'extra'") as e:
            w.append(step)
        assert isinstance(e.value, KeyError)
        assert w.episode_steps == 0


def test_missing_field_is_invalid_argument_naming_it(make_store):
    store = make_store(ATARI, capacity=64, block_steps=8)
    with store.writer() as w:
        step = atari_step(0)
        del step["reward"]
        with pytest.raises(rp.errors.InvalidArgument, match=r"missing field 'reward' \(float32\[\]\)"):
            w.append(step)
        assert w.episode_steps == 0


def test_step_must_be_a_mapping(scalar_store):
    with scalar_store.writer() as w:
        with pytest.raises(rp.errors.InvalidArgument, match="dict"):
            w.append([1, 2, 3])


def test_rejected_append_leaves_the_store_untouched(make_store):
    store = make_store(ATARI, capacity=64, block_steps=8)
    table = fifo_table(store)
    with store.writer() as w:
        w.append(atari_step(1))
        free = store.free_blocks
        bad = atari_step(2)
        bad["reward"] = np.float64(0.5) * np.ones(1)
        with pytest.raises(rp.errors.InvalidArgument):
            w.append(bad)
        assert store.free_blocks == free and w.episode_steps == 1
        w.append(atari_step(3))
        w.create_item(table, num_steps=2, priority=1.0)
    (item,) = drain(table)
    assert item["action"].tolist() == [1, 3]


# --- lifecycle ---------------------------------------------------------------------------------------


def test_context_manager_closes_the_writer_and_releases_its_blocks(scalar_store):
    with scalar_store.writer() as w:
        w.extend({"x": np.arange(20, dtype=np.int64)})
        assert scalar_store.free_blocks < scalar_store.num_blocks
    assert scalar_store.free_blocks == scalar_store.num_blocks
    with pytest.raises(rp.errors.InvalidArgument, match="closed"):
        w.append({"x": 1})


def test_context_manager_closes_on_error_and_does_not_swallow_it(scalar_store):
    with pytest.raises(RuntimeError, match="boom"):
        with scalar_store.writer() as w:
            w.append({"x": 1})
            raise RuntimeError("boom")
    assert scalar_store.free_blocks == scalar_store.num_blocks
    with pytest.raises(rp.errors.InvalidArgument, match="closed"):
        w.append({"x": 1})


def test_writer_used_after_close_raises_for_every_call(scalar_store):
    table = fifo_table(scalar_store)
    w = scalar_store.writer()
    w.append({"x": 1})
    w.close()
    w.close()  # idempotent
    calls = [
        lambda: w.append({"x": 1}),
        lambda: w.extend({"x": np.arange(2, dtype=np.int64)}),
        lambda: w.create_item(table, num_steps=1, priority=1.0),
        lambda: w.end_episode(),
        lambda: w.flush(),
        lambda: w.episode_steps,
    ]
    for call in calls:
        with pytest.raises(rp.errors.InvalidArgument, match="writer is closed"):
            call()
    assert table.size == 0


def test_items_outlive_their_writer(scalar_store):
    table = fifo_table(scalar_store)
    w = scalar_store.writer()
    w.extend({"x": np.arange(3, dtype=np.int64)})
    w.create_item(table, num_steps=3, priority=1.0)
    w.close()
    del w
    assert x_values(table) == [[0, 1, 2]]


def test_flush_returns_once_items_are_in_their_tables(scalar_store):
    table = fifo_table(scalar_store)
    with scalar_store.writer() as w:
        w.append({"x": 1})
        w.create_item(table, num_steps=1, priority=1.0)
        assert w.flush() is None
        assert w.flush(timeout=0.5) is None
        assert table.size == 1
        with pytest.raises(rp.errors.InvalidArgument, match="timeout"):
            w.flush(timeout=-1)


def test_create_item_returns_distinct_keys_listed_by_the_table(scalar_store):
    table = fifo_table(scalar_store)
    with scalar_store.writer() as w:
        w.extend({"x": np.arange(3, dtype=np.int64)})
        keys = [w.create_item(table, num_steps=1, priority=float(i)) for i in range(3)]
    assert len(set(keys)) == 3
    assert [k for k, *_ in table.items()] == keys
    assert [p for _, p, _, _ in table.items()] == [0.0, 1.0, 2.0]


def _fifo_values(table, n):
    """The ``x`` windows of the first n items, oldest first (Fifo sampler)."""
    return [row.tolist() for row in table.sample(n, timeout=0).data["x"]]


@pytest.mark.parametrize("num_steps", [1, 2, 3])
def test_create_items_makes_one_item_per_step_of_an_extend(make_store, num_steps):
    store = make_store(capacity=256, block_steps=4)
    table = rp.Table("t", store, sampler=rp.selectors.Fifo(), max_size=64, max_times_sampled=1)
    with store.writer() as w:
        w.extend({"x": np.arange(10, dtype=np.int64)})
        keys = w.create_items(table, num_steps, [1.0, 2.0, 3.0, 4.0])
    assert keys.dtype == np.uint64 and len(keys) == 4
    assert [p for _, p, _, _ in table.items()] == [1.0, 2.0, 3.0, 4.0]
    ends = [6, 7, 8, 9]
    assert _fifo_values(table, 4) == [list(range(e - num_steps + 1, e + 1)) for e in ends]


def test_create_items_longer_than_the_episode_changes_nothing(make_store):
    store = make_store(capacity=256, block_steps=4)
    table = rp.Table("t", store, max_size=64)
    with store.writer() as w:
        w.extend({"x": np.arange(4, dtype=np.int64)})
        with pytest.raises(rp.errors.InvalidArgument, match=r"4 items of 2 steps .* need 5 steps"):
            w.create_items("t", 2, [1.0] * 4)
        with pytest.raises(rp.errors.InvalidArgument, match="priority"):
            w.create_items("t", 1, [1.0, float("nan")])
        assert table.size == 0
        assert len(w.create_items("t", 2, [1.0] * 3)) == 3


def test_create_items_through_a_client_writer(make_store):
    store = make_store(capacity=256, block_steps=4)
    table = rp.Table("t", store, sampler=rp.selectors.Fifo(), max_size=64, max_times_sampled=1)
    server = rp.Server([table])
    try:
        client = rp.Client(server.local_address)
        with client.writer(max_sequence_length=8) as w:
            w.extend({"x": np.arange(5, dtype=np.int64)})
            assert w.create_items("t", 2, np.array([1.0, 2.0, 3.0])) is None
            w.flush(timeout=5)
        assert table.size == 3
        assert [row.tolist() for row in client.sample("t", 3, timeout=0).data["x"]] == [[1, 2], [2, 3], [3, 4]]
    finally:
        server.stop()

"""The sizing rule (issue 33, "the sizing trap"): a store of ``(max_size + n) x steps per
item + 2 x block_steps`` steps, n the most items written in one call (1 for a writer),
holds a Fifo- or Lifo-removed table's ``max_size`` items exactly,
for every sampler and block size; a store too small for even one-step items warns."""

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reprise as rp
from reprise import selectors as S
from reprise.errors import CapacityWarning

SAMPLERS = [S.Fifo(), S.Lifo(), S.Uniform(), S.Prioritized(0.7), S.MaxHeap(), S.MinHeap()]


def table_of(max_size, block_steps, sampler, remover, steps_per_item=1, at_once=1):
    """A store sized by the rule: (max_size + items written at once) x steps per item
    + 2 x block_steps."""
    store = rp.Store({"x": rp.Field((2,), "float32")}, capacity=(max_size + at_once) * steps_per_item + 2 * block_steps,
                     block_steps=block_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CapacityWarning)  # the rule's store must not warn
        table = rp.Table("t", store, sampler=sampler, remover=remover, max_size=max_size)
    return store, table


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(max_size=st.integers(1, 150), block_steps=st.sampled_from([1, 2, 3, 8, 16, 64]),
       sampler=st.sampled_from(SAMPLERS), remover=st.sampled_from([S.Fifo(), S.Lifo()]),
       steps_per_item=st.integers(1, 3), episodes=st.integers(1, 100), seed=st.integers(0, 2**16))
def test_a_writer_fills_the_table_to_max_size_and_it_stays_there(max_size, block_steps, sampler, remover,
                                                                  steps_per_item, episodes, seed):
    """Items of k steps tile each episode (episodes of a whole number of items, ending
    at random): every step is in one item, so a store of (max_size + 1) x k + 2 x
    block_steps steps never has to evict."""
    store, table = table_of(max_size, block_steps, sampler, remover, steps_per_item)
    rng = np.random.default_rng(seed)
    w = store.writer(max_sequence_length=steps_per_item)
    for inserted in range(1, 3 * max_size + 2 * block_steps + 1):
        w.extend({"x": np.zeros((steps_per_item, 2), np.float32)})
        w.create_item(table, steps_per_item, float(rng.uniform(0.1, 2.0)))
        assert table.size == min(inserted, max_size), "the store evicted items the table still had room for"
        if rng.integers(episodes) == 0:
            w.end_episode()
    assert table.info()["num_store_evictions"] == 0


@settings(max_examples=25, deadline=None)
@given(max_size=st.integers(1, 150), block_steps=st.sampled_from([1, 4, 16, 64]),
       sampler=st.sampled_from(SAMPLERS), remover=st.sampled_from([S.Fifo(), S.Lifo()]),
       batch=st.integers(1, 40))
def test_batched_inserts_fill_the_table_to_max_size_and_it_stays_there(max_size, block_steps, sampler, remover, batch):
    store, table = table_of(max_size, block_steps, sampler, remover, at_once=batch)
    inserted = 0
    while inserted < 3 * max_size + 2 * block_steps:
        table.insert({"x": np.zeros((batch, 1, 2), np.float32)}, priorities=np.ones(batch))
        inserted += batch
        assert table.size == min(inserted, max_size)
    assert table.info()["num_store_evictions"] == 0


def test_a_store_too_small_for_max_size_warns_and_says_the_rule():
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=1024, block_steps=64)
    with pytest.warns(CapacityWarning, match=r"max_size=1000 needs a store of at least 1129 steps.*evict items"):
        rp.Table("t", store, max_size=1000)
    with pytest.warns(CapacityWarning, match=r"refuse writes"):
        rp.Table.queue("q", store, max_size=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CapacityWarning)
        rp.Table("fits", store, max_size=895)     # (895 + 1) + 2 x 64 = 1024
        rp.Table("default", store)                # max_size defaults to what the store holds


def test_the_trap_the_rule_avoids_is_real():
    """With capacity = max_size (the trap), the table dips below max_size: the warning
    is about something that happens."""
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=1024, block_steps=64)
    with pytest.warns(CapacityWarning):
        table = rp.Table("t", store, remover=S.Fifo(), max_size=1000)
    w = store.writer(max_sequence_length=1)
    low = 1000
    for i in range(3000):
        w.append({"x": i})
        w.create_item(table, 1, 1.0)
        if i >= 1000:
            low = min(low, table.size)
    assert low < 1000

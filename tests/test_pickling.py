"""Stores and tables pickle as copies, through the checkpoint format (issue 33)."""

import pickle

import numpy as np
import pytest

import reprise as rp
from reprise import selectors as S
from reprise.errors import InvalidArgument


def filled():
    store = rp.Store({"x": rp.Field((3,), "float32"), "a": rp.Field((), "int64")}, capacity=256, block_steps=8)
    t = rp.Table("t", store, sampler=S.Prioritized(0.8), max_size=100, seed=3)
    u = rp.Table("u", store, sampler=S.Fifo(), max_size=100)
    t.insert({"x": np.arange(60, dtype=np.float32).reshape(20, 1, 3), "a": np.arange(20).reshape(20, 1)},
             priorities=np.arange(1, 21.0))
    u.insert({"x": np.ones((4, 2, 3), np.float32), "a": np.zeros((4, 2), np.int64)}, priorities=1.0)
    t.sample(3)  # counters and the generator move on
    return store, t, u


def test_a_table_round_trips_with_its_items_priorities_generator_and_counters():
    store, t, u = filled()
    t2 = pickle.loads(pickle.dumps(t))
    assert t2 is not t and t2.store is not store
    assert t2.items() == t.items()
    info, info2 = t.info(), t2.info()
    for k in ("size", "max_size", "num_inserts", "num_samples", "sampler", "remover", "rate_limiter"):
        assert info2[k] == info[k], k
    a, b = t.sample(6), t2.sample(6)
    assert (a.keys == b.keys).all() and (a.data["x"] == b.data["x"]).all() and (a.probabilities == b.probabilities).all()


def test_the_copy_shares_nothing_with_the_original():
    store, t, u = filled()
    t2 = pickle.loads(pickle.dumps(t))
    key = t2.items()[0][0]
    t2.update_priorities([key], [50.0])
    assert t2.items()[0][1] == 50.0 and t.items()[0][1] != 50.0
    t.reset()
    assert t2.size == 20 and t.size == 0
    assert t2.store._native.path != store._native.path


def test_a_store_carries_every_table_over_it_and_comes_back_with_them():
    store, t, u = filled()
    s2, t2, u2 = pickle.loads(pickle.dumps((store, t, u)))
    assert t2.store is s2 and u2.store is s2, "a table and its store pickled together come back together"
    assert (t2.size, u2.size) == (20, 4)
    assert (u2.sample(4).data["x"] == 1).all()
    assert s2.capacity == store.capacity and s2.block_steps == store.block_steps and s2.signature == store.signature


def test_a_store_without_tables_pickles_as_an_empty_store_of_the_same_layout():
    store = rp.Store({"x": rp.Field((2, 2), "uint8")}, capacity=64, block_steps=4)
    s2 = pickle.loads(pickle.dumps(store))
    assert (s2.signature, s2.capacity, s2.block_steps) == (store.signature, store.capacity, store.block_steps)
    assert s2._native.path != store._native.path


def test_a_closed_store_refuses_to_pickle_and_says_so():
    store, t, u = filled()
    store.close()
    with pytest.raises(InvalidArgument, match="closed"):
        pickle.dumps(t)

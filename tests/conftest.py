"""Shared fixtures: stores that are closed (their shm files removed) after each test."""

import numpy as np
import pytest

import reprise as rp


@pytest.fixture
def make_store():
    """``make_store(signature=None, capacity=1024, block_steps=16)``; closed at teardown."""
    stores = []

    def make(signature=None, capacity=1024, block_steps=16):
        if signature is None:
            signature = {"x": rp.Field((), "int64")}
        store = rp.Store(signature, capacity=capacity, block_steps=block_steps)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def scalar_store(make_store):
    """A store of one int64 scalar field ``x``: step data doubles as an id."""
    return make_store({"x": rp.Field((), "int64")}, capacity=4096, block_steps=8)


def insert_scalars(table, values, priorities=1.0):
    """One single-step item per value (field ``x``); returns the keys."""
    values = np.asarray(values, dtype=np.int64).reshape(-1, 1)
    return table.insert({"x": values}, priorities)

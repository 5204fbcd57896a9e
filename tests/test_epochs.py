"""Epochs: a sample drawn for a device's gather holds its rows by one pinned epoch
(crates/core/src/blocks.rs), not a reference per block. Blocks whose last reference
goes meanwhile wait in limbo; writers that need them wait rather than evict items
for nothing. These run without torch: the epoch is the native draw's."""

import threading
import time

import numpy as np
import pytest

import reprise as rp

SIG = {"x": rp.Field((), "int64")}


def ring(make_store, blocks=8, block_steps=4):
    """A full store of ``blocks`` blocks, one item per step, every block referenced by items."""
    store = make_store(SIG, capacity=blocks * block_steps, block_steps=block_steps)
    table = rp.Table("t", store, max_size=blocks * block_steps, seed=0)
    with store.writer() as w:
        for i in range(blocks * block_steps):
            w.append({"x": i})
            w.create_item("t", 1, 1.0)
    assert store.free_blocks == 0
    return store, table


def test_a_pinned_sample_holds_no_reference_and_its_rows_survive_eviction(make_store):
    store, table = ring(make_store)
    refs = [store._native.block_refcount(b) for b in range(store.num_blocks)]
    rows = table._native.sample_rows(16, 0, pinned=True)
    try:
        assert [store._native.block_refcount(b) for b in range(store.num_blocks)] == refs, \
            "a pinned sample took references per block"
        step_of = {k: i for i, (k, *_) in enumerate(table.items())}  # item i covers step i
        keys = rows.index(np.zeros(64, np.int64))[0]
        table.reset()  # every item leaves: their blocks go to limbo, not to the free queue
        assert (store.free_blocks, store._native.limbo_blocks) == (0, store.num_blocks)
        with store.writer() as w:   # nothing to take: the writer waits, then is refused
            with pytest.raises(rp.errors.ResourceExhausted):
                w.append({"x": -1})
        values = rows.to_sample().data["x"][:, 0]   # read after all that: still the sampled steps
        np.testing.assert_array_equal(values, [step_of[int(k)] for k in keys])
    finally:
        rows.release()
    assert (store.free_blocks, store._native.limbo_blocks) == (store.num_blocks, 0)


def test_an_unpinned_sample_still_holds_references(make_store):
    store, table = ring(make_store)
    refs = sum(store._native.block_refcount(b) for b in range(store.num_blocks))
    rows = table._native.sample_rows(8, 0)
    try:
        assert sum(store._native.block_refcount(b) for b in range(store.num_blocks)) == refs + 8
    finally:
        rows.release()


def test_a_writer_waits_for_the_epoch_instead_of_evicting_more(make_store):
    """A full ring store, a gather in flight: a writer needing a block evicts the oldest
    block's items once, waits for the epoch (the gather's end) and gets that block; the
    rest of the table is untouched."""
    store, table = ring(make_store)
    rows = table._native.sample_rows(4, 0, pinned=True)
    got = {}

    def write():
        t0 = time.monotonic()
        with store.writer() as w:
            w.append({"x": 1000})
            w.create_item("t", 1, 1.0)
        got["seconds"], got["done"] = time.monotonic() - t0, time.monotonic()

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(0.2)
    assert writer.is_alive(), "the writer got a block while every free one waited for the epoch"
    assert table.size == 32 - 4, "more than the oldest block's items were evicted"
    released = time.monotonic()
    rows.release()
    writer.join(10)
    # It waited for the release (not a poll period): done after it, soon after it.
    assert not writer.is_alive() and got["seconds"] > 0.15 and 0 <= got["done"] - released < 2.0, got
    assert table.size == 32 - 4 + 1
    assert store._native.limbo_blocks == 0


def test_a_stalled_epoch_fails_the_lease_with_the_reason_and_evicts_no_more(make_store):
    store, table = ring(make_store)
    rows = table._native.sample_rows(4, 0, pinned=True)
    try:
        with store.writer() as w:
            with pytest.raises(rp.errors.ResourceExhausted, match="wait for device reads of samples in flight"):
                w.append({"x": 1000})
        # The oldest block's items went (the store is a ring); nothing else did.
        assert table.size == 32 - 4
    finally:
        rows.release()
    assert store._native.limbo_blocks == 0

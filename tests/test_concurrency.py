"""Several Python threads writing and sampling at once; the GIL is released while blocked and
while bulk copies run."""

import ctypes
import random
import threading
import time

import numpy as np
import pytest

import reprise as rp

TIMEOUT = 20.0  # generous: a hang fails the test instead of the suite


def run_threads(targets):
    """Starts one thread per callable, joins them, re-raises the first error."""
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported in the main thread
                errors.append(e)
        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


class Counter:
    """A thread that counts loop iterations: proof that it holds the GIL now and then."""

    def __init__(self):
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self):
        while not self._stop.is_set():
            self.count += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# --- exact accounting -------------------------------------------------------------------------------


@pytest.mark.parametrize("writers, samplers", [(4, 2), (2, 3)])
def test_queue_hands_every_item_to_exactly_one_sampler(make_store, writers, samplers):
    store = make_store({"x": rp.Field((), "int64"), "w": rp.Field((), "int32")}, capacity=1 << 14, block_steps=8)
    q = rp.Table.queue("q", store, max_size=16)
    per_writer = 500
    total = writers * per_writer
    shares = [total // samplers + (i < total % samplers) for i in range(samplers)]
    drawn = [[] for _ in range(samplers)]

    def writer(wid):
        def run():
            with store.writer() as w:
                for i in range(per_writer):
                    w.append({"x": wid * 1_000_000 + i, "w": wid})
                    w.create_item(q, num_steps=1, priority=1.0, timeout=TIMEOUT)
                    if i % 7 == 6:
                        w.end_episode()
        return run

    def sampler(sid):
        def run():
            rng = random.Random(sid)
            left = shares[sid]
            while left:
                k = min(left, rng.randint(1, 5))
                s = q.sample(k, timeout=TIMEOUT)
                drawn[sid].extend(zip(s.keys.tolist(), s.data["x"][:, 0].tolist(), s.data["w"][:, 0].tolist()))
                left -= k
        return run

    run_threads([writer(i) for i in range(writers)] + [sampler(i) for i in range(samplers)])

    everything = [d for per in drawn for d in per]
    assert len(everything) == total
    assert len({k for k, _, _ in everything}) == total, "an item was sampled twice"
    assert sorted(x for _, x, _ in everything) == sorted(
        wid * 1_000_000 + i for wid in range(writers) for i in range(per_writer))
    for _, x, wid in everything:
        assert x // 1_000_000 == wid, "a step's fields were torn between writers"
    # Each sampler sees each writer's items in the order they were created (Fifo).
    for per in drawn:
        for wid in range(writers):
            xs = [x for _, x, w in per if w == wid]
            assert xs == sorted(xs)
    info = q.info()
    assert (info["size"], info["num_inserts"], info["num_samples"]) == (0, total, total)
    assert store.free_blocks == store.num_blocks


def test_batch_inserts_from_several_threads_keep_every_key_and_row(make_store):
    store = make_store({"x": rp.Field((3,), "int64")}, capacity=1 << 14, block_steps=16)
    t = rp.Table("t", store, sampler=rp.selectors.Fifo(), max_size=4000, max_times_sampled=1)
    results = {}

    def inserter(tid):
        def run():
            keys = []
            for b in range(20):
                base = tid * 100_000 + b * 100
                x = (base + np.arange(5 * 4)).reshape(5, 4, 1).repeat(3, axis=2).astype(np.int64)
                keys.extend(t.insert({"x": x}, 1.0, timeout=TIMEOUT).tolist())
            results[tid] = keys
        return run

    run_threads([inserter(i) for i in range(4)])
    all_keys = [k for keys in results.values() for k in keys]
    assert len(all_keys) == len(set(all_keys)) == 400 == t.size
    s = t.sample(400)
    assert sorted(s.keys.tolist()) == sorted(all_keys)
    x = s.data["x"]
    # Every item is 4 consecutive ids, each repeated over the 3 columns.
    assert (x[:, :, 0] == x[:, :, 1]).all() and (x[:, :, 0] == x[:, :, 2]).all()
    assert (np.diff(x[:, :, 0], axis=1) == 1).all()
    assert sorted(x[:, 0, 0].tolist()) == sorted(
        tid * 100_000 + b * 100 + j * 4 for tid in range(4) for b in range(20) for j in range(5))


def test_sampled_data_matches_its_item_while_blocks_are_reused(make_store):
    """Writers overwrite freed blocks while samplers copy: a sample's rows stay its own."""
    store = make_store({"x": rp.Field((8,), "int64")}, capacity=1024, block_steps=4)
    t = rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=40, seed=0)
    stop = threading.Event()
    checked = []

    def writer(wid):
        def run():
            with store.writer() as w:
                for i in range(6000):
                    w.append({"x": np.full(8, wid * 1_000_000 + i, dtype=np.int64)})
                    if i % 3 == 2:
                        w.create_item(t, num_steps=3, priority=1.0)
                        w.end_episode()
        return run

    def sampler():
        # Each sampler checks at least one batch, even when the writers finish before it
        # is first scheduled (a loaded 2-core machine: CI saw none checked at all).
        drawn = 0
        while not stop.is_set() or drawn == 0:
            if t.size == 0:
                if stop.is_set():
                    break
                continue
            s = t.sample(16, timeout=1.0)
            x = s.data["x"]
            assert (x == x[:, :, :1]).all(), "a row was torn"
            first = x[:, 0, 0]
            assert (x[:, 1, 0] == first + 1).all() and (x[:, 2, 0] == first + 2).all(), "an item's rows were overwritten"
            checked.append(len(s))
            drawn += len(s)

    def writers():
        try:
            run_threads([writer(0), writer(1)])
        finally:
            stop.set()

    run_threads([writers, sampler, sampler])
    assert sum(checked) > 0
    assert t.info()["num_inserts"] == 4000
    # 4000 items x 3 steps went through a 1024-step store: blocks were reused.
    assert t.info()["num_evictions"] == 3960


def test_concurrent_priority_updates_deletes_and_samples_stay_consistent(make_store):
    store = make_store({"x": rp.Field((), "int64")}, capacity=1 << 14, block_steps=8)
    t = rp.Table("p", store, sampler=rp.selectors.Prioritized(0.7), remover=rp.selectors.MinHeap(),
                 max_size=200, seed=3)
    t.insert({"x": np.arange(200).reshape(200, 1)}, np.linspace(0.1, 5.0, 200))
    stop = threading.Event()

    def updater(seed):
        def run():
            rng = np.random.default_rng(seed)
            while not stop.is_set():
                keys = np.array([k for k, *_ in t.items()], dtype=np.uint64)
                if len(keys):
                    pick = rng.choice(keys, size=min(20, len(keys)))
                    t.update_priorities(pick, rng.uniform(0.0, 10.0, size=len(pick)))
        return run

    def inserter():
        for i in range(100):
            t.insert({"x": np.full((3, 1), 1000 + i)}, [1.0, 2.0, 3.0])
            if i % 10 == 0:
                keys = [k for k, *_ in t.items()]
                t.delete(keys[:5])
        stop.set()

    def sampler():
        while not stop.is_set():
            s = t.sample(32, timeout=1.0)
            assert np.all(s.probabilities > 0) and np.all(s.probabilities <= 1)
            assert np.all(np.isfinite(s.priorities)) and np.all(s.priorities >= 0)

    run_threads([inserter, updater(1), updater(2), sampler])
    items = t.items()
    assert len(items) == t.size <= 200
    assert len({k for k, *_ in items}) == len(items)
    s = t.sample(1000)
    p = {k: pr for k, pr, _, _ in items}
    total = sum(v ** 0.7 for v in p.values())
    np.testing.assert_allclose(s.probabilities, [p[k] ** 0.7 / total for k in s.keys.tolist()], rtol=1e-9)


# --- the GIL is released while blocked ---------------------------------------------------------------


def test_gil_is_released_while_a_sampler_waits(scalar_store):
    t = rp.Table("t", scalar_store, rate_limiter=rp.rate_limiters.MinSize(1))
    result = {}

    def sampler():
        start = time.monotonic()
        result["sample"] = t.sample(1, timeout=5.0)
        result["waited"] = time.monotonic() - start

    with Counter() as counter:
        thread = threading.Thread(target=sampler)
        thread.start()
        time.sleep(0.05)
        before = counter.count
        time.sleep(0.3)
        progressed = counter.count - before
        assert thread.is_alive(), "the sampler should still be waiting"
        t.insert({"x": np.array([[7]])}, 1.0)
        thread.join(timeout=5)
    assert progressed > 1000, f"another thread made only {progressed} steps while the sampler waited"
    assert result["sample"].data["x"].tolist() == [[7]]
    assert result["waited"] < 4.0


def test_gil_is_released_while_an_insert_waits(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=1)
    q.insert({"x": np.array([[0]])}, 1.0)
    done = threading.Event()

    def inserter():
        q.insert({"x": np.array([[1]])}, 1.0, timeout=5.0)
        done.set()

    with Counter() as counter:
        thread = threading.Thread(target=inserter)
        thread.start()
        time.sleep(0.05)
        before = counter.count
        time.sleep(0.3)
        progressed = counter.count - before
        assert not done.is_set()
        assert q.sample(1, timeout=1.0).data["x"].tolist() == [[0]]
        thread.join(timeout=5)
    assert done.is_set()
    assert progressed > 1000
    assert q.sample(1, timeout=1.0).data["x"].tolist() == [[1]]


def writer_is_busy(w):
    """True while another thread is inside a call on writer ``w`` (it then refuses every
    call, a read of ``episode_steps`` included, which changes nothing)."""
    try:
        w.episode_steps
    except rp.errors.RepriseError as e:
        assert "another thread" in str(e), e
        return True
    return False


def wait_until(predicate, what, timeout=TIMEOUT):
    """Polls ``predicate`` until it holds; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.002)


def test_gil_is_released_while_create_item_waits(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=1)
    q.insert({"x": np.array([[0]])}, 1.0)
    done = threading.Event()
    w = scalar_store.writer()
    w.append({"x": 1})

    def writer():
        w.create_item(q, num_steps=1, priority=1.0, timeout=TIMEOUT)
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        # The writer is inside create_item, waiting for room in the full queue.
        wait_until(lambda: writer_is_busy(w), "the writer thread to enter create_item")
        assert not done.is_set() and q.info()["num_inserts"] == 1
        # This thread runs Python (and takes the table lock) while the writer waits.
        assert q.sample(1, timeout=TIMEOUT).data["x"].tolist() == [[0]]
    finally:
        thread.join(timeout=TIMEOUT)
    assert done.is_set()
    assert q.sample(1, timeout=TIMEOUT).data["x"].tolist() == [[1]]
    w.close()


def test_a_writer_busy_in_another_thread_refuses_calls(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=1)
    q.insert({"x": np.array([[0]])}, 1.0)
    w = scalar_store.writer()
    w.append({"x": 1})
    thread = threading.Thread(target=lambda: w.create_item(q, num_steps=1, priority=1.0, timeout=TIMEOUT))
    thread.start()
    try:
        wait_until(lambda: writer_is_busy(w), "the other thread to enter create_item")
        # It is still waiting for room (the queue is full), so the writer is still its.
        with pytest.raises(rp.errors.RepriseError, match="another thread"):
            w.append({"x": 2})
        assert thread.is_alive() and q.info()["num_inserts"] == 1, "create_item ended before the call was refused"
        q.sample(1, timeout=TIMEOUT)
    finally:
        thread.join(timeout=TIMEOUT)
    assert not thread.is_alive() and q.info()["num_inserts"] == 2
    w.append({"x": 2})  # free again
    assert w.episode_steps == 2
    w.close()


# --- the GIL is released while bulk copies run ---------------------------------------------------------
#
# A second Python thread can only run while the main thread has released the GIL. Each test
# below has that thread look at the copy itself, through the store's shared memory: seeing a
# copy half done (or changing its source while it runs) is only possible if the GIL was released
# during the copy, whatever the timing. A copy that held the GIL would show nothing, and the
# test fails at its deadline.


def shared_rows(store, field):
    """The rows of ``field`` in the store's shared memory: a writable view ``[capacity, ...]``
    (valid while the store is open)."""
    address, nbytes = store._native.memory()
    memory = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
    f = store.signature[field]
    for name, offset, row_bytes in store._native.column_layout():
        if name == field:
            rows = memory[offset:offset + store.capacity * row_bytes]
            return rows.view(f.dtype).reshape(store.capacity, *f.shape)
    raise KeyError(field)


def test_gil_is_released_while_an_insert_copies_its_rows(make_store):
    """A second thread watching the store's memory sees a large insert half copied."""
    steps, row = 1 << 14, 1024  # 64 MB: every row of the store
    store = make_store({"x": rp.Field((row,), "float32")}, capacity=steps, block_steps=64)
    t = rp.Table("t", store, max_size=steps)
    rows = shared_rows(store, "x")
    watched = np.linspace(0, steps - 1, 64).astype(np.int64)  # the first word of 64 rows
    deadline = time.monotonic() + TIMEOUT
    attempts, seen = 0, []
    while not seen and time.monotonic() < deadline:
        attempts += 1
        marker = np.float32(attempts)
        data = {"x": np.full((steps // 64, 64, row), marker, np.float32)}
        copying, done = threading.Event(), threading.Event()

        def watch():
            copying.wait(TIMEOUT)
            while not done.is_set():
                written = int((rows[watched, 0] == marker).sum())  # a small read: holds the GIL
                if 0 < written < len(watched):
                    seen.append(written)  # the copy is under way while this thread runs
                    return

        watcher = threading.Thread(target=watch)
        watcher.start()
        t.reset()
        copying.set()
        t.insert(data, 1.0)
        done.set()
        watcher.join(TIMEOUT)
        assert (rows[watched, 0] == marker).all(), "the insert did not write every row of the store"
    assert seen, f"no other thread ran during any of {attempts} inserts of 64 MB: the copy holds the GIL"


def test_gil_is_released_while_a_sample_copies_its_rows(make_store):
    """A second thread stamping an item's first row while a large sample copies that item
    again and again: the copies carry several stamps."""
    steps, row = 16, 1024  # a 64 KB item
    store = make_store({"x": rp.Field((row,), "float32")}, capacity=1024, block_steps=16)
    t = rp.Table("t", store, sampler=rp.selectors.Uniform(), max_size=10, seed=0)
    t.insert({"x": np.full((1, steps, row), -1.0, np.float32)}, 1.0)
    rows = shared_rows(store, "x")
    stamp_at = int(np.flatnonzero(rows[:, 0] == -1.0)[0])  # the item's first row
    deadline = time.monotonic() + TIMEOUT
    attempts, stamps = 0, 1
    while stamps == 1 and time.monotonic() < deadline:
        attempts += 1
        stop = threading.Event()

        def stamp():
            k = 1.0
            while not stop.is_set():
                rows[stamp_at, 0] = k  # one scalar write: holds the GIL
                k += 1.0

        stamper = threading.Thread(target=stamp)
        stamper.start()
        try:
            s = t.sample(2048)  # 128 MB of copies of the one item
        finally:
            stop.set()
            stamper.join(TIMEOUT)
        x = s.data["x"]
        assert x.shape == (2048, steps, row)
        stamps = len(np.unique(x[:, 0, 0]))
    assert stamps > 1, f"no other thread ran during any of {attempts} samples of 128 MB: the copy holds the GIL"

"""Rate limiters: presets' numbers, blocking and unblocking, timeouts, partial results, pacing."""

import math
import os
import signal
import threading
import time

import numpy as np
import pytest
from conftest import insert_scalars

import reprise as rp

RL = rp.rate_limiters


def limited(store, limiter, name="t", **kwargs):
    kwargs.setdefault("sampler", rp.selectors.Fifo())
    return rp.Table(name, store, rate_limiter=limiter, max_size=1000, **kwargs)


def numbers(limiter):
    return (limiter.samples_per_insert, limiter.min_size_to_sample, limiter.min_diff, limiter.max_diff)


# --- presets ------------------------------------------------------------------------------------


def test_min_size_preset_numbers():
    assert numbers(RL.MinSize(5)) == (1.0, 5, -math.inf, math.inf)
    assert numbers(RL.MinSize()) == (1.0, 1, -math.inf, math.inf)
    assert isinstance(RL.MinSize(5), RL.RateLimiter)


def test_sample_to_insert_ratio_preset_numbers():
    # min_diff/max_diff = spi * min_size -/+ error_buffer
    assert numbers(RL.SampleToInsertRatio(8.0, 1000, 100.0)) == (8.0, 1000, 7900.0, 8100.0)
    assert numbers(RL.SampleToInsertRatio(0.5, 10, 2.0)) == (0.5, 10, 3.0, 7.0)


def test_queue_and_stack_preset_numbers():
    assert numbers(RL.Queue(10)) == (1.0, 1, 0.0, 10.0)
    assert numbers(RL.Stack(3)) == (1.0, 1, 0.0, 3.0)
    assert isinstance(RL.Queue(1), RL.Queue) and isinstance(RL.Stack(1), RL.Stack)


def test_general_rate_limiter_keeps_its_numbers():
    assert numbers(RL.RateLimiter(2.0, 3, -1.0, 5.0)) == (2.0, 3, -1.0, 5.0)
    assert "samples_per_insert=2.0" in repr(RL.RateLimiter(2.0, 3, -1.0, 5.0))


def test_table_info_reports_the_limiter_numbers(scalar_store):
    t = limited(scalar_store, RL.SampleToInsertRatio(4.0, 20, 8.0))
    rl = t.info()["rate_limiter"]
    assert (rl["samples_per_insert"], rl["min_size_to_sample"], rl["min_diff"], rl["max_diff"]) == (4.0, 20, 72.0, 88.0)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: RL.MinSize(0), "min_size_to_sample"),
        (lambda: RL.MinSize(-2), "min_size_to_sample"),
        (lambda: RL.MinSize(1.5), "min_size_to_sample"),
        (lambda: RL.Queue(0), "size"),
        (lambda: RL.Stack(-1), "size"),
        (lambda: RL.SampleToInsertRatio(0.0, 1, 2.0), "samples_per_insert"),
        (lambda: RL.SampleToInsertRatio(8.0, 10, 2.0), "error_buffer"),
        (lambda: RL.SampleToInsertRatio(float("nan"), 10, 2.0), "samples_per_insert"),
    ],
)
def test_bad_preset_numbers_are_rejected_naming_them(make, match):
    with pytest.raises(rp.errors.InvalidArgument, match=match):
        make()


@pytest.mark.parametrize(
    "args, match",
    [((0.0, 1, 0.0, 1.0), "samples_per_insert"), ((1.0, 0, 0.0, 1.0), "min_size_to_sample"), ((1.0, 1, 2.0, 1.0), "min_diff")],
)
def test_bad_general_limiter_numbers_are_rejected_naming_them(scalar_store, args, match):
    with pytest.raises(rp.errors.InvalidArgument, match=match):
        limited(scalar_store, RL.RateLimiter(*args))


# --- blocking -----------------------------------------------------------------------------------


def test_min_size_blocks_sampling_until_the_table_is_filled(scalar_store):
    t = limited(scalar_store, RL.MinSize(3))
    insert_scalars(t, [0, 1])
    with pytest.raises(rp.errors.Timeout, match=r"size 2, min_size_to_sample 3"):
        t.sample(1, timeout=0)
    insert_scalars(t, [2])
    assert t.sample(5, timeout=0).data["x"][:, 0].tolist() == [0] * 5


def test_timeout_zero_fails_at_once(scalar_store):
    t = limited(scalar_store, RL.MinSize(1))
    start = time.monotonic()
    with pytest.raises(rp.errors.Timeout):
        t.sample(1, timeout=0)
    assert time.monotonic() - start < 1.0   # no wait: far below any timeout, and a loaded machine's pauses


def test_a_finite_timeout_waits_about_that_long(scalar_store):
    t = limited(scalar_store, RL.MinSize(1))
    start = time.monotonic()
    with pytest.raises(rp.errors.Timeout, match="0.150 s"):
        t.sample(1, timeout=0.15)
    assert 0.14 <= time.monotonic() - start < 2.0


def test_timeout_none_waits_until_another_thread_inserts(scalar_store):
    t = limited(scalar_store, RL.MinSize(2))
    insert_scalars(t, [0])

    def insert_later():
        time.sleep(0.2)
        insert_scalars(t, [1])

    thread = threading.Thread(target=insert_later)
    start = time.monotonic()
    thread.start()
    s = t.sample(1, timeout=None)
    elapsed = time.monotonic() - start
    thread.join()
    assert elapsed >= 0.15
    assert s.data["x"].tolist() == [[0]]


def test_blocked_insert_resumes_when_a_sample_makes_room(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=2)
    insert_scalars(q, [0, 1])
    got = []

    def sample_later():
        time.sleep(0.2)
        got.append(q.sample(1, timeout=5).data["x"].tolist())

    thread = threading.Thread(target=sample_later)
    thread.start()
    start = time.monotonic()
    keys = q.insert({"x": np.array([[2]])}, 1.0, timeout=5)
    assert time.monotonic() - start >= 0.15
    thread.join()
    assert got == [[[0]]]
    assert [k for k, *_ in q.items()][-1] == keys[0]


def test_timeout_is_a_reprise_error_and_a_timeout_error():
    assert issubclass(rp.errors.Timeout, TimeoutError)
    assert issubclass(rp.errors.Timeout, rp.errors.RepriseError)
    assert issubclass(rp.errors.InvalidArgument, ValueError)
    assert issubclass(rp.errors.NotFound, KeyError)


def test_blocked_sample_can_be_caught_as_timeout_error(scalar_store):
    t = limited(scalar_store, RL.MinSize(1))
    with pytest.raises(TimeoutError):
        t.sample(1, timeout=0)


def test_timeout_partial_holds_the_keys_inserted_before_the_deadline(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=2)
    with pytest.raises(rp.errors.Timeout, match="allowed 2 of 5 inserts") as e:
        q.insert({"x": np.arange(5).reshape(5, 1)}, 1.0, timeout=0.05)
    partial = e.value.partial
    assert isinstance(partial, np.ndarray) and partial.dtype == np.uint64
    assert partial.tolist() == [k for k, *_ in q.items()]
    assert q.sample(2).data["x"][:, 0].tolist() == [0, 1]
    # The rows of the items that were not inserted were given back.
    assert scalar_store.free_blocks == scalar_store.num_blocks - 1  # the bulk cursor's block


def test_timeout_partial_holds_a_sample_of_the_items_drawn_before_the_deadline(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=5)
    keys = insert_scalars(q, [7, 8])
    with pytest.raises(rp.errors.Timeout, match="2 of 4 samples") as e:
        q.sample(4, timeout=0.05)
    partial = e.value.partial
    assert isinstance(partial, rp.Sample)
    assert partial.keys.tolist() == keys.tolist()
    assert partial.data["x"].tolist() == [[7], [8]]
    assert partial.times_sampled.tolist() == [1, 1]
    assert q.size == 0  # the drawn items count as sampled
    assert q.info()["num_samples"] == 2


def test_timeout_partial_sample_respects_fields(make_store):
    store = make_store({"x": rp.Field((), "int64"), "y": rp.Field((), "int8")})
    q = rp.Table.queue("q", store, max_size=5)
    q.insert({"x": np.array([[1]]), "y": np.array([[2]], np.int8)}, 1.0)
    with pytest.raises(rp.errors.Timeout) as e:
        q.sample(2, timeout=0, fields=["y"])
    assert list(e.value.partial.data) == ["y"]


def test_writer_create_item_times_out_with_nothing_inserted(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=1)
    with scalar_store.writer() as w:
        w.append({"x": 1})
        w.create_item(q, num_steps=1, priority=1.0, timeout=0)
        free = scalar_store.free_blocks
        with pytest.raises(rp.errors.Timeout) as e:
            w.create_item(q, num_steps=1, priority=1.0, timeout=0.05)
        assert e.value.partial is None
        assert q.size == 1 and scalar_store.free_blocks == free


def test_timeout_partial_is_none_when_the_call_did_nothing(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=1)
    with pytest.raises(rp.errors.Timeout) as e:
        q.sample(1, timeout=0)
    assert e.value.partial is None
    insert_scalars(q, [0])
    with pytest.raises(rp.errors.Timeout) as e:
        q.insert({"x": np.array([[1]])}, 1.0, timeout=0)
    assert e.value.partial is None


@pytest.fixture
def interrupt_main_thread_in():
    """``interrupt_main_thread_in(seconds)``: a timer that sends this process SIGINT. The test
    installs Python's own SIGINT handler (KeyboardInterrupt) for its duration, whatever the
    suite started with: a background job (``pytest &``) starts with SIGINT ignored. The old
    handler is back at teardown."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timers = []

    def arm(seconds):
        timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
        timers.append(timer)
        timer.start()
        return timer

    try:
        yield arm
    finally:
        for timer in timers:
            timer.cancel()
            timer.join()
        signal.signal(signal.SIGINT, old)


def test_ctrl_c_stops_a_blocked_sample_and_carries_what_was_drawn(scalar_store, interrupt_main_thread_in):
    q = rp.Table.queue("q", scalar_store, max_size=5)
    keys = insert_scalars(q, [1, 2])
    timer = interrupt_main_thread_in(0.2)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as e:
        q.sample(3, timeout=10)
    timer.join()
    assert time.monotonic() - start < 5
    assert isinstance(e.value.partial, rp.Sample)
    assert e.value.partial.keys.tolist() == keys.tolist()


def test_ctrl_c_stops_a_blocked_insert_and_carries_the_inserted_keys(scalar_store, interrupt_main_thread_in):
    q = rp.Table.queue("q", scalar_store, max_size=2)
    insert_scalars(q, [1])
    timer = interrupt_main_thread_in(0.2)
    with pytest.raises(KeyboardInterrupt) as e:
        q.insert({"x": np.array([[2], [3], [4]])}, 1.0, timeout=10)
    timer.join()
    assert e.value.partial.tolist() == [k for k, *_ in q.items()][1:]
    assert q.size == 2


def test_ctrl_c_stops_a_blocked_create_item_and_the_writer_stays_usable(scalar_store, interrupt_main_thread_in):
    q = rp.Table.queue("q", scalar_store, max_size=1)
    insert_scalars(q, [0])
    with scalar_store.writer() as w:
        w.append({"x": 1})
        timer = interrupt_main_thread_in(0.2)
        with pytest.raises(KeyboardInterrupt):
            w.create_item(q, num_steps=1, priority=1.0, timeout=10)
        timer.join()
        assert q.size == 1 and w.episode_steps == 1
        q.sample(1, timeout=0)
        w.create_item(q, num_steps=1, priority=1.0, timeout=0)
    assert q.sample(1, timeout=0).data["x"].tolist() == [[1]]


def test_ctrl_c_partial_is_none_when_the_call_did_nothing(scalar_store, interrupt_main_thread_in):
    t = limited(scalar_store, RL.MinSize(1))
    timer = interrupt_main_thread_in(0.2)
    with pytest.raises(KeyboardInterrupt) as e:
        t.sample(1, timeout=10)
    timer.join()
    assert e.value.partial is None


# --- accounting ---------------------------------------------------------------------------------


def test_blocked_sample_seconds_are_counted_in_info(scalar_store):
    t = limited(scalar_store, RL.MinSize(1))
    with pytest.raises(rp.errors.Timeout):
        t.sample(1, timeout=0.2)
    rl = t.info()["rate_limiter"]
    assert 0.15 <= rl["blocked_sample_seconds"] < 2.0
    assert rl["blocked_insert_seconds"] == 0.0


def test_blocked_insert_seconds_are_counted_in_info(scalar_store):
    q = rp.Table.queue("q", scalar_store, max_size=1)
    insert_scalars(q, [0])
    with pytest.raises(rp.errors.Timeout):
        q.insert({"x": np.array([[1]])}, 1.0, timeout=0.2)
    with scalar_store.writer() as w:
        w.append({"x": 2})
        with pytest.raises(rp.errors.Timeout):
            w.create_item(q, num_steps=1, priority=1.0, timeout=0.1)
    rl = q.info()["rate_limiter"]
    assert 0.25 <= rl["blocked_insert_seconds"] < 3.0
    assert rl["blocked_sample_seconds"] == 0.0


def test_blocked_seconds_accumulate_while_waiting_for_another_thread(scalar_store):
    t = limited(scalar_store, RL.MinSize(1))
    timer = threading.Timer(0.2, lambda: insert_scalars(t, [0]))
    timer.start()
    t.sample(1, timeout=5)
    timer.join()
    assert t.info()["rate_limiter"]["blocked_sample_seconds"] >= 0.15


def test_sample_to_insert_ratio_blocks_whichever_side_runs_ahead(scalar_store):
    # spi=2, min_size=3, buffer=2 -> min_diff 4, max_diff 8; diff = 2 * inserts - samples.
    t = limited(scalar_store, RL.SampleToInsertRatio(2.0, 3, 2.0))
    insert_scalars(t, range(4))  # 3 while filling, then 2 * 4 - 0 = 8 <= max_diff
    with pytest.raises(rp.errors.Timeout, match="0 of 1 inserts"):
        t.insert({"x": np.array([[4]])}, 1.0, timeout=0)  # 10 > 8
    assert len(t.sample(4, timeout=0)) == 4  # 8 - 4 = 4 >= min_diff
    with pytest.raises(rp.errors.Timeout, match="0 of 1 samples"):
        t.sample(1, timeout=0)  # 3 < 4
    insert_scalars(t, [4, 5])  # 12 - 4 = 8
    with pytest.raises(rp.errors.Timeout, match="4 of 5 samples") as e:
        t.sample(5, timeout=0.01)  # 8 - k >= 4 allows 4 of them
    assert len(e.value.partial) == 4
    rl = t.info()["rate_limiter"]
    assert (rl["inserts"], rl["samples"]) == (6, 8)


def test_sample_to_insert_ratio_paces_a_writer_thread_and_a_sampler_thread(scalar_store):
    spi, min_size, buffer = 2.0, 10, 4.0
    min_diff, max_diff = spi * min_size - buffer, spi * min_size + buffer
    t = limited(scalar_store, RL.SampleToInsertRatio(spi, min_size, buffer), sampler=rp.selectors.Uniform(), seed=0)
    inserts, samples = 200, 380  # both can finish: 380 <= 2 * 200 - min_diff - 1
    violations, errors = [], []

    def check():
        rl = t.info()["rate_limiter"]
        diff = rl["inserts"] * spi - rl["samples"]
        if diff > max_diff or (rl["samples"] > 0 and diff < min_diff):
            violations.append((rl["inserts"], rl["samples"]))

    def writer():
        try:
            with scalar_store.writer() as w:
                for i in range(inserts):
                    w.append({"x": i})
                    w.create_item(t, num_steps=1, priority=1.0, timeout=10)
                    check()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def sampler():
        try:
            for _ in range(samples):
                t.sample(1, timeout=10)
                check()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=sampler)]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        check()
        time.sleep(0.001)
    for th in threads:
        th.join()
    assert errors == []
    assert violations == []
    rl = t.info()["rate_limiter"]
    assert (rl["inserts"], rl["samples"]) == (inserts, samples)
    assert t.info()["num_samples"] == samples and t.size == inserts
    # Someone had to wait: the sampler cannot run ahead of 2 samples per insert.
    assert rl["blocked_sample_seconds"] + rl["blocked_insert_seconds"] > 0.0

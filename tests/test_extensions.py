"""Table extensions and ``table.stats()`` (issue 16) against a plain reference model.

The model is written from the documented contract (docs and the issue's spec), not from the
implementation: a histogram is ``{"bounds", "counts", "total"}`` listing the buckets from the
first to the last non-empty one; priorities fall in ``[0, 2^-64)`` then ``[2^e, 2^(e+1))`` for
e in -64..63 (2^64 and above in the last); counts (ages in inserts, times sampled) in ``[0, 1)``,
``[1, 2)``, ``[2, 4)``, ...; ages in seconds in ``[0, 2^-10)`` then ``[2^e, 2^(e+1))``.

A hypothesis state machine drives one table (sampler Uniform or Prioritized, remover Fifo or
Uniform, a small max_size so inserts evict, max_times_sampled 0, 1 or 2 so draws remove items)
through inserts, samples, priority updates, deletes, resets and rejected calls, and after each
step compares every figure of ``stats()`` with the model. Draws are random: the model learns
which keys were drawn from each Sample (and which item a Uniform remover evicted from
``items()``), then checks what follows from them."""

import math
import shutil
import tempfile
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import reprise as rp
from reprise import extensions as ext
from reprise import selectors as S

WINDOW = 5
RATE_SECONDS = 60
ALL_KEYS = {"priority_histogram", "sampled_age", "times_sampled", "unique_samples", "rates"}

# Priorities at and around the bucket edges, and any finite non-negative number.
EDGES = [0.0, 5e-324, 2.0 ** -65, math.nextafter(2.0 ** -64, 0.0), 2.0 ** -64, 1e-10, 0.5,
         math.nextafter(1.0, 0.0), 1.0, 1.5, 2.0, 3.0, 2.0 ** 63, math.nextafter(2.0 ** 64, 0.0),
         2.0 ** 64, 2.0 ** 70, 1e300]
PRIORITIES = st.one_of(st.sampled_from(EDGES), st.floats(0.0, 1e6), st.floats(0.0, 1e-15),
                       st.floats(0.0, 1e308, allow_infinity=False))
BAD_PRIORITIES = st.sampled_from([float("nan"), float("inf"), -1.0, -1e-300])


# --- the reference ------------------------------------------------------------------------------


def priority_bucket(p: float) -> int:
    """Bucket 0 is [0, 2^-64); bucket k + 65 is [2^k, 2^(k+1)) for k in -64..63."""
    if p < 2.0 ** -64:
        return 0
    if p >= 2.0 ** 64:
        return 128
    _, e = math.frexp(p)  # p = m * 2^e, 0.5 <= m < 1: floor(log2 p) = e - 1
    return (e - 1) + 65


def priority_bound(i: int) -> float:
    return 0.0 if i == 0 else 2.0 ** (i - 65)


def count_bucket(n: int) -> int:
    """[0, 1), [1, 2), [2, 4), [4, 8), ...: bucket of n is its bit length."""
    return int(n).bit_length()


def count_bound(i: int) -> float:
    return 0.0 if i == 0 else float(2 ** (i - 1))


def histogram(values, bucket, bound) -> dict:
    """The documented histogram of ``values``: only the span of non-empty buckets."""
    values = list(values)
    if not values:
        return {"bounds": [], "counts": [], "total": 0}
    indices = [bucket(v) for v in values]
    first, last = min(indices), max(indices)
    counts = [0] * (last - first + 1)
    for i in indices:
        counts[i - first] += 1
    return {"bounds": [bound(i) for i in range(first, last + 2)], "counts": counts, "total": len(values)}


class Item:
    def __init__(self, priority, seq, length=1):
        self.priority = priority
        self.seq = seq  # this table's insert number (0 = the first item ever inserted)
        self.length = length
        self.times_sampled = 0


class Model:
    """What ``stats()`` must say, from the operations alone."""

    def __init__(self, max_size, max_times_sampled, fifo_remover):
        self.max_size, self.max_times_sampled, self.fifo_remover = max_size, max_times_sampled, fifo_remover
        self.items = {}  # key -> Item, in insertion order
        self.inserts = 0  # items ever inserted (evicted, deleted and reset ones too)
        self.draws = []  # key of every draw ever, in order
        self.ages = []  # age in inserts of every draw

    def insert(self, keys, priorities, live_after=None, length=1):
        """Applies inserts; a Uniform remover's choice is learnt from ``live_after`` (the keys
        ``items()`` lists after the call)."""
        candidates = dict(self.items)
        for k, p in zip(keys, priorities):
            if self.fifo_remover and len(candidates) >= self.max_size:
                del candidates[next(iter(candidates))]
            candidates[k] = Item(p, self.inserts, length)
            self.inserts += 1
        if not self.fifo_remover:
            assert len(live_after) == min(self.max_size, len(candidates)), "a full table must evict one per insert"
            assert set(live_after) <= set(candidates), "the table holds an item the model never saw"
            candidates = {k: v for k, v in candidates.items() if k in set(live_after)}
        self.items = candidates

    def draw(self, key):
        """One draw of ``key``; returns its times_sampled after the draw."""
        assert key in self.items, f"drew key {key}, which is not in the table"
        item = self.items[key]
        self.ages.append(self.inserts - item.seq - 1)
        self.draws.append(key)
        item.times_sampled += 1
        if self.max_times_sampled and item.times_sampled >= self.max_times_sampled:
            del self.items[key]
        return item.times_sampled

    # -- expected figures --

    def priority_histogram(self):
        return histogram((it.priority for it in self.items.values()), priority_bucket, priority_bound)

    def times_sampled(self):
        return histogram((it.times_sampled for it in self.items.values()), count_bucket, count_bound)

    def ages_in_inserts(self):
        return histogram(self.ages, count_bucket, count_bound)

    def unique_samples(self, window):
        complete = len(self.draws) // window
        last = self.draws[(complete - 1) * window: complete * window] if complete else None
        current = self.draws[complete * window:]
        return {"window": window, "fraction": None if last is None else len(set(last)) / window,
                "windows": complete, "current": len(set(current)), "current_draws": len(current)}


# --- checks of one stats() dict ------------------------------------------------------------------


def check_histogram_shape(h, what):
    """Any documented histogram: ascending bounds, one more than counts, counts sum to total,
    the first and last buckets non-empty."""
    assert set(h) == {"bounds", "counts", "total"}, f"{what}: keys {sorted(h)}"
    assert all(isinstance(c, int) and c >= 0 for c in h["counts"]), f"{what}: counts {h['counts']}"
    assert sum(h["counts"]) == h["total"], f"{what}: counts {h['counts']} do not sum to total {h['total']}"
    if h["total"] == 0:
        assert h["bounds"] == [] and h["counts"] == [], f"{what}: an empty histogram lists buckets: {h}"
        return
    assert len(h["bounds"]) == len(h["counts"]) + 1, f"{what}: {h}"
    assert all(isinstance(b, float) for b in h["bounds"]), f"{what}: bounds must be floats: {h['bounds']}"
    assert all(a < b for a, b in zip(h["bounds"], h["bounds"][1:])), f"{what}: bounds not ascending: {h['bounds']}"
    assert h["counts"][0] > 0 and h["counts"][-1] > 0, f"{what}: empty buckets at an end: {h}"


# CLOCK_MONOTONIC_COARSE's resolution (Linux: 1 / CONFIG_HZ, 1-10 ms); Python has no constant for it.
COARSE_TICK = 0.011

def check_seconds_histogram(h, count, elapsed):
    check_histogram_shape(h, "sampled_age.seconds")
    assert h["total"] == count
    if count:
        bounds = h["bounds"]
        if bounds[0] == 0.0:
            assert bounds[1] == 2.0 ** -10, f"sampled_age.seconds: the first bucket is [0, 2^-10): {bounds}"
        else:
            assert bounds[0] >= 2.0 ** -10 and math.log2(bounds[0]).is_integer(), bounds
        for a, b in zip(bounds[1:], bounds[2:]):
            assert b == 2 * a, f"sampled_age.seconds: buckets must double: {bounds}"
        # The extension clock is the kernel's coarse monotonic clock (one tick, a few ms
        # at most): an age may read one tick more than the time that really passed.
        assert bounds[-2] <= elapsed + COARSE_TICK, f"a draw older ({bounds[-2]} s or more) than the test ({elapsed} s)"


def check_rates(r, seconds, inserts, samples, exact):
    """``exact``: every insert and sample happened within the last ``seconds`` seconds."""
    assert set(r) == {"seconds", "inserts", "samples", "insert_rate", "sample_rate"}, sorted(r)
    assert r["seconds"] == seconds
    for key, total in (("inserts", inserts), ("samples", samples)):
        per_second = r[key]
        assert len(per_second) == seconds, f"rates.{key} has {len(per_second)} entries, expected {seconds}"
        assert all(isinstance(c, int) and c >= 0 for c in per_second), per_second
        if exact:
            assert sum(per_second) == total, f"rates.{key} sums to {sum(per_second)}, expected {total}: {per_second}"
        else:
            assert sum(per_second) <= total
        rate = r[key[:-1] + "_rate"]
        assert isinstance(rate, float) and rate >= 0
        if seconds >= 11:
            check_rate(rate, per_second, key)


def check_rate(rate, per_second, key):
    """items/s over the last 10 complete seconds (the 10 before the current one); a table
    younger than that averages over the k < 10 complete seconds it has lived, and in its
    first second gives the current second's count over the time it has lived (0.1 s at least)."""
    averages = [sum(per_second[-1 - k:-1]) / k for k in range(1, 11)]
    if any(math.isclose(rate, a, rel_tol=1e-9, abs_tol=1e-12) for a in averages):
        return
    now = per_second[-1]
    assert not any(per_second[:-1]) and now <= rate <= 10 * now, \
        f"rates.{key[:-1]}_rate {rate} is no average of the last 1 to 10 complete seconds {per_second[-11:]}"


def check_sampled_age(got, model, elapsed):
    assert set(got) == {"count", "inserts", "seconds", "mean_inserts", "mean_seconds"}, sorted(got)
    n = len(model.ages)
    assert got["count"] == n, f"sampled_age.count {got['count']}, expected {n}"
    assert got["inserts"] == model.ages_in_inserts(), \
        f"sampled_age.inserts {got['inserts']}, expected {model.ages_in_inserts()} (ages {model.ages})"
    check_seconds_histogram(got["seconds"], n, elapsed)
    if n == 0:
        assert got["mean_inserts"] is None and got["mean_seconds"] is None, got
    else:
        assert math.isclose(got["mean_inserts"], sum(model.ages) / n, rel_tol=1e-9), (got["mean_inserts"], model.ages)
        assert 0.0 <= got["mean_seconds"] <= elapsed + COARSE_TICK, got["mean_seconds"]


# --- the state machine ---------------------------------------------------------------------------


def one_step(values):
    """Items of one step each (field ``x``), ``values`` as their data."""
    return {"x": np.asarray(values, dtype=np.int64).reshape(-1, 1)}


class StatsMachine(RuleBasedStateMachine):
    @initialize(sampler=st.sampled_from(["Uniform", "Prioritized"]), fifo_remover=st.booleans(),
                max_size=st.sampled_from([2, 3, 6]), max_times_sampled=st.sampled_from([0, 1, 2]),
                seed=st.integers(0, 2 ** 32))
    def make_table(self, sampler, fifo_remover, max_size, max_times_sampled, seed):
        self.store = rp.Store({"x": rp.Field((), "int64")}, capacity=1 << 13, block_steps=4)
        self.table = rp.Table(
            "t", self.store, sampler=S.Prioritized(1.0) if sampler == "Prioritized" else S.Uniform(),
            remover=S.Fifo() if fifo_remover else S.Uniform(), max_size=max_size,
            max_times_sampled=max_times_sampled, seed=seed,
            extensions=[ext.PriorityHistogram(), ext.SampledAge(), ext.TimesSampled(),
                        ext.UniqueSamples(window=WINDOW), ext.Rates(seconds=RATE_SECONDS)])
        self.model = Model(max_size, max_times_sampled, fifo_remover)
        self.writer = self.store.writer()
        self.started = time.monotonic()
        self.seen = []  # every key ever handed out

    def teardown(self):
        if getattr(self, "writer", None) is not None:
            self.writer.close()
        if getattr(self, "store", None) is not None:
            self.store.close()

    @rule(data=st.data(), n=st.integers(1, 4))
    def insert(self, data, n):
        priorities = data.draw(st.lists(PRIORITIES, min_size=n, max_size=n), label="priorities")
        keys = self.table.insert(one_step(range(n)), priorities).tolist()
        self.seen.extend(keys)
        self.model.insert(keys, priorities, live_after=[k for k, *_ in self.table.items()])

    @rule(priority=PRIORITIES, steps=st.integers(1, 3))
    def write_item(self, priority, steps):
        """An item made by a writer (over the last ``steps`` steps of its episode) is an insert too."""
        for _ in range(steps):
            self.writer.append({"x": 7})
        key = self.writer.create_item(self.table, num_steps=steps, priority=priority)
        self.seen.append(key)
        self.model.insert([key], [priority], live_after=[k for k, *_ in self.table.items()], length=steps)

    @rule(n=st.integers(1, 4), bad=BAD_PRIORITIES)
    def insert_with_a_bad_priority(self, n, bad):
        with pytest.raises(rp.errors.InvalidArgument):
            self.table.insert(one_step(range(n)), [1.0] * (n - 1) + [bad])

    @rule(n=st.integers(1, 6))
    def sample(self, n):
        if not self.model.items:
            with pytest.raises(rp.errors.Timeout) as e:
                self.table.sample(n, timeout=0)
            assert e.value.partial is None or len(e.value.partial) == 0
            return
        try:
            s = self.table.sample(n, timeout=0)
            assert len(s) == n
        except rp.errors.Timeout as e:  # items left after their last draw: the partial draws count
            assert self.model.max_times_sampled, "a sample stopped early in a table items never leave"
            s = e.partial
        for key, times in zip(s.keys.tolist(), s.times_sampled.tolist()):
            assert self.model.draw(key) == times, f"key {key}: times_sampled {times}"

    @rule(data=st.data())
    def update_priorities(self, data):
        pool = list(self.model.items) + self.seen[-5:]
        if not pool:
            return
        keys = data.draw(st.lists(st.sampled_from(pool), max_size=5), label="keys")
        priorities = data.draw(st.lists(PRIORITIES, min_size=len(keys), max_size=len(keys)), label="priorities")
        self.table.update_priorities(np.array(keys, dtype=np.uint64), priorities)
        for k, p in zip(keys, priorities):  # in order: a key given twice ends with its last priority
            if k in self.model.items:
                self.model.items[k].priority = p

    @rule(data=st.data(), bad=BAD_PRIORITIES)
    def update_priorities_with_a_bad_value(self, data, bad):
        if not self.model.items:
            return
        keys = data.draw(st.lists(st.sampled_from(list(self.model.items)), min_size=1, max_size=3), label="keys")
        with pytest.raises(rp.errors.InvalidArgument):
            self.table.update_priorities(np.array(keys, dtype=np.uint64), [2.0] * (len(keys) - 1) + [bad])

    @rule(data=st.data())
    def delete(self, data):
        pool = list(self.model.items) + self.seen[-5:]
        if not pool:
            return
        keys = data.draw(st.lists(st.sampled_from(pool), max_size=4), label="keys")
        self.table.delete(np.array(keys, dtype=np.uint64))
        for k in keys:
            self.model.items.pop(k, None)

    @rule()
    def checkpoint_round_trip(self):
        """The table is saved and loaded, and the loaded one carries on: its stats are the
        saved table's, and every later step is checked on it."""
        before = self.table.stats()
        directory = tempfile.mkdtemp(prefix="reprise-test-extensions-")
        try:
            loaded = rp.checkpoint.load(rp.checkpoint.save(directory, self.table, progress=False), progress=False)["t"]
        finally:
            shutil.rmtree(directory)
        after = loaded.stats()
        self.writer.close()
        self.store.close()
        self.store, self.table, self.writer = loaded.store, loaded, loaded.store.writer()
        age, age_after = before["sampled_age"], after["sampled_age"]
        assert age_after["mean_seconds"] == age["mean_seconds"], \
            f"a checkpoint round trip changed sampled_age.mean_seconds: {age['mean_seconds']!r} -> " \
            f"{age_after['mean_seconds']!r} (a float of the saved state read back inexactly?)"
        assert without_rates(after) == without_rates(before)
        for key in ("inserts", "samples"):
            assert sum(after["rates"][key]) == sum(before["rates"][key]), (before["rates"], after["rates"])

    @rule()
    def reset(self):
        """Removes the items: the histograms over items now in the table empty, the draws
        and inserts seen so far stay counted (sampled_age is cumulative since the table was made)."""
        self.table.reset()
        self.model.items.clear()

    @invariant()
    def stats_match_the_model(self):
        m = self.model
        got = self.table.stats()
        elapsed = time.monotonic() - self.started
        assert set(got) == ALL_KEYS, sorted(got)
        assert self.table.items() == [(k, it.priority, it.times_sampled, it.length) for k, it in m.items.items()]
        check_histogram_shape(got["priority_histogram"], "priority_histogram")
        assert got["priority_histogram"] == m.priority_histogram(), \
            f"priority_histogram {got['priority_histogram']}, expected {m.priority_histogram()} " \
            f"(priorities {[it.priority for it in m.items.values()]})"
        check_histogram_shape(got["times_sampled"], "times_sampled")
        assert got["times_sampled"] == m.times_sampled(), \
            f"times_sampled {got['times_sampled']}, expected {m.times_sampled()} " \
            f"(times {[it.times_sampled for it in m.items.values()]})"
        check_sampled_age(got["sampled_age"], m, elapsed)
        assert got["unique_samples"] == m.unique_samples(WINDOW), \
            f"unique_samples {got['unique_samples']}, expected {m.unique_samples(WINDOW)} (draws {m.draws})"
        check_rates(got["rates"], RATE_SECONDS, m.inserts, len(m.draws), exact=elapsed < RATE_SECONDS - 1)


StatsMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
test_stats_match_the_reference_model = StatsMachine.TestCase


# --- the reference itself ------------------------------------------------------------------------


def test_the_reference_buckets_follow_the_contract():
    assert [priority_bucket(p) for p in (0.0, 5e-324, math.nextafter(2.0 ** -64, 0.0))] == [0, 0, 0]
    assert priority_bucket(2.0 ** -64) == 1 and priority_bound(1) == 2.0 ** -64
    assert priority_bucket(1.0) == 65 and priority_bound(65) == 1.0 and priority_bound(66) == 2.0
    assert priority_bucket(math.nextafter(1.0, 0.0)) == 64
    assert priority_bucket(2.0 ** 63) == priority_bucket(2.0 ** 64) == priority_bucket(1e300) == 128
    assert priority_bound(129) == 2.0 ** 64
    assert [count_bucket(n) for n in range(9)] == [0, 1, 2, 2, 3, 3, 3, 3, 4]
    assert [count_bound(i) for i in range(5)] == [0, 1, 2, 4, 8]
    assert histogram([3, 3, 0], count_bucket, count_bound) == {"bounds": [0, 1, 2, 4], "counts": [1, 0, 2], "total": 3}
    assert histogram([1.5], priority_bucket, priority_bound) == {"bounds": [1.0, 2.0], "counts": [1], "total": 1}


# --- fixed cases ---------------------------------------------------------------------------------


@pytest.fixture
def store(make_store):
    return make_store({"x": rp.Field((), "int64")}, capacity=4096, block_steps=4)


def test_every_builtin_is_on_by_default(store):
    t = rp.Table("t", store)
    s = t.stats()
    assert set(s) == ALL_KEYS
    assert s["unique_samples"] == {"window": 10_000, "fraction": None, "windows": 0, "current": 0, "current_draws": 0}
    assert s["rates"]["seconds"] == 60 and s["rates"]["inserts"] == [0] * 60
    assert s["priority_histogram"] == {"bounds": [], "counts": [], "total": 0}
    assert s["times_sampled"] == {"bounds": [], "counts": [], "total": 0}
    assert s["sampled_age"]["count"] == 0 and s["sampled_age"]["mean_inserts"] is None


def test_no_extensions_no_stats(store):
    t = rp.Table("t", store, extensions=[])
    t.insert(one_step(range(5)), 1.0)
    t.sample(3)
    assert t.stats() == {}


def test_only_the_attached_extensions_report(store):
    t = rp.Table("t", store, extensions=[ext.TimesSampled(), ext.UniqueSamples(window=2)])
    keys = t.insert(one_step(range(2)), [1.0, 3.0]).tolist()
    t.delete(keys[:1])
    t.sample(3)
    s = t.stats()
    assert set(s) == {"times_sampled", "unique_samples"}
    assert s["times_sampled"] == {"bounds": [2.0, 4.0], "counts": [1], "total": 1}
    assert s["unique_samples"] == {"window": 2, "fraction": 0.5, "windows": 1, "current": 1, "current_draws": 1}


def test_ages_and_histograms_of_a_known_sequence(store):
    """Fifo sampler: the draws are known, so every figure is."""
    t = rp.Table("t", store, sampler=S.Fifo(), remover=S.Fifo(), max_size=4,
                 extensions=[ext.PriorityHistogram(), ext.SampledAge(), ext.TimesSampled(), ext.UniqueSamples(window=3)])
    keys = t.insert(one_step(range(6)), [0.0, 0.75, 1.0, 3.0, 2.0 ** 70, 0.5]).tolist()  # the first two evicted
    s = t.sample(5)  # Fifo: the oldest live item (keys[2], 3 inserts after it) each time
    assert s.keys.tolist() == [keys[2]] * 5
    st_ = t.stats()
    # priorities 1.0, 3.0, 2^70, 0.5: buckets [0.5, 1), [1, 2), [2, 4), ... [2^63, 2^64)
    ph = st_["priority_histogram"]
    assert ph["bounds"] == [2.0 ** e for e in range(-1, 65)] and ph["total"] == 4
    assert ph["counts"][:3] == [1, 1, 1] and ph["counts"][-1] == 1 and sum(ph["counts"]) == 4
    assert st_["sampled_age"]["count"] == 5
    assert st_["sampled_age"]["inserts"] == {"bounds": [2.0, 4.0], "counts": [5], "total": 5}
    assert st_["sampled_age"]["mean_inserts"] == 3.0
    assert st_["times_sampled"] == {"bounds": [0.0, 1.0, 2.0, 4.0, 8.0], "counts": [3, 0, 0, 1], "total": 4}
    assert st_["unique_samples"] == {"window": 3, "fraction": 1 / 3, "windows": 1, "current": 1, "current_draws": 2}


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("make, argument, shown", [
    (lambda: ext.UniqueSamples(window=0), "window", "0"),
    (lambda: ext.UniqueSamples(window=-3), "window", "-3"),
    (lambda: ext.UniqueSamples(window=2.5), "window", "2.5"),
    (lambda: ext.UniqueSamples(window="10"), "window", "10"),
    (lambda: ext.Rates(seconds=0), "seconds", "0"),
    (lambda: ext.Rates(seconds=-1), "seconds", "-1"),
])
def test_bad_extension_settings_are_refused_when_made(make, argument, shown):
    with pytest.raises(rp.errors.InvalidArgument) as e:
        make()
    msg = str(e.value)
    assert argument in msg and shown in msg, f"the message should name {argument!r} and the value {shown}: {msg!r}"
    assert any(w in msg for w in ("expect", "must", ">=", "at least", "positive")), \
        f"the message should say what was expected: {msg!r}"


@pytest.mark.parametrize("extensions, shown", [
    ([object()], "object"),
    ([ext.Rates(), "rates"], "rates"),
    ([ext.Rates], "Rates"),  # the class, not an instance
    ([ext.Rates(), ext.Rates(seconds=5)], "twice"),
    ("rates", "rates"),
    (ext.Rates(), "Rates"),
])
def test_a_table_refuses_what_is_not_a_list_of_extensions(store, extensions, shown):
    with pytest.raises(rp.errors.InvalidArgument) as e:
        rp.Table("t", store, extensions=extensions)
    msg = str(e.value)
    assert "extension" in msg and shown in msg, f"the message should name the extensions and {shown!r}: {msg!r}"
    t = rp.Table("t", store, extensions=[])  # the refused table left nothing behind
    assert t.stats() == {}


# --- checkpoints ---------------------------------------------------------------------------------


def without_rates(stats):
    return {k: v for k, v in stats.items() if k != "rates"}


def without_clock(stats):
    """Figures that do not depend on when things happened: no rates, and of the ages in
    seconds only how many there were (a restored item's age counts from its saved age at
    load time, so draws after a load see it younger by the time the save and load took)."""
    out = without_rates(stats)
    age = dict(out["sampled_age"])
    age["seconds"] = age["seconds"]["total"]
    del age["mean_seconds"]
    out["sampled_age"] = age
    return out


def test_stats_survive_a_checkpoint_and_continue_the_same(store, tmp_path):
    t = rp.Table("t", store, sampler=S.Prioritized(0.7), remover=S.Uniform(), max_size=20, max_times_sampled=3,
                 seed=11, extensions=[ext.PriorityHistogram(), ext.SampledAge(), ext.TimesSampled(),
                                      ext.UniqueSamples(window=7), ext.Rates(seconds=30)])
    u = rp.Table("u", store, seed=5, extensions=[ext.UniqueSamples(window=4)])
    v = rp.Table("v", store, extensions=[])
    rng = np.random.default_rng(0)
    for _ in range(5):
        keys = t.insert(one_step(range(9)), rng.exponential(size=9) * np.array([0, 1e-30, 1, 1, 1, 1, 1, 1e30, 1]))
        t.sample(6)
        t.update_priorities(keys[:3], [0.25, 4.0, 0.0])
        t.delete(keys[3:4])
    u.insert(one_step(range(3)), 1.0)
    u.sample(6)
    v.insert(one_step(range(3)), 1.0)
    before = {x.name: x.stats() for x in (t, u, v)}
    loaded = rp.checkpoint.load(rp.checkpoint.save(tmp_path, [t, u, v]))
    try:
        t2, u2, v2 = loaded["t"], loaded["u"], loaded["v"]
        assert without_rates(t2.stats()) == without_rates(before["t"])
        r1, r2 = before["t"]["rates"], t2.stats()["rates"]
        assert r2["seconds"] == 30 and sum(r2["inserts"]) == sum(r1["inserts"]) == 45
        assert sum(r2["samples"]) == sum(r1["samples"])
        assert u2.stats() == before["u"] and v2.stats() == {}
        for _ in range(4):  # the same draws follow, and the same figures
            a, b = t.sample(5, timeout=10), t2.sample(5, timeout=10)
            assert a.keys.tolist() == b.keys.tolist()
            assert t.insert(one_step([1, 2]), [1.0, 2.0]).tolist() == t2.insert(one_step([1, 2]), [1.0, 2.0]).tolist()
            u.sample(1), u2.sample(1)
            assert without_clock(t2.stats()) == without_clock(t.stats())
            assert u2.stats() == u.stats()
    finally:
        for s in {id(x.store): x.store for x in loaded.values()}.values():
            s.close()


# --- served tables -------------------------------------------------------------------------------


def settled(read_a, read_b, tries=5):
    """``(a, b)`` read back to back until a second read of ``a`` agrees with the first (the
    per-second rates move when a second ends between two reads)."""
    for _ in range(tries):
        a, b, again = read_a(), read_b(), read_a()
        if a == again:
            return a, b
    return a, b


def test_client_stats_equal_the_tables_stats(store):
    t = rp.Table("replay", store, sampler=S.Prioritized(1.0), max_size=50, seed=3)
    q = rp.Table("few", store, extensions=[ext.PriorityHistogram(), ext.UniqueSamples(window=3)])
    server = rp.Server([t, q], address="127.0.0.1:0")
    try:
        t.insert(one_step(range(10)), np.arange(10) + 0.5)
        for address in (server.local_address, server.address):
            with rp.Client(address) as c:
                with c.writer("replay") as w:
                    for i in range(4):
                        w.append({"x": i})
                        w.create_item("replay", 1, 2.0 ** i)
                        w.create_item("few", 1, 0.0)
                    w.flush()
                s = c.sample("replay", 7)
                c.update_priorities("replay", s.keys[:2], [0.0, 1e9])
                c.sample("few", 4)
                tables, got = settled(lambda: {x.name: x.stats() for x in (t, q)}, c.stats)
                # Rates are read at each call's own time (the first second's rate moves with it).
                got, tables = ({k: without_rates(v) for k, v in d.items()} for d in (got, tables))
                assert got == tables, f"{address}: client.stats() {got} != table.stats() {tables}"
                assert set(got["few"]) == {"priority_histogram", "unique_samples"}
        assert t.stats()["sampled_age"]["count"] == 14  # served draws count like local ones
        assert q.stats()["unique_samples"]["windows"] == 2 and q.stats()["unique_samples"]["current_draws"] == 2
    finally:
        server.stop()
